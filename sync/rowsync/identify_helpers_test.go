package rowsync

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// The byte-based path the tests and benchmarks drive Node with: the block's
// bytes are at hand, and the row holding them is found by sampled windows,
// then a full compare. (The filesystem finds the row from the block's digest
// itself and calls MirrorBlock and SampleStoredRow.)

// Errors of LoadDone besides a Mirror's.
var (
	ErrRowNotFound  = errors.New("rowsync: no row of the region holds the loaded block")
	ErrRowAmbiguous = errors.New("rowsync: several rows of the region hold the loaded block")
)

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

// LoadDone finds the row of region that now holds block and mirrors it
// (MirrorBlock); without peers it does nothing.
func (n *Node) LoadDone(ctx context.Context, region *Region, data []byte) error {
	if n.mirror == nil {
		return nil
	}
	if !n.gate.Allowed() {
		return fmt.Errorf("%w: %s", ErrNotReplicated, n.gate.Snapshot().DecidedBy)
	}
	row, matches := region.identify(data)
	switch {
	case matches == 0:
		return ErrRowNotFound
	case matches > 1:
		return ErrRowAmbiguous
	}
	return n.MirrorBlock(ctx, region, row, data, block.CRC32C(data))
}

// StoreDone finds the row of region holding a stored block and, when the gate
// wants this store sampled, compares it with the peers' (SampleStoredRow).
func (n *Node) StoreDone(ctx context.Context, region *Region, key string, data []byte) error {
	if !n.WantStoreSample() {
		return nil
	}
	row, matches := region.identify(data)
	if matches != 1 {
		return fmt.Errorf("rowsync: sample %q: %d rows hold the stored block", key, matches)
	}
	return n.SampleStoredRow(ctx, region, row, key, block.CRC32C(data))
}

// Identify finds the row that now holds exactly block. It compares a few
// sampled windows of every row first and fully compares only the rows that
// pass, so it reads little more than one row. ok is false when no row holds
// block, when len(block) is not RowBytes, and when more than one row holds it:
// a stale copy of the same block elsewhere makes the answer ambiguous, and
// mirroring the wrong row would leave the right one stale on the peers.
func (r *Region) Identify(data []byte) (row int, ok bool) {
	row, matches := r.identify(data)
	return row, matches == 1
}

// identify returns the first row holding exactly block and the number of rows
// that do, counting no further than 2.
func (r *Region) identify(data []byte) (row, matches int) {
	if len(data) != r.rowBytes {
		return -1, 0
	}
	var offsets [maxSamples]int
	samples := sampleOffsets(data, &offsets)
	width := min(sampleBytes, len(data))
	row = -1
	for i := range r.rows {
		cand := r.Row(i)
		if !samplesEqual(cand, data, samples, width) || !bytes.Equal(cand, data) {
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
func sampleOffsets(data []byte, dst *[maxSamples]int) []int {
	width := min(sampleBytes, len(data))
	var probes, nonZero [sampleProbes]int
	n, nz := 0, 0
	for i := range sampleProbes {
		off := (len(data) - width) * i / (sampleProbes - 1)
		if n > 0 && off == probes[n-1] {
			continue
		}
		probes[n] = off
		n++
		if !block.IsZero(data[off : off+width]) {
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
