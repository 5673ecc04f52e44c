package engine

import "testing"

func block(i int) blockKey { return blockKey{group: 0, hash: string(rune('a' + i))} }

// counts returns the free and the cached (evictable) rows.
func (p *primaryTier) counts() (free, cached int) { return len(p.free), p.lru.Len() }

// TestPrimaryTierLRU: free rows first, then the least recently used cached
// row; pinned rows are never evicted; an eviction forgets the block.
func TestPrimaryTierLRU(t *testing.T) {
	p := newPrimaryTier(3)
	for i := range 3 {
		row, ok := p.alloc()
		if !ok || row != i {
			t.Fatalf("alloc %d: row %d ok %v, want the free row %d", i, row, ok, i)
		}
		p.assign(row, block(i))
	}
	if _, ok := p.alloc(); ok {
		t.Fatal("alloc succeeded with every row pinned")
	}
	p.unpin(1) // LRU order: 1
	p.unpin(0) // 1, 0
	p.unpin(2) // 1, 0, 2
	p.pin(1)   // touched: 0, 2
	p.unpin(1) // 0, 2, 1
	if free, cached := p.counts(); free != 0 || cached != 3 {
		t.Fatalf("%d free, %d cached rows, want 0 and 3", free, cached)
	}
	row, ok := p.alloc()
	if !ok || row != 0 {
		t.Fatalf("evicted row %d, want the least recently used row 0", row)
	}
	if _, held := p.find(block(0)); held {
		t.Fatal("evicted block still found")
	}
	p.unpin(row) // holds nothing: free again
	if free, cached := p.counts(); free != 1 || cached != 2 {
		t.Fatalf("%d free, %d cached rows, want 1 and 2", free, cached)
	}
	if p.peakPinned != 3 || p.pinned != 0 {
		t.Fatalf("peak pinned %d, now %d; want 3, 0", p.peakPinned, p.pinned)
	}
}

// TestPrimaryTierAssignMovesBlock: a block assigned to a new row leaves its old
// one, which becomes free.
func TestPrimaryTierAssignMovesBlock(t *testing.T) {
	p := newPrimaryTier(2)
	a, _ := p.alloc()
	p.assign(a, block(0))
	p.unpin(a)
	b, _ := p.alloc() // the free row 1
	p.assign(b, block(0))
	p.unpin(b)
	if row, _ := p.find(block(0)); row != b {
		t.Fatalf("block in row %d, want %d", row, b)
	}
	if free, cached := p.counts(); free != 1 || cached != 1 {
		t.Fatalf("%d free, %d cached rows, want 1 and 1", free, cached)
	}
	p.reset()
	if free, cached := p.counts(); free != 2 || cached != 0 {
		t.Fatalf("after reset: %d free, %d cached rows, want 2 and 0", free, cached)
	}
}
