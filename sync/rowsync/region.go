package rowsync

import (
	"fmt"
	"os"
	"sync"
	"syscall"

	"github.com/kvtierfs/kvtierfs/tiers/shm"
	"golang.org/x/sys/unix"
)

// MaxRowBytes is the largest row this package handles (and the largest row a
// RowWrite frame may describe).
const MaxRowBytes = 256 << 20

// Region is the engine's shared offload region as this node maps it: rows of
// RowBytes bytes back to back, row r at r*RowBytes, no header (vLLM's
// SharedOffloadRegion). The engine writes rows concurrently, so a Region never
// remembers row contents: every answer comes from the mapping as it is now.
type Region struct {
	mem      []byte
	rowBytes int
	rows     int

	closeOnce sync.Once
	unmap     func() error // non-nil when the Region owns the mapping
}

// NewRegion wraps an existing mapping. The caller keeps ownership of mem;
// len(mem) must be a non-zero multiple of rowBytes.
func NewRegion(mem []byte, rowBytes int) (*Region, error) {
	if rowBytes <= 0 || rowBytes > MaxRowBytes {
		return nil, fmt.Errorf("rowsync: row size %d bytes, want 1..%d", rowBytes, MaxRowBytes)
	}
	if len(mem) == 0 || len(mem)%rowBytes != 0 {
		return nil, fmt.Errorf("rowsync: region of %d bytes is not a whole number of %d-byte rows", len(mem), rowBytes)
	}
	return &Region{mem: mem, rowBytes: rowBytes, rows: len(mem) / rowBytes}, nil
}

// OpenRegion maps the region file at path (e.g.
// /dev/shm/vllm_offload_<engine_id>.mmap) shared and writable. Close unmaps it.
// A link or anything but a regular file is refused (shm.OpenFile).
func OpenRegion(path string, rowBytes int) (*Region, error) {
	f, _, _, err := shm.OpenFile(path, os.O_RDWR)
	if err != nil {
		return nil, fmt.Errorf("rowsync: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("rowsync: %w", err)
	}
	if rowBytes <= 0 || fi.Size() == 0 || fi.Size()%int64(rowBytes) != 0 {
		return nil, fmt.Errorf("rowsync: %s: %d bytes is not a whole number of %d-byte rows", path, fi.Size(), rowBytes)
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, int(fi.Size()), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("rowsync: mmap %s: %w", path, err)
	}
	r, err := NewRegion(mem, rowBytes)
	if err != nil {
		syscall.Munmap(mem)
		return nil, err
	}
	r.unmap = func() error { return syscall.Munmap(mem) }
	return r, nil
}

// Close unmaps a region opened by OpenRegion; for NewRegion it does nothing.
// No method may be called, and no row slice used, after Close.
func (r *Region) Close() error {
	var err error
	r.closeOnce.Do(func() {
		if r.unmap != nil {
			err = r.unmap()
		}
	})
	return err
}

// Rows returns the number of rows.
func (r *Region) Rows() int { return r.rows }

// RowBytes returns the size of one row.
func (r *Region) RowBytes() int { return r.rowBytes }

// Row returns row i of the mapping itself (not a copy). It panics if i is out
// of range.
func (r *Region) Row(i int) []byte {
	if i < 0 || i >= r.rows {
		panic(fmt.Sprintf("rowsync: row %d out of range [0,%d)", i, r.rows))
	}
	return r.mem[i*r.rowBytes : (i+1)*r.rowBytes : (i+1)*r.rowBytes]
}

// prefault maps the pages of p, part of a mapping, in one call
// (MADV_POPULATE_READ, Linux 5.14) instead of one fault at each page's first
// touch. Where the kernel lacks it, or p does not start at a page, the pages
// fault as they are touched.
func prefault(p []byte) {
	unix.Madvise(p, unix.MADV_POPULATE_READ)
}
