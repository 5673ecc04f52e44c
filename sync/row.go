package rowsync

import (
	"bytes"
	"hash/crc32"
)

// ZeroRunBytes is the granularity of zero detection: a row is sent as the
// extents of its non-zero ZeroRunBytes-sized pages; all-zero pages are never
// sent and the receiver zero-fills them.
const ZeroRunBytes = 4096

// crcChunkBytes is how much of a row is written before it is read back for
// the checksum, so that the read-back hits the cache.
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

// writeAndSum copies src into dst (or zeroes dst when src is nil) in chunks,
// reading each chunk back into the running CRC32C right after writing it.
func writeAndSum(crc uint32, dst, src []byte) uint32 {
	for off := 0; off < len(dst); off += crcChunkBytes {
		chunk := dst[off:min(off+crcChunkBytes, len(dst))]
		if src == nil {
			clear(chunk)
		} else {
			copy(chunk, src[off:])
		}
		crc = crc32.Update(crc, castagnoli, chunk)
	}
	return crc
}
