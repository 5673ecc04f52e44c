package mount_test

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvtierfs/kvtierfs/fusefs"
	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

// Block times behave like a plain file's (DESIGN "Block times"): utimensat
// sticks, a load moves the access time (relatime's rule), stat shows it.

// statOf stats path, following links as stat(2) does.
func statOf(t *testing.T, path string) *syscall.Stat_t {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return &st
}

func atimeOf(st *syscall.Stat_t) time.Time { return time.Unix(st.Atim.Unix()) }
func mtimeOf(st *syscall.Stat_t) time.Time { return time.Unix(st.Mtim.Unix()) }

// TestBlockTimesStick: times set with utimensat stay after the kernel's
// cached entry expired and the block was looked up again, and are the store
// file's; a load moves the access time, and stat after it shows the move.
func TestBlockTimesStick(t *testing.T) {
	region := newRegion(t, 2)
	d := mounttest.Start(t, mounttest.Options{ShmGlob: region.Path})
	tier := openTier(t, d)
	set := storeBlock(t, tier, region.Row(0), 1)
	loaded := storeBlock(t, tier, region.Row(0), 2)

	atime := time.Date(2021, 3, 4, 5, 6, 7, 8000, time.UTC)
	mtime := time.Date(2020, 3, 4, 5, 6, 7, 9000, time.UTC)
	if err := os.Chtimes(set, atime, mtime); err != nil {
		t.Fatalf("utimensat on a block: %v", err)
	}
	check := func(when string) {
		t.Helper()
		st := statOf(t, set)
		if !atimeOf(st).Equal(atime) || !mtimeOf(st).Equal(mtime) {
			t.Fatalf("%s: atime %v, mtime %v; set %v, %v", when, atimeOf(st), mtimeOf(st), atime, mtime)
		}
	}
	check("right after utime")
	// Outlive the kernel's cached entry and attributes, so the next stat
	// looks the block up again through the daemon.
	time.Sleep(fusefs.DefaultEntryTimeout + 500*time.Millisecond)
	if !tier.Exists(set) {
		t.Fatal("block gone")
	}
	check("after the cached entry expired")
	onStore := statOf(t, filepath.Join(d.Store, strings.TrimPrefix(set, d.Mountpoint)))
	if !atimeOf(onStore).Equal(atime) || !mtimeOf(onStore).Equal(mtime) {
		t.Fatalf("the store file has atime %v, mtime %v; set through the mount %v, %v", atimeOf(onStore), mtimeOf(onStore), atime, mtime)
	}
	if err := os.Chmod(set, 0o644); err == nil {
		t.Fatal("chmod of a block succeeded: a block's mode is the store's")
	}

	before := statOf(t, loaded)
	if err := tier.LoadIgnoringClose(loaded, region.Row(1)); err != nil || !bytes.Equal(region.Row(1), expectedRow(2)) {
		t.Fatalf("load: %v", err)
	}
	after := statOf(t, loaded)
	if !atimeOf(after).After(atimeOf(before)) || !atimeOf(after).After(mtimeOf(after)) {
		t.Fatalf("a load left atime at %v (before the load %v, mtime %v)", atimeOf(after), atimeOf(before), mtimeOf(after))
	}
	if !mtimeOf(after).Equal(mtimeOf(before)) {
		t.Fatalf("a load moved mtime from %v to %v", mtimeOf(before), mtimeOf(after))
	}
}

// TestEvictorByAtimeEvictsIdleBlocks replays an fs evictor that orders
// blocks by atime (vLLM's unmerged varun/fs-eviction-v2: scandir the tree,
// stat each block, unlink the least recently accessed): of eight blocks
// stored in order, the four stored first are loaded again, so the four
// stored last are the idle ones and go first.
func TestEvictorByAtimeEvictsIdleBlocks(t *testing.T) {
	region := newRegion(t, 2)
	d := mounttest.Start(t, mounttest.Options{ShmGlob: region.Path})
	tier := openTier(t, d)
	paths := make([]string, 8)
	for i := range paths {
		paths[i] = storeBlock(t, tier, region.Row(0), i)
	}
	for i := range 4 {
		if err := tier.LoadIgnoringClose(paths[i], region.Row(1)); err != nil || !bytes.Equal(region.Row(1), expectedRow(i)) {
			t.Fatalf("load of block %d: %v", i, err)
		}
	}

	type found struct {
		path  string
		atime time.Time
	}
	var blocks []found
	var scan func(dir string)
	scan = func(dir string) {
		entries, err := os.ReadDir(dir) // getdents, as os.scandir
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			p := filepath.Join(dir, e.Name())
			switch {
			case e.IsDir():
				scan(p)
			case e.Type()&fs.ModeType == 0 && strings.HasSuffix(e.Name(), ".bin"):
				blocks = append(blocks, found{p, atimeOf(statOf(t, p))})
			}
		}
	}
	scan(filepath.Join(d.Mountpoint, tierDir))
	if len(blocks) != len(paths) {
		t.Fatalf("the scan found %d blocks, want %d", len(blocks), len(paths))
	}
	sort.SliceStable(blocks, func(i, j int) bool { return blocks[i].atime.Before(blocks[j].atime) })
	for _, b := range blocks[:4] {
		if err := os.Remove(b.path); err != nil {
			t.Fatal(err)
		}
	}
	for i, p := range paths {
		if present := tier.Exists(p); present != (i < 4) {
			t.Errorf("block %d (loaded: %v) present after eviction: %v", i, i < 4, present)
		}
	}
	for i := range 4 {
		if err := tier.LoadIgnoringClose(paths[i], region.Row(1)); err != nil || !bytes.Equal(region.Row(1), expectedRow(i)) {
			t.Fatalf("load of kept block %d: %v", i, err)
		}
	}
}
