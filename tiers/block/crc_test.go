package block

import (
	"bytes"
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

// TestCopyCRC32C checks that the fused copy and check copies every byte and
// sums exactly the copy, across piece boundaries, and that a bit flipped in
// the source is told by the checksum a load compares with the digest's.
func TestCopyCRC32C(t *testing.T) {
	table := crc32.MakeTable(crc32.Castagnoli)
	rng := rand.New(rand.NewPCG(29, 3))
	for _, size := range []int{0, 1, 4095, CachePiece - 1, CachePiece, CachePiece + 1, 3*CachePiece + 17, 8 << 20} {
		src := make([]byte, size)
		for i := range src {
			src[i] = byte(rng.Uint32())
		}
		dst := make([]byte, size)
		got := CopyCRC32C(dst, src)
		if !bytes.Equal(dst, src) {
			t.Fatalf("size %d: the copy differs from the source", size)
		}
		want := crc32.Checksum(src, table)
		if got != want {
			t.Fatalf("size %d: crc32c %08x, want %08x", size, got, want)
		}
		if size == 0 {
			continue
		}
		bit := rng.IntN(size * 8)
		src[bit/8] ^= 1 << (bit % 8)
		if flipped := CopyCRC32C(dst, src); flipped == want {
			t.Fatalf("size %d: bit %d flipped in the source, yet the copy sums to the intact block's %08x", size, bit, want)
		} else if flipped != crc32.Checksum(dst, table) {
			t.Fatalf("size %d: crc32c %08x is not the copy's %08x", size, flipped, crc32.Checksum(dst, table))
		}
	}
}

// TestCopyCRC32CRefusesLengths checks that buffers of different lengths are
// a programming error, not a short copy that could be served.
func TestCopyCRC32CRefusesLengths(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("CopyCRC32C copied between buffers of different lengths")
		}
	}()
	CopyCRC32C(make([]byte, 8), make([]byte, 9))
}

// BenchmarkCopyThenCRC32C and BenchmarkCopyCRC32C compare a whole 8 MiB copy
// followed by its checksum with the fused copy and check.
func BenchmarkCopyThenCRC32C(b *testing.B) {
	src, dst := make([]byte, 8<<20), make([]byte, 8<<20)
	b.SetBytes(int64(len(src)))
	for b.Loop() {
		copy(dst, src)
		CRC32C(dst)
	}
}

func BenchmarkCopyCRC32C(b *testing.B) {
	src, dst := make([]byte, 8<<20), make([]byte, 8<<20)
	b.SetBytes(int64(len(src)))
	for b.Loop() {
		CopyCRC32C(dst, src)
	}
}
