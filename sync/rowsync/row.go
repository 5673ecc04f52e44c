package rowsync

import (
	"fmt"
	"io"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// A row is sent as the extents of its non-zero pages (block.PageSize); the
// all-zero pages are never sent and the receiver zero-fills them.

// crcChunkBytes is how much of a row is received before it is added to the
// checksum, so that the checksum reads it from the cache.
const crcChunkBytes = 64 << 10

// nonZeroExtents returns the extents of the non-zero pages of row, adjacent
// pages merged, Data aliasing row.
func nonZeroExtents(row []byte) []Extent {
	extents, _ := extentsOf(row, block.NonZeroRuns(row, 0)) // sorted and inside row
	return extents
}

// extentsOf returns the extents of runs of row, checked to be sorted,
// disjoint, non-empty and inside the row.
func extentsOf(row []byte, runs []block.Run) ([]Extent, error) {
	extents := make([]Extent, 0, len(runs))
	end := 0
	for _, r := range runs {
		if r.Start < end || r.End <= r.Start || r.End > len(row) {
			return nil, fmt.Errorf("rowsync: run [%d, %d) of a %d-byte row after one ending at %d", r.Start, r.End, len(row), end)
		}
		extents = append(extents, Extent{Off: uint64(r.Start), Data: row[r.Start:r.End]})
		end = r.End
	}
	return extents, nil
}

// readAndSum fills dst from r in chunks, adding each chunk to the running
// CRC32C right after it arrived, while it is in the cache.
func readAndSum(crc uint32, dst []byte, r io.Reader) (uint32, error) {
	for off := 0; off < len(dst); off += crcChunkBytes {
		chunk := dst[off:min(off+crcChunkBytes, len(dst))]
		if _, err := io.ReadFull(r, chunk); err != nil {
			return crc, err
		}
		crc = block.UpdateCRC32C(crc, chunk)
	}
	return crc, nil
}
