package block

import "hash/crc32"

// castagnoli is the CRC32C table, hardware accelerated by the standard library.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// CRC32C is the checksum that proves a block's bytes everywhere: in its
// digest, in a load's verification and in the peers' acknowledgements.
func CRC32C(p []byte) uint32 { return crc32.Checksum(p, castagnoli) }

// UpdateCRC32C extends a running CRC32C over p.
func UpdateCRC32C(crc uint32, p []byte) uint32 { return crc32.Update(crc, castagnoli, p) }

// UpdateCRC32CZeros extends a running CRC32C over n zero bytes.
func UpdateCRC32CZeros(crc uint32, n uint64) uint32 {
	for ; n > 0; n -= min(n, uint64(len(zeros))) {
		crc = crc32.Update(crc, castagnoli, zeros[:min(n, uint64(len(zeros)))])
	}
	return crc
}

// CachePiece is how many bytes a copy moves before their CRC32C is taken:
// small enough that the source and the copy both stay in a core's cache, so
// the check reads the copy from there instead of from memory, and a copy with
// its check costs one pass over memory rather than two.
const CachePiece = 256 << 10

// CopyCRC32C copies src into dst (of the same length) and returns the CRC32C
// of what it wrote to dst, each piece checksummed as soon as it was copied.
// The checksum is always the copy's: a src changed during the copy gives the
// CRC32C of the bytes dst now holds, never of bytes it does not.
func CopyCRC32C(dst, src []byte) uint32 {
	if len(dst) != len(src) {
		panic("block.CopyCRC32C: lengths differ")
	}
	var crc uint32
	for off := 0; off < len(src); off += CachePiece {
		piece := dst[off:min(off+CachePiece, len(dst))]
		copy(piece, src[off:])
		crc = UpdateCRC32C(crc, piece)
	}
	return crc
}
