package shm

import (
	"bytes"
	"encoding/binary"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// This file holds what a store asks of the engine's regions (DESIGN.md "The
// store"): the row a block was written from, when the kernel wrote it to the
// tmp file without the daemon seeing the bytes.

// WrittenRow is what the daemon learns from the row a block was written from.
type WrittenRow struct {
	// Sum holds the row's CRC32C and chunk CRCs.
	Sum block.Sum
	// Probes are the row's windows at block.ProbeOffsets(size), in that order.
	Probes []uint64
	// ZeroRuns are the row's all-zero page runs, [start, end) byte offsets.
	ZeroRuns [][2]int64
}

// ScanWritten finds a row of size bytes that holds pages, each block.PageSize bytes
// of the file a store wrote keyed by its offset, and returns the row's
// CRC32C, probe windows and all-zero pages, read in one pass. ok is false when
// no row holds every page, when rows holding them differ elsewhere or more
// than maxCandidates rows hold them (the written one is unknown), when the pages are all zero (they tell no row
// apart), or when a region faulted while it was read.
func (s *Set) ScanWritten(size int64, pages map[int64][]byte) (WrittenRow, bool) {
	page := int64(block.PageSize)
	if size <= 0 || size%page != 0 || len(pages) == 0 {
		return WrittenRow{}, false
	}
	telling := false
	for off, p := range pages {
		if len(p) != block.PageSize || off%page != 0 || off+page > size {
			return WrittenRow{}, false
		}
		telling = telling || !block.IsZero(p)
	}
	if !telling {
		return WrittenRow{}, false
	}
	keyAt, key := keyWord(pages)
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out WrittenRow
	found, ambiguous, matched := false, false, 0
	complete := s.eachRowLocked(size, func(ref RowRef, row []byte) bool {
		// One word first: a region of many rows is passed over at one
		// load per row, not one page compare and map walk per row.
		if binary.LittleEndian.Uint64(row[keyAt:]) != key {
			return true
		}
		for off, p := range pages {
			if !bytes.Equal(row[off:off+page], p) {
				return true
			}
		}
		// Every matching row is scanned: two rows that agree at the pages
		// sampled but hold other bytes leave the written one unknown. Rows
		// past maxCandidates leave it unknown too: a region of many rows
		// alike at those pages would otherwise be checksummed whole at each
		// rename, costing more than reading the file back.
		if matched++; matched > maxCandidates {
			ambiguous = true
			return false
		}
		w := scanRow(row)
		if found && w.Sum.CRC() != out.Sum.CRC() {
			ambiguous = true
			return false
		}
		out, found = w, true
		return true
	})
	return out, found && !ambiguous && complete
}

// keyWord is the offset and value of the first non-zero 8-byte word of
// pages (at least one page is not all zero), which most rows do not hold.
func keyWord(pages map[int64][]byte) (at int64, word uint64) {
	first := int64(-1)
	for off, p := range pages {
		if (first < 0 || off < first) && !block.IsZero(p) {
			first = off
		}
	}
	p := pages[first]
	for i := 0; i+8 <= len(p); i += 8 {
		if w := binary.LittleEndian.Uint64(p[i:]); w != 0 {
			return first + int64(i), w
		}
	}
	return first, 0
}

// scanRow computes a row's CRC32C, probe windows and all-zero page runs.
func scanRow(row []byte) WrittenRow {
	var w WrittenRow
	for start := 0; start < len(row); start += block.PageSize {
		page := row[start : start+block.PageSize]
		w.Sum.Write(page)
		if !block.IsZero(page) {
			continue
		}
		if n := len(w.ZeroRuns); n > 0 && w.ZeroRuns[n-1][1] == int64(start) {
			w.ZeroRuns[n-1][1] += int64(block.PageSize)
		} else {
			w.ZeroRuns = append(w.ZeroRuns, [2]int64{int64(start), int64(start + block.PageSize)})
		}
	}
	for _, off := range block.ProbeOffsets(int64(len(row))) {
		w.Probes = append(w.Probes, binary.LittleEndian.Uint64(row[off:]))
	}
	return w
}
