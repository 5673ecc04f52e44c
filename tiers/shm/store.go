package shm

import (
	"bytes"
	"encoding/binary"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"

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
	first := int64(-1) // the first page that is not all zero
	for off, p := range pages {
		if len(p) != block.PageSize || off%page != 0 || off+page > size {
			return WrittenRow{}, false
		}
		if (first < 0 || off < first) && !block.IsZero(p) {
			first = off
		}
	}
	if first < 0 {
		return WrittenRow{}, false
	}
	keyAt, key := keyWord(first, pages[first])
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
		w := ScanRow(row)
		if found && w.Sum.CRC() != out.Sum.CRC() {
			ambiguous = true
			return false
		}
		out, found = w, true
		return true
	})
	return out, found && !ambiguous && complete
}

// keyWord is the offset and value of the first non-zero 8-byte word of p,
// a page at off that is not all zero: most rows do not hold it.
func keyWord(off int64, p []byte) (at int64, word uint64) {
	for i := 0; i+8 <= len(p); i += 8 {
		if w := binary.LittleEndian.Uint64(p[i:]); w != 0 {
			return off + int64(i), w
		}
	}
	return off, 0
}

// maxScanWorkers bounds the goroutines that checksum one row. One core
// checksums an 8 MiB row in 0.77-0.93 ms on the development machine
// (`GOMAXPROCS=1 go test -run '^$' -bench 'ScanWritten$' -benchtime 30x
// -count 3 ./tiers/shm`), more for a row only memory holds (the kernel's DMA
// wrote it last), so its chunks are checksummed in parallel, each on its
// own core where there are some.
const maxScanWorkers = 8

// ScanRow computes a row's CRC32C, probe windows and all-zero page runs, its
// chunks (block.ChunkSize) in parallel; the store also scans a file of a
// store in memory so, mapped. The caller runs it under Guard (or the
// runtime's panic-on-fault); a fault in a worker is raised again in the
// caller, for it to take.
func ScanRow(row []byte) WrittenRow {
	size := int64(len(row))
	chunks := block.ChunkCount(size)
	crcs := make([]uint32, chunks)
	zeros := make([][][2]int64, chunks)
	scan := func(i int) {
		start := int64(i) * block.ChunkSize
		crcs[i], zeros[i] = scanChunk(row[start:min(start+block.ChunkSize, size)], start)
	}
	if workers := min(chunks, runtime.GOMAXPROCS(0), maxScanWorkers); workers > 1 {
		inParallel(chunks, workers, scan)
	} else {
		for i := range chunks {
			scan(i)
		}
	}
	w := WrittenRow{Sum: block.SumOfChunks(crcs, size)}
	for _, runs := range zeros {
		for _, r := range runs {
			if n := len(w.ZeroRuns); n > 0 && w.ZeroRuns[n-1][1] == r[0] {
				w.ZeroRuns[n-1][1] = r[1]
			} else {
				w.ZeroRuns = append(w.ZeroRuns, r)
			}
		}
	}
	for _, off := range block.ProbeOffsets(size) {
		w.Probes = append(w.Probes, binary.LittleEndian.Uint64(row[off:]))
	}
	return w
}

// scanChunk is the CRC32C and the all-zero page runs of a chunk at off.
func scanChunk(chunk []byte, off int64) (crc uint32, zeroRuns [][2]int64) {
	for start := 0; start < len(chunk); start += block.PageSize {
		page := chunk[start : start+block.PageSize]
		crc = block.UpdateCRC32C(crc, page)
		if !block.IsZero(page) {
			continue
		}
		at := off + int64(start)
		if n := len(zeroRuns); n > 0 && zeroRuns[n-1][1] == at {
			zeroRuns[n-1][1] += int64(block.PageSize)
		} else {
			zeroRuns = append(zeroRuns, [2]int64{at, at + int64(block.PageSize)})
		}
	}
	return crc, zeroRuns
}

// inParallel runs fn(0) … fn(n-1) on workers goroutines. Each runs with the
// runtime's panic-on-fault, as its caller under Guard does; the first panic
// of any is raised again in the caller once all are done.
func inParallel(n, workers int, fn func(i int)) {
	var next atomic.Int64
	var raised atomic.Pointer[any]
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
			defer func() {
				if v := recover(); v != nil {
					raised.CompareAndSwap(nil, &v)
				}
			}()
			for i := next.Add(1) - 1; i < int64(n); i = next.Add(1) - 1 {
				fn(int(i))
			}
		})
	}
	wg.Wait()
	if v := raised.Load(); v != nil {
		panic(*v)
	}
}
