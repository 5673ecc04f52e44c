package mount_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/kvtierfs/kvtierfs/integration/engineio"
	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

// TestEngineReplay drives the mount with the engine's exact I/O from 16
// threads: stores from rows of a real /dev/shm region, lookups of present and
// absent keys, loads into other rows, then compares every byte.
func TestEngineReplay(t *testing.T) {
	const blocks, threads = 96, 16
	region := newRegion(t, 2*blocks)
	d := mounttest.Start(t, mounttest.Options{ShmGlob: region.Path})
	tier := openTier(t, d)

	parallel(t, threads, blocks, func(i int) error {
		fillRow(region.Row(i), i)
		stored, err := tier.Store(tier.BlockPath(tierDir, i%2, hashOf(i)), region.Row(i))
		if err == nil && !stored {
			err = errors.New("store skipped a block that was never stored")
		}
		return err
	})
	for i := 0; i < blocks; i++ {
		if !tier.Exists(tier.BlockPath(tierDir, i%2, hashOf(i))) {
			t.Fatalf("block %d: lookup says absent after store", i)
		}
		if tier.Exists(tier.BlockPath(tierDir, i%2, hashOf(blocks+i))) {
			t.Fatalf("block %d: lookup of a never-stored key says present", blocks+i)
		}
	}
	parallel(t, threads, blocks, func(i int) error {
		return tier.Load(tier.BlockPath(tierDir, i%2, hashOf(i)), region.Row(blocks+i))
	})
	for i := 0; i < blocks; i++ {
		if !bytes.Equal(region.Row(blocks+i), expectedRow(i)) {
			t.Fatalf("block %d: loaded row differs from the stored one", i)
		}
	}
	st := d.Stats()
	if st.Disk.Blocks != blocks || st.Counters.Writes != blocks || st.Counters.Reads != blocks {
		t.Fatalf("stats: blocks %d writes %d reads %d, want %d each", st.Disk.Blocks, st.Counters.Writes, st.Counters.Reads, blocks)
	}
	if st.Disk.LogicalBytes != blocks*rowBytes || st.Counters.ReadBytes != blocks*rowBytes {
		t.Fatalf("stats: logical %d read %d bytes, want %d", st.Disk.LogicalBytes, st.Counters.ReadBytes, blocks*rowBytes)
	}
	if st.Groups["0"].Blocks != blocks/2 || st.Groups["1"].Blocks != blocks/2 {
		t.Fatalf("stats: groups %+v, want %d blocks in each of groups 0 and 1", st.Groups, blocks/2)
	}
	if st.Counters.LookupHits < blocks {
		t.Fatalf("stats: %d lookup hits, want at least %d", st.Counters.LookupHits, blocks)
	}
	if c := st.Counters; c.LoadsFromStore+c.LoadsFromStaging+c.LoadsFromRow != blocks || c.LoadsRefused != 0 {
		t.Fatalf("stats: loads %d from the store, %d staged, %d from a row, %d refused; want %d in all, none refused",
			c.LoadsFromStore, c.LoadsFromStaging, c.LoadsFromRow, c.LoadsRefused, blocks)
	}
	if len(st.Primary.Regions) != 1 || st.Primary.Regions[0].Rows != 2*blocks || st.Primary.Regions[0].RowBytes != rowBytes {
		t.Fatalf("stats: primary regions %+v, want one of %d rows of %d bytes", st.Primary.Regions, 2*blocks, rowBytes)
	}
	// The store directory is itself a valid tier root: the engine pointed
	// straight at it finds and loads every block.
	direct := &engineio.Tier{Root: d.Store}
	row := make([]byte, rowBytes)
	for i := 0; i < blocks; i++ {
		if err := direct.Load(direct.BlockPath(tierDir, i%2, hashOf(i)), row); err != nil || !bytes.Equal(row, expectedRow(i)) {
			t.Fatalf("block %d straight from the store directory: err %v, equal %v", i, err, bytes.Equal(row, expectedRow(i)))
		}
	}
	tmps, _ := filepath.Glob(filepath.Join(d.Store, tierDir, "*", "*", "*.tmp"))
	if len(tmps) != 0 {
		t.Fatalf("tmp files left in the store: %v", tmps)
	}
}

// TestRestoreOverExisting checks that a rename over an existing block replaces
// it whole: the engine stores again after deleting a failed block.
func TestRestoreOverExisting(t *testing.T) {
	d := mounttest.Start(t, mounttest.Options{})
	tier := openTier(t, d)
	region := newRegion(t, 2)
	path := storeBlock(t, tier, region.Row(0), 1)
	fillRow(region.Row(0), 2)
	tmp := path + "_7.tmp"
	fd, err := syscall.Open(tmp, syscall.O_CREAT|syscall.O_EXCL|syscall.O_WRONLY|syscall.O_DIRECT, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := syscall.Write(fd, region.Row(0)); err != nil || n != rowBytes {
		t.Fatalf("write: %d %v", n, err)
	}
	syscall.Close(fd)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	if err := tier.Load(path, region.Row(1)); err != nil || !bytes.Equal(region.Row(1), expectedRow(2)) {
		t.Fatalf("after rename over: err %v, new content %v", err, bytes.Equal(region.Row(1), expectedRow(2)))
	}
	if st := d.Stats(); st.Disk.Blocks != 1 || st.Disk.LogicalBytes != rowBytes {
		t.Fatalf("after rename over: %d blocks, %d bytes; want 1 block of %d", st.Disk.Blocks, st.Disk.LogicalBytes, rowBytes)
	}
}

// TestXattrs checks that the engine's user.* xattrs work on blocks while the
// store's checksum xattr stays hidden and protected.
func TestXattrs(t *testing.T) {
	d := mounttest.Start(t, mounttest.Options{})
	tier := openTier(t, d)
	region := newRegion(t, 1)
	path := storeBlock(t, tier, region.Row(0), 3)
	if err := syscall.Setxattr(path, "user.vllm.kv_crc32", []byte("1234"), 0); err != nil {
		t.Fatalf("setxattr user.vllm.kv_crc32: %v", err)
	}
	buf := make([]byte, 64)
	n, err := syscall.Getxattr(path, "user.vllm.kv_crc32", buf)
	if err != nil || string(buf[:n]) != "1234" {
		t.Fatalf("getxattr: %q %v", buf[:n], err)
	}
	n, err = syscall.Listxattr(path, buf)
	if err != nil {
		t.Fatal(err)
	}
	if names := string(buf[:n]); !strings.Contains(names, "user.vllm.kv_crc32") || strings.Contains(names, "kvtierfs") {
		t.Fatalf("listxattr: %q, want the engine's xattr and not the store's", names)
	}
	if err := syscall.Setxattr(path, "user.kvtierfs.crc32c", []byte("x"), 0); err != syscall.EPERM {
		t.Fatalf("setting the store's checksum xattr: %v, want EPERM", err)
	}
	if err := tier.Load(path, region.Row(0)); err != nil {
		t.Fatalf("load after xattr changes: %v", err)
	}
}

// parallel runs fn(i) for i in [0,n) on the given number of goroutines.
func parallel(t *testing.T, threads, n int, fn func(i int) error) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	next := make(chan int)
	for range threads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := fn(i); err != nil {
					errs <- err
				}
			}
		}()
	}
	for i := 0; i < n; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TestSparseRows stores multi-node rows whose second half (the other node's
// slot) is zero: the store keeps only the data pages, reports logical vs
// physical bytes, and loads return the zeros, through the mount and straight
// from the store directory.
func TestSparseRows(t *testing.T) {
	const blocks = 8
	region := newRegion(t, 2)
	d := mounttest.Start(t, mounttest.Options{ShmGlob: region.Path})
	tier := openTier(t, d)
	want := make([][]byte, blocks)
	for i := 0; i < blocks; i++ {
		row := region.Row(0)
		fillRow(row[:rowBytes/2], i)
		clear(row[rowBytes/2:])
		want[i] = bytes.Clone(row)
		if _, err := tier.Store(tier.BlockPath(tierDir, 0, hashOf(i)), row); err != nil {
			t.Fatal(err)
		}
	}
	st := d.Stats()
	if st.Disk.LogicalBytes != blocks*rowBytes || st.Disk.PhysicalBytes > st.Disk.LogicalBytes*3/4 {
		t.Fatalf("half-zero rows: %d logical, %d physical bytes; want %d logical and about half of it physical",
			st.Disk.LogicalBytes, st.Disk.PhysicalBytes, blocks*rowBytes)
	}
	direct := &engineio.Tier{Root: d.Store}
	for i := 0; i < blocks; i++ {
		copy(region.Row(1), bytes.Repeat([]byte{0xEE}, rowBytes))
		if err := tier.Load(tier.BlockPath(tierDir, 0, hashOf(i)), region.Row(1)); err != nil || !bytes.Equal(region.Row(1), want[i]) {
			t.Fatalf("sparse block %d through the mount: err %v, equal %v", i, err, bytes.Equal(region.Row(1), want[i]))
		}
		copy(region.Row(1), bytes.Repeat([]byte{0xEE}, rowBytes))
		if err := direct.Load(direct.BlockPath(tierDir, 0, hashOf(i)), region.Row(1)); err != nil || !bytes.Equal(region.Row(1), want[i]) {
			t.Fatalf("sparse block %d from the store directory: err %v", i, err)
		}
	}
}
