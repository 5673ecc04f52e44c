package rowsync

import (
	"bytes"
	"fmt"
	"os"
	"sync"
	"syscall"
)

// MaxRowBytes is the largest row this package handles (and the largest row a
// RowWrite frame may describe).
const MaxRowBytes = 256 << 20

const (
	// sampleBytes is the size of one fingerprint sample.
	sampleBytes = 64
	// sampleProbes is how many evenly spaced windows of the block are probed
	// to find where its non-zero bytes are.
	sampleProbes = 256
	// maxSamples is how many of the probed windows are compared in every row
	// before a row is fully compared.
	maxSamples = 8
)

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
func OpenRegion(path string, rowBytes int) (*Region, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
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

// Identify finds the row that now holds exactly block. It compares a few
// sampled windows of every row first and fully compares only the rows that
// pass, so it reads little more than one row. ok is false when no row holds
// block, when len(block) is not RowBytes, and when more than one row holds it:
// a stale copy of the same block elsewhere makes the answer ambiguous, and
// mirroring the wrong row would leave the right one stale on the peers.
func (r *Region) Identify(block []byte) (row int, ok bool) {
	row, matches := r.identify(block)
	return row, matches == 1
}

// identify returns the first row holding exactly block and the number of rows
// that do, counting no further than 2.
func (r *Region) identify(block []byte) (row, matches int) {
	if len(block) != r.rowBytes {
		return -1, 0
	}
	var offsets [maxSamples]int
	samples := sampleOffsets(block, &offsets)
	width := min(sampleBytes, len(block))
	row = -1
	for i := range r.rows {
		cand := r.Row(i)
		if !samplesEqual(cand, block, samples, width) || !bytes.Equal(cand, block) {
			continue
		}
		if matches == 0 {
			row = i
		}
		if matches++; matches == 2 {
			break
		}
	}
	return row, matches
}

// samplesEqual reports whether a and b agree on the windows at offsets.
func samplesEqual(a, b []byte, offsets []int, width int) bool {
	for _, off := range offsets {
		if !bytes.Equal(a[off:off+width], b[off:off+width]) {
			return false
		}
	}
	return true
}

// sampleOffsets chooses up to maxSamples window offsets spread over the
// non-zero part of block (found by probing sampleProbes windows), so that the
// samples tell rows apart even when most of the block is zero (the other
// nodes' slots). A block that looks all zero gets windows spread over all of it.
func sampleOffsets(block []byte, dst *[maxSamples]int) []int {
	width := min(sampleBytes, len(block))
	var probes, nonZero [sampleProbes]int
	n, nz := 0, 0
	for i := range sampleProbes {
		off := (len(block) - width) * i / (sampleProbes - 1)
		if n > 0 && off == probes[n-1] {
			continue
		}
		probes[n] = off
		n++
		if !isZero(block[off : off+width]) {
			nonZero[nz] = off
			nz++
		}
	}
	pool := probes[:n]
	if nz > 0 {
		pool = nonZero[:nz]
	}
	k := min(maxSamples, len(pool))
	for j := range k {
		dst[j] = pool[j*len(pool)/k]
	}
	return dst[:k]
}
