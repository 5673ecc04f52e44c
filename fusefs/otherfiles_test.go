package fusefs

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
	"github.com/kvtierfs/kvtierfs/tiers/disk"
)

// TestOtherFilesBoundedThroughTheMount: the engine's uid writes files
// outside the block layout through the mount without end; the store's
// table of them grew by one per file. Past the bound the write itself
// fails with EDQUOT (what the writer sees), the files already there are
// still written, stats.json names the bound and raises other_files_full,
// and a removed file's place is taken again.
func TestOtherFilesBoundedThroughTheMount(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipped: mounting FUSE in this process needs root")
	}
	const bound = 2
	store, err := disk.Open(disk.Config{Dir: t.TempDir(), Capacity: 1 << 30, MaxOtherFiles: bound})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	mnt := t.TempDir()
	f, err := Mount(mnt, Options{Store: store})
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
	page := make([]byte, 4096)
	for _, name := range []string{"a", "b"} {
		if err := os.WriteFile(filepath.Join(mnt, name), page, 0o600); err != nil {
			t.Fatalf("writing %s, within the bound: %v", name, err)
		}
	}
	if err := os.WriteFile(filepath.Join(mnt, "c"), page, 0o600); !errors.Is(err, syscall.EDQUOT) {
		t.Fatalf("writing a third file with a bound of %d: %v, want EDQUOT", bound, err)
	}
	a, err := os.OpenFile(filepath.Join(mnt, "a"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Write(page); err != nil {
		t.Errorf("appending to a tracked file with the table full: %v", err)
	}
	a.Close()

	st := f.Stats()
	if st.Disk.OtherFiles != bound || st.Disk.OtherFilesMax != bound || st.Counters.OtherFilesRefused != 1 {
		t.Errorf("stats: %d other files of at most %d, %d refused; want %d of %d, 1",
			st.Disk.OtherFiles, st.Disk.OtherFilesMax, st.Counters.OtherFilesRefused, bound, bound)
	}
	if !slices.ContainsFunc(st.Warnings, func(w ctlabi.Warning) bool { return w.Code == ctlabi.WarnOtherFilesFull }) {
		t.Errorf("no %s warning in %+v", ctlabi.WarnOtherFilesFull, st.Warnings)
	}

	if err := os.Remove(filepath.Join(mnt, "a")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "c"), page, 0o600); err != nil {
		t.Errorf("writing c in the place of the removed a: %v", err)
	}
}
