package shm

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// setOver returns a Set over the *.mmap files of dir, closed when the test ends.
func setOver(t *testing.T, dir string, opts Options) *Set {
	t.Helper()
	set, err := NewSetWith(filepath.Join(dir, "*.mmap"), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(set.Close)
	return set
}

// writeRegion writes a region file of n rows, row r holding block first+r.
func writeRegion(t *testing.T, path string, n, first int) []byte {
	t.Helper()
	data := make([]byte, n*testRow)
	for r := 0; r < n; r++ {
		fill(data[r*testRow:(r+1)*testRow], first+r)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return data
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create files owned by another uid")
	}
}

// A symbolic link matching the glob (to a root-only file) is not followed:
// not mapped, listed and counted as ignored, and a writable open refuses it,
// so nothing is ever written through it.
func TestSymlinkUnderGlobIgnored(t *testing.T) {
	dir, private := t.TempDir(), t.TempDir()
	target := filepath.Join(private, "secret")
	secret := bytes.Repeat([]byte("root only "), testRow/10+1)[:testRow]
	if err := os.WriteFile(target, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "vllm_offload_evil.mmap")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	set := setOver(t, dir, Options{})
	if err := set.Refresh(); err != nil {
		t.Fatal(err)
	}
	if infos := set.Infos([]int64{testRow}); len(infos) != 0 {
		t.Fatalf("symlink mapped as a region: %+v", infos)
	}
	if set.Fits(testRow) {
		t.Fatal("a region of the link target's geometry is in use")
	}
	ig := set.Ignored()
	if len(ig) != 1 || ig[0].Path != link || !strings.Contains(ig[0].Reason, "symbolic link") || set.IgnoredTotal() != 1 {
		t.Fatalf("ignored %+v (total %d), want the link once", ig, set.IgnoredTotal())
	}
	// A second refresh does not count it again.
	if err := set.Refresh(); err != nil || set.IgnoredTotal() != 1 {
		t.Fatalf("second refresh: %v, total %d", err, set.IgnoredTotal())
	}
	_, _, _, err := OpenFile(link, os.O_RDWR, set.Owners()...)
	var refused *RefusedError
	if !errors.As(err, &refused) {
		t.Fatalf("OpenFile of a link for writing: %v, want a RefusedError", err)
	}
	if got, _ := os.ReadFile(target); !bytes.Equal(got, secret) {
		t.Fatal("link target changed")
	}
}

// A file owned by another user is ignored unless that user is the engine's.
func TestForeignOwnerIgnored(t *testing.T) {
	requireRoot(t)
	const engine, stranger = 64123, 64124
	dir := t.TempDir()
	mine := filepath.Join(dir, "vllm_offload_engine.mmap")
	theirs := filepath.Join(dir, "vllm_offload_other.mmap")
	writeRegion(t, mine, 2, 0)
	writeRegion(t, theirs, 3, 10)
	if err := os.Chown(mine, engine, engine); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(theirs, stranger, stranger); err != nil {
		t.Fatal(err)
	}
	uid := uint32(engine)
	set := setOver(t, dir, Options{EngineUID: &uid})
	if err := set.Refresh(); err != nil {
		t.Fatal(err)
	}
	infos := set.Infos([]int64{testRow})
	if len(infos) != 1 || infos[0].Path != mine {
		t.Fatalf("regions %+v, want only the engine's", infos)
	}
	ig := set.Ignored()
	if len(ig) != 1 || ig[0].Path != theirs || !strings.Contains(ig[0].Reason, fmt.Sprint(stranger)) || set.IgnoredTotal() != 1 {
		t.Fatalf("ignored %+v (total %d), want the stranger's file", ig, set.IgnoredTotal())
	}
	// By default (no engine uid) only root's and the daemon's own files are mapped.
	def := setOver(t, dir, Options{})
	if err := def.Refresh(); err != nil {
		t.Fatal(err)
	}
	if infos := def.Infos(nil); len(infos) != 0 || def.IgnoredTotal() != 2 {
		t.Fatalf("default owners mapped %+v, ignored %d; want none mapped, 2 ignored", infos, def.IgnoredTotal())
	}
}

// A FIFO planted under the glob neither blocks Refresh nor is mapped.
func TestFifoUnderGlobIgnored(t *testing.T) {
	dir := t.TempDir()
	if err := syscall.Mkfifo(filepath.Join(dir, "vllm_offload_fifo.mmap"), 0o600); err != nil {
		t.Fatal(err)
	}
	set := setOver(t, dir, Options{})
	if err := set.Refresh(); err != nil {
		t.Fatal(err)
	}
	if ig := set.Ignored(); len(ig) != 1 || ig[0].Reason != "not a regular file" {
		t.Fatalf("ignored %+v", ig)
	}
}

// A region truncated by another user while mapped does not crash the daemon:
// the search reports no row, the region is dropped, and one fault is counted.
func TestTruncatedRegionFaultsSafely(t *testing.T) {
	set, data, path := regionFile(t, 8)
	d := block.DigestOf(data[5*testRow : 6*testRow])
	if ref, ok := set.Confirm(d, nil); !ok || ref.Row != 5 {
		t.Fatalf("before truncation: %+v %v", ref, ok)
	}
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	if ref, ok := set.Confirm(d, nil); ok {
		t.Fatalf("truncated region confirmed row %+v", ref)
	}
	if got := set.Faults(); got != 1 {
		t.Fatalf("Faults = %d, want 1", got)
	}
	if c := set.Candidates(d); len(c) != 0 || set.Fits(testRow) {
		t.Fatalf("faulted region still searched: candidates %+v, fits %v", c, set.Fits(testRow))
	}
	if err := set.Refresh(); err != nil {
		t.Fatal(err)
	}
	if infos := set.Infos([]int64{testRow}); len(infos) != 1 || infos[0].Size != 0 {
		t.Fatalf("after refresh: %+v, want the empty file's region", infos)
	}
	// The engine grows it again: mapped anew and searched.
	writeRegion(t, path, 8, 0)
	if err := set.Refresh(); err != nil {
		t.Fatal(err)
	}
	if ref, ok := set.Confirm(d, nil); !ok || ref.Row != 5 {
		t.Fatalf("after regrowth: %+v %v", ref, ok)
	}
}

// A region truncated under a row being checksummed chunk by chunk in
// parallel (rows of four chunks, four cores) faults in a worker: the search
// reports no row, the region is dropped, one fault is counted, and the
// daemon does not crash.
func TestTruncatedRegionFaultsSafelyInParallelScan(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	const rowBytes = 4 * testRow
	set, data, path := regionFile(t, 8)
	pages := map[int64][]byte{0: data[rowBytes : rowBytes+block.PageSize]}
	if row, ok := set.ScanWritten(rowBytes, pages); !ok || row.Sum.CRC() != block.CRC32C(data[rowBytes:2*rowBytes]) {
		t.Fatalf("before truncation: found %v, crc %08x", ok, row.Sum.CRC())
	}
	// The page compared stays mapped; the row's other chunks do not.
	if err := os.Truncate(path, rowBytes+testRow); err != nil {
		t.Fatal(err)
	}
	if _, ok := set.ScanWritten(rowBytes, pages); ok {
		t.Fatal("a row cut short under its scan was found")
	}
	if got := set.Faults(); got != 1 {
		t.Fatalf("Faults = %d, want 1", got)
	}
}

// mapsInode reports whether this process maps a file with inode ino.
func mapsInode(t *testing.T, ino uint64) bool {
	t.Helper()
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(maps), "\n") {
		f := strings.Fields(line)
		if len(f) >= 5 && f[4] == fmt.Sprint(ino) {
			return true
		}
	}
	return false
}

// A region recreated under the same name and size (an engine restart within
// one refresh tick) is a new region: its rows are found, the old file's are
// not, and the old mapping is gone.
func TestRecreatedRegionRemapped(t *testing.T) {
	set, data, path := regionFile(t, 4)
	oldDigest := block.DigestOf(data[2*testRow : 3*testRow])
	old, ok := set.Confirm(oldDigest, nil)
	if !ok {
		t.Fatal("old row not found")
	}
	if !mapsInode(t, old.File.Ino) {
		t.Fatal("old region not mapped (the test cannot see mappings)")
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	fresh := writeRegion(t, path, 4, 100)
	if err := set.Refresh(); err != nil {
		t.Fatal(err)
	}
	newDigest := block.DigestOf(fresh[2*testRow : 3*testRow])
	ref, ok := set.Confirm(newDigest, nil)
	if !ok || ref.Row != 2 || ref.File == old.File {
		t.Fatalf("recreated region: %+v %v (old file %+v)", ref, ok, old.File)
	}
	if _, ok := set.Confirm(oldDigest, nil); ok {
		t.Fatal("the old region's bytes are still found")
	}
	if mapsInode(t, old.File.Ino) {
		t.Fatal("the old region is still mapped")
	}
}

// Searches running while regions are recreated never read an unmapped region.
func TestRefreshWhileSearching(t *testing.T) {
	set, data, path := regionFile(t, 4)
	d := block.DigestOf(data[:testRow])
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
					set.Confirm(d, nil)
				}
			}
		}()
	}
	for range 30 {
		os.Remove(path)
		writeRegion(t, path, 4, 0)
		if err := set.Refresh(); err != nil {
			t.Error(err)
		}
	}
	close(stop)
	wg.Wait()
	if _, ok := set.Confirm(d, nil); !ok {
		t.Fatal("row not found after the last recreation")
	}
}

// Guard turns a fault on a shrunk mapping into ErrFault whatever address the
// fault reports, and lets any other panic (a bug, a nil dereference while the
// file still covers the mapping) through.
func TestGuard(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, make([]byte, 2*os.Getpagesize()), 0o600); err != nil {
		t.Fatal(err)
	}
	f, _, size, err := OpenFile(path, os.O_RDONLY)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mem, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(mem)
	var sum byte
	var nilDigest *block.Digest
	mustPanic := func(name string, fn func()) {
		t.Helper()
		defer func() {
			if recover() == nil {
				t.Errorf("%s: Guard swallowed a panic that is not a fault", name)
			}
		}()
		Guard(f, size, fn)
	}
	if err := Guard(f, size, func() { sum += mem[len(mem)-1] }); err != nil {
		t.Fatalf("read of a whole mapping: %v", err)
	}
	mustPanic("nil dereference on an intact file", func() { sum += byte(nilDigest.Size) })
	mustPanic("panic on an intact file", func() { panic("bug") })
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	if err := Guard(f, size, func() { sum += mem[len(mem)-1] }); !errors.Is(err, ErrFault) {
		t.Fatalf("read past a truncated file: %v, want ErrFault", err)
	}
	// qemu-user reports the fault of a truncated mapping at address 0, which
	// the runtime raises as a nil dereference: still the file's fault.
	if err := Guard(f, size, func() { sum += byte(nilDigest.Size) }); !errors.Is(err, ErrFault) {
		t.Fatalf("fault at address 0 on a truncated file: %v, want ErrFault", err)
	}
	mustPanic("panic that is no runtime error on a truncated file", func() { panic("bug") })
}

// FileOf names the file mapped for a path, and changes when it is recreated.
func TestFileOf(t *testing.T) {
	set, _, path := regionFile(t, 2)
	before, ok := set.FileOf(path)
	if !ok {
		t.Fatal("mapped region has no identity")
	}
	os.Remove(path)
	writeRegion(t, path, 2, 0)
	if err := set.Refresh(); err != nil {
		t.Fatal(err)
	}
	after, ok := set.FileOf(path)
	if !ok || after == before {
		t.Fatalf("identity after recreation %+v %v, before %+v", after, ok, before)
	}
	if _, ok := set.FileOf(path + ".other"); ok {
		t.Fatal("identity of an unmapped path")
	}
}

// TestRefreshOfQuietDirectorySeesEveryChange: once the glob's directory has
// been quiet for a second, a Refresh examines only its mapped regions; a
// region created, resized or recreated after that is still seen by the
// next Refresh, and ignored files stay listed, bounded, and counted.
func TestRefreshOfQuietDirectorySeesEveryChange(t *testing.T) {
	dir := t.TempDir()
	a := filepath.Join(dir, "a.mmap")
	writeRegion(t, a, 2, 0)
	for i := range MaxIgnoredListed + 10 {
		if err := os.Symlink(a, filepath.Join(dir, fmt.Sprintf("link-%03d.mmap", i))); err != nil {
			t.Fatal(err)
		}
	}
	set := setOver(t, dir, Options{})
	// Each Refresh starts as after a fast scan: the spacing of slow scans
	// (TestSlowFullScansAreSpaced) would otherwise delay the next full scan
	// wherever one scan of this directory takes over slowScan (an emulator,
	// a loaded machine), and this test is about the directory's stamp.
	refresh := func() {
		t.Helper()
		set.scanCost = 0
		if err := set.Refresh(); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(1100 * time.Millisecond)
	for range 2 { // the second one finds the directory unchanged
		refresh()
	}
	if len(set.Infos([]int64{testRow})) != 1 || len(set.Ignored()) != MaxIgnoredListed || set.IgnoredNow() != MaxIgnoredListed+10 {
		t.Fatalf("regions %+v, %d ignored listed of %d", set.Infos([]int64{testRow}), len(set.Ignored()), set.IgnoredNow())
	}
	b := filepath.Join(dir, "b.mmap")
	writeRegion(t, b, 3, 10)
	refresh()
	if infos := set.Infos([]int64{testRow}); len(infos) != 2 {
		t.Fatalf("a region created in a quiet directory: regions %+v", infos)
	}
	time.Sleep(1100 * time.Millisecond)
	refresh()
	if err := os.Truncate(a, 4*testRow); err != nil {
		t.Fatal(err)
	}
	refresh()
	for _, info := range set.Infos([]int64{testRow}) {
		if info.Path == a && info.Size != 4*testRow {
			t.Fatalf("a region resized in a quiet directory is still %d bytes", info.Size)
		}
	}
}

// TestSlowFullScansAreSpaced: after a full scan that took a second, a new
// name under the glob waits scanCostFactor seconds for the next full scan,
// while a mapped region that changed is seen at once.
func TestSlowFullScansAreSpaced(t *testing.T) {
	dir := t.TempDir()
	a := filepath.Join(dir, "a.mmap")
	writeRegion(t, a, 2, 0)
	set := setOver(t, dir, Options{})
	if err := set.Refresh(); err != nil {
		t.Fatal(err)
	}
	set.scanCost = time.Second // as a scan of a flooded directory on a slow machine
	writeRegion(t, filepath.Join(dir, "b.mmap"), 3, 10)
	if err := set.Refresh(); err != nil {
		t.Fatal(err)
	}
	if infos := set.Infos([]int64{testRow}); len(infos) != 1 {
		t.Fatalf("a full scan ran right after a slow one: regions %+v", infos)
	}
	if err := os.Truncate(a, 4*testRow); err != nil {
		t.Fatal(err)
	}
	if err := set.Refresh(); err != nil {
		t.Fatal(err)
	}
	if infos := set.Infos([]int64{testRow}); len(infos) != 2 {
		t.Fatalf("a mapped region resized: regions %+v, want a and b", infos)
	}
	set.scanCost = time.Second
	writeRegion(t, filepath.Join(dir, "c.mmap"), 1, 20)
	set.lastScan = time.Now().Add(-scanCostFactor * time.Second)
	if err := set.Refresh(); err != nil {
		t.Fatal(err)
	}
	if infos := set.Infos([]int64{testRow}); len(infos) != 3 {
		t.Fatalf("the next full scan is due: regions %+v", infos)
	}
}
