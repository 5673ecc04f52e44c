package staging

import (
	"testing"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// BenchmarkTakeStaged compares serving a staged 8 MiB block, a Take and the
// copy of its bytes into the reader's buffer (as a FUSE READ reply copies
// them into the engine's row), with a plain 8 MiB memory copy. take-only is
// the Take alone: the cost staging adds to the copy.
func BenchmarkTakeStaged(b *testing.B) {
	const size = 8 << 20
	src, dst := make([]byte, size), make([]byte, size)
	for i := range src {
		src[i] = byte(i)
	}
	b.Run("memcpy", func(b *testing.B) {
		b.SetBytes(size)
		for b.Loop() {
			copy(dst, src)
		}
	})
	staged := func(b *testing.B, serve func(data []byte)) {
		s := newTestStager(b, func(block.Ref) ([]byte, error) { return src, nil }, Options{Budget: 4 * size, WaveBlocks: 1, QueueDepth: 1})
		keys := chunkKeys(tierA, 0, 2)
		lookUp(s, 1, keys...)
		b.SetBytes(size)
		for b.Loop() {
			b.StopTimer()
			s.NoteRead(keys[0]) // a new pass over the chain stages keys[1]
			s.Settle()
			b.StartTimer()
			data, ok := s.Take(keys[1])
			if !ok {
				b.Fatal("block not staged")
			}
			serve(data)
		}
	}
	b.Run("staged", func(b *testing.B) {
		staged(b, func(data []byte) { copy(dst, data) })
	})
	b.Run("take-only", func(b *testing.B) {
		staged(b, func([]byte) {})
	})
}
