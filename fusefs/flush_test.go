package fusefs

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/kvtierfs/kvtierfs/tiers/disk"
)

// requestLog keeps the FUSE requests a mount with Debug logs.
type requestLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *requestLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *requestLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *requestLog) WithGroup(string) slog.Handler            { return l }
func (l *requestLog) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, r.Message)
	return nil
}

// flushes counts the FLUSH requests received so far.
func (l *requestLog) flushes() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range l.lines {
		if strings.Contains(line, ": FLUSH ") && strings.HasPrefix(line, "rx ") {
			n++
		}
	}
	return n
}

// TestTmpCloseSendsNoFlush: the engine's close of a tmp it wrote costs no
// FLUSH round trip (the tmp is opened FOPEN_NOFLUSH), while the close of a
// block it loaded still does (a failed load's error is repeated there).
func TestTmpCloseSendsNoFlush(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipped: mounting FUSE in this process needs root")
	}
	store, err := disk.Open(disk.Config{Dir: t.TempDir(), Capacity: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	requests := &requestLog{}
	mnt := t.TempDir()
	f, err := Mount(mnt, Options{Store: store, Debug: true, Logger: slog.New(requests)})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.ProbePoll(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.Unmount(); err != nil {
			t.Errorf("unmount: %v", err)
		}
	})
	const hash = "0123456789abcdef0123456789abcdef"
	blockPath := filepath.Join(mnt, "model_0123456789ab_r0", hash[:3], hash[3:5]+"_g0", hash+".bin")
	if err := os.MkdirAll(filepath.Dir(blockPath), 0o755); err != nil {
		t.Fatal(err)
	}
	row := make([]byte, 64<<10)
	for i := range row {
		row[i] = byte(i*7 + 1)
	}
	before := requests.flushes()
	tmp := blockPath + "_1.tmp"
	fd, err := syscall.Open(tmp, syscall.O_CREAT|syscall.O_EXCL|syscall.O_WRONLY|syscall.O_CLOEXEC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := syscall.Write(fd, row); err != nil || n != len(row) {
		t.Fatalf("write: %d, %v", n, err)
	}
	if err := syscall.Close(fd); err != nil {
		t.Fatal(err)
	}
	if n := requests.flushes() - before; n != 0 {
		t.Errorf("closing the tmp sent %d FLUSH requests, want none", n)
	}
	if err := os.Rename(tmp, blockPath); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(blockPath)
	if err != nil || string(got) != string(row) {
		t.Fatalf("loading the stored block: %d bytes, %v", len(got), err)
	}
	if requests.flushes()-before == 0 {
		t.Error("closing a loaded block sent no FLUSH: the request log sees none, so the tmp's count proves nothing")
	}
}
