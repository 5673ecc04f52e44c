package mount_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/integration/engineio"
	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

// Every READ reply carries only proven bytes (DESIGN "Loads: proven before
// the read returns"): reads that stop before the block's end, reads out of
// order and a private mapping of a block damaged on the store's disk fail with
// EIO (SIGBUS for the mapping) and the block is dropped; the same reads of an
// intact block return its bytes.

// partialRowSizes are rows of 2 MiB, DeepSeek-V4-Flash's 8,601,600 B and 32 MiB.
var partialRowSizes = []int{2 << 20, 8601600, 32 << 20}

// alignedRow is a page-aligned buffer of n bytes, unmapped at cleanup.
func alignedRow(t *testing.T, n int) []byte {
	t.Helper()
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	return b
}

// readPattern is one way a tool reads part of a block; it returns the bytes
// read, which must be want's at the same place, or the error.
type readPattern struct {
	name string
	// damageAt is where the damaged copy of the block is changed: inside
	// what the pattern reads first.
	damageAt func(size int) int64
	read     func(t *testing.T, path string, size int, want []byte) error
}

// preadAt reads n bytes at off of path with flags and checks them.
func preadAt(path string, flags int, buf []byte, off int64, want []byte) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|flags, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	n, err := unix.Pread(fd, buf, off)
	if err != nil {
		return err
	}
	if n != len(buf) || !bytes.Equal(buf[:n], want[off:off+int64(n)]) {
		return fmt.Errorf("pread of %d bytes at %d returned %d bytes, not the block's", len(buf), off, n)
	}
	return nil
}

// middle is a page-aligned range in the block's second half that stops a
// page before its end, so reading it proves nothing by reaching the end.
func middle(size int) (off int64, n int) {
	off = int64(size/2) &^ int64(engineio.PageSize-1)
	return off, min(1<<20, size-int(off)-engineio.PageSize)
}

var readPatterns = []readPattern{
	{"the first MiB buffered", func(int) int64 { return 12345 },
		func(t *testing.T, path string, size int, want []byte) error {
			return preadAt(path, 0, make([]byte, 1<<20), 0, want)
		}},
	{"the first MiB O_DIRECT", func(int) int64 { return 1<<20 - 7 },
		func(t *testing.T, path string, size int, want []byte) error {
			return preadAt(path, unix.O_DIRECT, alignedRow(t, 1<<20), 0, want)
		}},
	{"the middle, then the first MiB", func(size int) int64 { off, _ := middle(size); return off + 4096 },
		func(t *testing.T, path string, size int, want []byte) error {
			off, n := middle(size)
			if err := preadAt(path, unix.O_DIRECT, alignedRow(t, n), off, want); err != nil {
				return err
			}
			return preadAt(path, unix.O_DIRECT, alignedRow(t, 1<<20), 0, want)
		}},
	{"a private mapping", func(int) int64 { return 100 },
		func(t *testing.T, path string, size int, want []byte) (err error) {
			fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			m, err := unix.Mmap(fd, 0, size, unix.PROT_READ, unix.MAP_PRIVATE)
			if err != nil {
				return err
			}
			defer unix.Munmap(m)
			defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
			defer func() {
				if r := recover(); r != nil {
					err = fmt.Errorf("fault reading the mapping (SIGBUS): %v: %w", r, syscall.EIO)
				}
			}()
			for _, off := range []int{0, size / 2, size - 1} {
				if m[off] != want[off] {
					return fmt.Errorf("mapping holds %#x at %d, the block %#x", m[off], off, want[off])
				}
			}
			return nil
		}},
}

func TestPartialReadsCarryOnlyProvenBytes(t *testing.T) {
	for _, store := range []string{"disk", "tmpfs"} {
		for _, size := range partialRowSizes {
			t.Run(fmt.Sprintf("%s_%d", store, size), func(t *testing.T) { partialReads(t, store, size) })
		}
	}
}

// partialReads runs every read pattern on an intact and a damaged block of
// size bytes, in a store on the disk (read O_DIRECT, a chunk per request) or
// on tmpfs (mapped under a read lease, checked once and kept, disk.Mapped).
func partialReads(t *testing.T, store string, size int) {
	opts := mounttest.Options{}
	if store == "tmpfs" {
		dir, err := os.MkdirTemp("/dev/shm", "kvtier-partial-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		opts.Store = dir
	}
	d := mounttest.Start(t, opts)
	tier := openTier(t, d)
	row := alignedRow(t, size)
	for i, p := range readPatterns {
		intact := tier.BlockPath(tierDir, 0, hashOf(2*i))
		damaged := tier.BlockPath(tierDir, 0, hashOf(2*i+1))
		engineio.FillPattern(row, uint64(2*i))
		want := bytes.Clone(row)
		if _, err := tier.Store(intact, row); err != nil {
			t.Fatal(err)
		}
		for range 2 { // on tmpfs the second load finds the block mapped
			if err := p.read(t, intact, size, want); err != nil {
				t.Fatalf("%s of an intact block: %v", p.name, err)
			}
		}
		engineio.FillPattern(row, uint64(2*i+1))
		want = bytes.Clone(row)
		if _, err := tier.Store(damaged, row); err != nil {
			t.Fatal(err)
		}
		onStore := filepath.Join(d.Store, strings.TrimPrefix(damaged, d.Mountpoint))
		flipByte(t, onStore, p.damageAt(size))
		before := d.Stats().Counters.BlocksChangedOutside
		if err := p.read(t, damaged, size, want); !errors.Is(err, syscall.EIO) {
			t.Fatalf("%s of a damaged block: %v, want EIO", p.name, err)
		}
		if _, err := os.Stat(onStore); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s: the damaged block is still in the store (%v)", p.name, err)
		}
		if got := d.Stats().Counters.BlocksChangedOutside; got != before+1 {
			t.Errorf("%s: blocks changed outside %d, want %d (written in the store tree)", p.name, got, before+1)
		}
	}
	if c := d.Stats().Counters; (c.LoadsInPlace > 0) != (store == "tmpfs") || (c.LoadsRemapped > 0) != (store == "tmpfs") {
		t.Errorf("%d loads served in place, %d of them remapped, from a store on %s; want some only on tmpfs", c.LoadsInPlace, c.LoadsRemapped, store)
	}
}
