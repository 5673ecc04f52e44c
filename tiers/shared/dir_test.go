package shared

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestReadFileRefusesOversizedFile: whoever writes the shared directory can
// put a sparse file where the lease or a sidecar record is read (`truncate -s
// 1T DIR/.kvtierfs/evict.lease` made every replica allocate 1 TiB and die
// with "runtime: out of memory", again at each restart). A file larger than
// any lease or record is refused without reading it.
func TestReadFileRefusesOversizedFile(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, controlDir), 0o700); err != nil {
		t.Fatal(err)
	}
	// 64 MiB: far beyond a lease, small enough not to hurt when read.
	f, err := os.Create(filepath.Join(root, leaseFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(64 << 20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	got, err := OSDir{root}.ReadFile(leaseFile)
	if err == nil {
		t.Fatalf("a %d-byte sparse lease was read whole (%d bytes): a 1 TiB one ends the daemon", 64<<20, len(got))
	}
	if !errors.Is(err, syscall.EFBIG) {
		t.Fatalf("oversized lease: %v, want EFBIG", err)
	}
}

// TestReadsDoNotWaitOnFIFO: a FIFO at the lease's name (`mkfifo
// DIR/.kvtierfs/evict.lease`) held each worker that read it in open(2) until
// a writer came: within 45 s all 8 were stuck and every cold lookup waited
// the whole --shared-timeout, while the level still counted as reachable.
// The same for a journal log swapped for a FIFO after its directory was
// listed. Each read must fail at once instead (not a regular file).
func TestReadsDoNotWaitOnFIFO(t *testing.T) {
	reads := map[string]func(d OSDir, rel string) error{
		"ReadFile": func(d OSDir, rel string) error { _, err := d.ReadFile(rel); return err },
		"ReadFrom": func(d OSDir, rel string) error { _, _, err := d.ReadFrom(rel, 0, 1<<20); return err },
	}
	for name, read := range reads {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			if err := os.MkdirAll(filepath.Join(root, controlDir), 0o700); err != nil {
				t.Fatal(err)
			}
			fifo := filepath.Join(root, leaseFile)
			if err := syscall.Mkfifo(fifo, 0o600); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- read(OSDir{root}, leaseFile) }()
			select {
			case err := <-done:
				if !errors.Is(err, syscall.EINVAL) {
					t.Fatalf("FIFO: %v, want EINVAL", err)
				}
			case <-time.After(30 * time.Second):
				// Let the stuck open go before failing.
				if w, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
					w.Close()
				}
				<-done
				t.Fatal("reading a FIFO waited in open(2) for a writer")
			}
		})
	}
}

// TestWritesDoNotFollowLinkedDirectories: whoever writes the shared
// directory can replace a tier directory (or .kvtierfs) by a link; the root
// daemon then created the layout's directories and wrote a block (and its
// lease, through a linked .kvtierfs) wherever the link led. Every call must
// resolve its path beneath the root without links, so the target stays
// untouched.
func TestWritesDoNotFollowLinkedDirectories(t *testing.T) {
	root, outside := t.TempDir(), t.TempDir()
	const tier = "m_0123456789ab_r0"
	if err := os.Symlink(outside, filepath.Join(root, tier)); err != nil {
		t.Fatal(err)
	}
	d := OSDir{root}
	dir := tier + "/abc/de_g0"
	mkdirErr := d.MkdirAll(dir)
	writeErr := d.WriteFile(dir+"/abcde.bin", []byte("forged"))
	entries, err := os.ReadDir(outside)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) > 0 || mkdirErr == nil || writeErr == nil {
		t.Fatalf("through a linked tier directory: MkdirAll %v, WriteFile %v, the link's target now holds %d entries", mkdirErr, writeErr, len(entries))
	}
}
