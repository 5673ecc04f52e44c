package block

import (
	"math/rand/v2"
	"slices"
	"testing"
)

func TestCombineCRC32C(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range [][2]int{{0, 0}, {1, 0}, {0, 1}, {7, 9}, {4096, 1}, {1 << 20, 12345}, {3, 1<<20 + 5}} {
		a, b := make([]byte, n[0]), make([]byte, n[1])
		for i := range a {
			a[i] = byte(r.Uint32())
		}
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		if got, want := CombineCRC32C(CRC32C(a), CRC32C(b), int64(len(b))), CRC32C(append(a, b...)); got != want {
			t.Errorf("CombineCRC32C of %d and %d bytes = %08x, want %08x", len(a), len(b), got, want)
		}
	}
}

// TestSum: written in any pieces, a Sum gives the CRC32C of the whole and of
// every chunk, for blocks of one, of several and of more than MaxChunks chunks.
func TestSum(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, size := range []int{PageSize, 2 << 20, 8601600, 32 << 20, (MaxChunks + 1) << 20} {
		data := make([]byte, size)
		for i := range data {
			data[i] = byte(r.Uint32())
		}
		var s Sum
		for p := data; len(p) > 0; {
			n := min(len(p), 1+r.IntN(3<<20))
			s.Write(p[:n])
			p = p[n:]
		}
		if s.Len() != int64(size) || s.CRC() != CRC32C(data) {
			t.Errorf("%d bytes: Sum has %d bytes, crc %08x; want %08x", size, s.Len(), s.CRC(), CRC32C(data))
		}
		var crcs []uint32
		for i := 0; i < size; i += ChunkSize {
			crcs = append(crcs, CRC32C(data[i:min(i+ChunkSize, size)]))
		}
		if apart := SumOfChunks(crcs, int64(size)); apart.Len() != s.Len() || apart.CRC() != s.CRC() || !slices.Equal(apart.Chunks(), s.Chunks()) {
			t.Errorf("%d bytes: the sum of its chunks summed apart has %d bytes, crc %08x, %d chunks; want %d, %08x, %d",
				size, apart.Len(), apart.CRC(), len(apart.Chunks()), s.Len(), s.CRC(), len(s.Chunks()))
		}
		chunks := s.Chunks()
		if size > MaxChunks*ChunkSize {
			if chunks != nil {
				t.Errorf("%d bytes: %d chunk CRCs, more than MaxChunks", size, len(chunks))
			}
			continue
		}
		if len(chunks) != ChunkCount(int64(size)) {
			t.Fatalf("%d bytes: %d chunk CRCs, want %d", size, len(chunks), ChunkCount(int64(size)))
		}
		for i, c := range chunks {
			if want := CRC32C(data[i*ChunkSize : min((i+1)*ChunkSize, size)]); c != want {
				t.Errorf("%d bytes: chunk %d crc %08x, want %08x", size, i, c, want)
			}
		}
		if d := DigestOf(data); d.CRC != CRC32C(data) || d.checkChunks() != nil {
			t.Errorf("%d bytes: DigestOf gives %08x, chunks %v", size, d.CRC, d.checkChunks())
		}
	}
}
