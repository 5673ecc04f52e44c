package block

// A block's bytes are proven chunk by chunk: its digest holds the CRC32C of
// every ChunkSize bytes, so a load can hand out a chunk once it matched,
// whatever order a reader asks for them in, and the whole block's CRC32C is
// their combination.

const (
	// ChunkSize is the span of one chunk CRC.
	ChunkSize = 1 << 20
	// MaxChunks bounds the chunk CRCs of a digest (1 KiB of record): a larger
	// block keeps only its whole CRC32C, and a load of it is proven whole.
	MaxChunks = 256
)

// castagnoliReversed is the CRC32C polynomial, bit-reversed as the table uses it.
const castagnoliReversed = 0x82f63b78

// mulModP multiplies two polynomials modulo the CRC32C polynomial, in the
// reversed bit order of a CRC value (bit 31 is x^0).
func mulModP(a, b uint32) uint32 {
	var p uint32
	for m := uint32(1) << 31; m != 0; m >>= 1 {
		if a&m != 0 {
			p ^= b
		}
		if b&1 != 0 {
			b = b>>1 ^ castagnoliReversed
		} else {
			b >>= 1
		}
	}
	return p
}

// xPow8n is x^(8n) modulo the polynomial: the shift of a CRC past n bytes.
func xPow8n(n int64) uint32 {
	p := uint32(1) << 31 // x^0
	x := uint32(1) << 23 // x^8
	for ; n > 0; n >>= 1 {
		if n&1 != 0 {
			p = mulModP(p, x)
		}
		x = mulModP(x, x)
	}
	return p
}

// CombineCRC32C is the CRC32C of a||b from the CRC32C of a, that of b and
// b's length.
func CombineCRC32C(crcA, crcB uint32, lenB int64) uint32 {
	return mulModP(xPow8n(lenB), crcA) ^ crcB
}

// chunkShift is xPow8n(ChunkSize), the shift past one whole chunk.
var chunkShift = xPow8n(ChunkSize)

// Sum computes a block's CRC32C and its chunk CRCs in one pass over its
// bytes, given in order; the zero Sum is ready to use.
type Sum struct {
	n      int64
	whole  uint32 // CRC32C of the complete chunks
	cur    uint32 // CRC32C of the chunk being summed
	chunks []uint32
}

// Write extends the sum over p, the bytes that follow those summed so far.
func (s *Sum) Write(p []byte) {
	for len(p) > 0 {
		k := min(len(p), ChunkSize-int(s.n%ChunkSize))
		s.cur = UpdateCRC32C(s.cur, p[:k])
		s.n += int64(k)
		p = p[k:]
		if s.n%ChunkSize == 0 {
			s.whole = mulModP(chunkShift, s.whole) ^ s.cur
			if len(s.chunks) <= MaxChunks {
				s.chunks = append(s.chunks, s.cur)
			}
			s.cur = 0
		}
	}
}

// Len is the number of bytes summed.
func (s *Sum) Len() int64 { return s.n }

// CRC is the CRC32C of the bytes summed.
func (s *Sum) CRC() uint32 {
	if tail := s.n % ChunkSize; tail != 0 {
		return CombineCRC32C(s.whole, s.cur, tail)
	}
	return s.whole
}

// Chunks are the chunk CRCs of the bytes summed (the last chunk may be
// short), or nil when there are more than MaxChunks.
func (s *Sum) Chunks() []uint32 {
	out := s.chunks
	if s.n%ChunkSize != 0 {
		out = append(out[:len(out):len(out)], s.cur)
	}
	if len(out) > MaxChunks {
		return nil
	}
	return out
}

// ChunkCount is the number of chunks of a block of size bytes.
func ChunkCount(size int64) int { return int((size + ChunkSize - 1) / ChunkSize) }

// SumOfChunks is the Sum of size bytes whose chunks (ChunkSize bytes each,
// the last one possibly short) were checksummed apart, in parallel: crcs
// holds each chunk's CRC32C, in order.
func SumOfChunks(crcs []uint32, size int64) Sum {
	var s Sum
	for i, crc := range crcs {
		n := min(ChunkSize, size-int64(i)*ChunkSize)
		s.n += n
		if n < ChunkSize {
			s.cur = crc
			break
		}
		s.whole = mulModP(chunkShift, s.whole) ^ crc
		if len(s.chunks) <= MaxChunks {
			s.chunks = append(s.chunks, crc)
		}
	}
	return s
}
