package shm

import (
	"bytes"
	"encoding/binary"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// This file holds what a load asks of the engine's regions (DESIGN.md
// "Loads: proven before the read returns"): a verified copy of a block that a
// row still holds, the destination row of a load from the part of the row
// already delivered, and a last check that a row holds a block.

// CopyHeld copies into dst (len(dst) == d.Size) a row that holds the digest's
// block and checks the copy, not the live row, against the CRC32C: the engine
// may overwrite the row meanwhile. The copy and its check are one pass
// (block.CopyCRC32C). ok is false when no row does.
func (s *Set) CopyHeld(d block.Digest, dst []byte) (RowRef, bool) {
	if int64(len(dst)) != d.Size {
		return RowRef{}, false
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	var found RowRef
	ok, tried := false, 0
	complete := s.eachRowLocked(d.Size, func(ref RowRef, row []byte) bool {
		if !d.SamplesMatch(row) {
			return true
		}
		tried++
		if block.CopyCRC32C(dst, row) == d.CRC {
			found, ok = ref, true
			return false
		}
		return tried < maxCandidates
	})
	return found, ok && complete
}

// Destinations finds the rows a load is filling from the part already
// delivered: prefix is the block's first len(prefix) bytes, and a row whose
// first len(prefix) bytes equal it (samples, then every byte: one pass over
// the row, where summing the prefix and the row took two) is a candidate.
// Rows that held the whole block before the load started (before) can match
// without being the destination, so they are left out, unless every
// candidate is one of them: the engine then reloads the block into a row
// that still holds it. Nothing is returned when the prefix is empty or
// matches more rows than are worth checking (an all-zero prefix).
func (s *Set) Destinations(d block.Digest, prefix []byte, before []RowRef) []RowRef {
	if len(prefix) == 0 || int64(len(prefix)) > d.Size {
		return nil
	}
	held := make(map[RowRef]bool, len(before))
	for _, ref := range before {
		held[ref] = true
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	var fresh, old []RowRef
	candidates := 0
	complete := s.eachRowLocked(d.Size, func(ref RowRef, row []byte) bool {
		if !prefixSamplesMatch(d, row, len(prefix)) {
			return true
		}
		if candidates++; candidates > maxCandidates+len(before) {
			fresh, old = nil, nil
			return false
		}
		if !bytes.Equal(row[:len(prefix)], prefix) {
			return true
		}
		if held[ref] {
			old = append(old, ref)
		} else {
			fresh = append(fresh, ref)
		}
		return true
	})
	if !complete {
		return nil
	}
	if len(fresh) > 0 {
		return fresh
	}
	return old
}

// prefixSamplesMatch checks the samples that lie within the first n bytes of row.
func prefixSamplesMatch(d block.Digest, row []byte, n int) bool {
	for _, s := range d.Samples {
		if int(s.Off)+8 <= n && binary.LittleEndian.Uint64(row[s.Off:]) != s.Value {
			return false
		}
	}
	return true
}

// SamplesHeld reports whether the row ref agrees with every sample of the
// digest now: a check of a few words, not of the row's bytes.
func (s *Set) SamplesHeld(ref RowRef, d block.Digest) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	r, ok := s.regions[ref.Region]
	if !ok || r.id != ref.File || r.data == nil || d.Size <= 0 || r.size%d.Size != 0 || int64(ref.Row) >= r.size/d.Size || r.faulted.Load() {
		return false
	}
	held := false
	s.guard(r, func() {
		held = d.SamplesMatch(r.data[int64(ref.Row)*d.Size : int64(ref.Row+1)*d.Size])
	})
	return held
}
