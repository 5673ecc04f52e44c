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
