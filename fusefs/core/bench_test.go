package core

import (
	"context"
	"testing"
)

// BenchmarkLoadFromStore opens and reads one block again and again: the
// daemon's work for a load without the kernel's copy (read, verify, serve).
func BenchmarkLoadFromStore(b *testing.B) {
	f := newFixture(&testing.T{})
	rel, _ := f.put(&testing.T{}, 1)
	loads := NewLoads(Config{Store: f.store})
	b.SetBytes(rowBytes)
	for b.Loop() {
		l, err := loads.Open(context.Background(), refOf(rel))
		if err != nil {
			b.Fatal(err)
		}
		for off := int64(0); off < l.Size(); off += 1 << 20 {
			if _, err := l.Read(context.Background(), off, 1<<20); err != nil {
				b.Fatal(err)
			}
		}
		l.Flush()
		l.Release()
	}
}
