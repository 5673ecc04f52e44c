package rowsync

import (
	"bytes"
	"hash/crc32"
	"io"
)

// ZeroRunBytes is the granularity of zero detection: a row is sent as the
// extents of its non-zero ZeroRunBytes-sized pages; all-zero pages are never
// sent and the receiver zero-fills them.
const ZeroRunBytes = 4096

// crcChunkBytes is how much of a row is received before it is added to the
// checksum, so that the checksum reads it from the cache.
const crcChunkBytes = 64 << 10

var (
	castagnoli = crc32.MakeTable(crc32.Castagnoli)
	zeroPage   [ZeroRunBytes]byte
)

// Checksum returns the CRC32C (Castagnoli) of b, the checksum acknowledgements
// and store samples carry.
func Checksum(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// isZero reports whether every byte of b is zero.
func isZero(b []byte) bool {
	for len(b) > 0 {
		n := min(len(b), len(zeroPage))
		if !bytes.Equal(b[:n], zeroPage[:n]) {
			return false
		}
		b = b[n:]
	}
	return true
}

// nonZeroExtents returns the extents of the non-zero pages of row, adjacent
// pages merged, Data aliasing row. A non-zero page is usually told at its
// first bytes, so this reads little more than the zero pages.
func nonZeroExtents(row []byte) (extents []Extent) {
	start := -1 // start of the extent being built, -1 when none
	for off := 0; off < len(row); off += ZeroRunBytes {
		page := row[off:min(off+ZeroRunBytes, len(row))]
		zero := bytes.Equal(page, zeroPage[:len(page)])
		switch {
		case !zero && start < 0:
			start = off
		case zero && start >= 0:
			extents = append(extents, Extent{Off: uint64(start), Data: row[start:off]})
			start = -1
		}
	}
	if start >= 0 {
		extents = append(extents, Extent{Off: uint64(start), Data: row[start:]})
	}
	return extents
}

// sumZeros extends a running CRC32C over n zero bytes.
func sumZeros(crc uint32, n uint64) uint32 {
	for ; n > 0; n -= min(n, ZeroRunBytes) {
		crc = crc32.Update(crc, castagnoli, zeroPage[:min(n, ZeroRunBytes)])
	}
	return crc
}

// readAndSum fills dst from r in chunks, adding each chunk to the running
// CRC32C right after it arrived, while it is in the cache.
func readAndSum(crc uint32, dst []byte, r io.Reader) (uint32, error) {
	for off := 0; off < len(dst); off += crcChunkBytes {
		chunk := dst[off:min(off+crcChunkBytes, len(dst))]
		if _, err := io.ReadFull(r, chunk); err != nil {
			return crc, err
		}
		crc = crc32.Update(crc, castagnoli, chunk)
	}
	return crc, nil
}
