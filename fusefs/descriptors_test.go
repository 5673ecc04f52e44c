package fusefs

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvtierfs/kvtierfs/internal/descriptors"
	"github.com/kvtierfs/kvtierfs/tiers/disk"
)

// TestEveryOpenGivesItsOpenBack: each kind of open through the mount that
// holds the daemon's descriptors (another file opened and created, a block
// tmp created, a block loaded, a directory listed) gives its admission back
// once released. Four of a kind made by one thread while descriptors are
// plenty would leave that thread a holder once they run short, refused with
// ENFILE, had any of them kept its admission; the test thread's next open is
// admitted instead, once the kernel's asynchronous RELEASEs arrived.
func TestEveryOpenGivesItsOpenBack(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipped: mounting FUSE in this process needs root")
	}
	store, err := disk.Open(disk.Config{Dir: t.TempDir(), Capacity: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	const limit = 1 << 20
	kept, _ := descriptors.Levels(limit)
	var free atomic.Int64
	free.Store(limit)
	reserve := descriptors.New(func() (int, int, error) { return limit - int(free.Load()), limit, nil }, nil)
	mnt := t.TempDir()
	f, err := Mount(mnt, Options{Store: store, Descriptors: reserve})
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
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()

	const hash = "0123456789abcdef0123456789abcdef"
	dir := filepath.Join(mnt, "model_0123456789ab_r0", hash[:3], hash[3:5]+"_g0")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(mnt, "config.json")
	if err := os.WriteFile(other, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	row := make([]byte, 64<<10)
	kinds := []struct {
		name string
		open func(i int) error
	}{
		{"another file opened", func(int) error { _, err := os.ReadFile(other); return err }},
		{"another file created", func(i int) error {
			return os.WriteFile(filepath.Join(mnt, "created-"+strconv.Itoa(i)), nil, 0o644)
		}},
		{"a block stored", func(i int) error {
			block := filepath.Join(dir, hash[:31]+strconv.Itoa(i)+".bin")
			if err := os.WriteFile(block+"_1.tmp", row, 0o644); err != nil {
				return err
			}
			return os.Rename(block+"_1.tmp", block)
		}},
		{"a block loaded", func(i int) error {
			_, err := os.ReadFile(filepath.Join(dir, hash[:31]+strconv.Itoa(i)+".bin"))
			return err
		}},
		{"a directory listed", func(int) error { _, err := os.ReadDir(dir); return err }},
	}
	for _, kind := range kinds {
		free.Store(limit)
		for i := range 4 {
			if err := kind.open(i); err != nil {
				t.Fatalf("%s (%d): %v", kind.name, i, err)
			}
		}
		free.Store(int64(kept - 1))
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			err := kinds[0].open(0)
			if err == nil {
				break
			}
			if !errors.Is(err, syscall.ENFILE) || time.Now().After(deadline) {
				t.Fatalf("after four of %s, an open of the same thread with descriptors short: %v, want it admitted", kind.name, err)
			}
		}
	}
}
