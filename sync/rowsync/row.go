package rowsync

import (
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
	runs := block.NonZeroRuns(row, 0)
	extents := make([]Extent, 0, len(runs))
	for _, r := range runs {
		extents = append(extents, Extent{Off: uint64(r.Start), Data: row[r.Start:r.End]})
	}
	return extents
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
