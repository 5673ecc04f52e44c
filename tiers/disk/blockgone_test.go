package disk

import (
	"testing"
	"time"
)

// TestOnBlockGoneReportsEvictionsAndEngineUnlinks: OnBlockGone hears of every
// block that leaves the store, OnRemove only of those the store removed by
// itself; a block replaced by a rename over its name has not left.
func TestOnBlockGoneReportsEvictionsAndEngineUnlinks(t *testing.T) {
	s, clock, removed := evictStore(t, 2, Config{})
	gone := &removals{ch: make(chan string, 1024)}
	s.OnBlockGone(func(rel string) { gone.ch <- rel })
	put(t, s, 0)
	clock.Advance(time.Second)
	put(t, s, 1)
	clock.Advance(time.Second)
	putBlock(t, s, evName(1), pageData(100, 1)) // replaced, not gone

	put(t, s, 2) // evicts 0
	if rel := gone.next(t); rel != evName(0) {
		t.Fatalf("OnBlockGone(%s), want the evicted %s", rel, evName(0))
	}
	if rel := removed.next(t); rel != evName(0) {
		t.Fatalf("OnRemove(%s), want the evicted %s", rel, evName(0))
	}

	if err := s.Remove(evName(2)); err != nil {
		t.Fatal(err)
	}
	if rel := gone.next(t); rel != evName(2) {
		t.Fatalf("OnBlockGone(%s), want the unlinked %s", rel, evName(2))
	}
	// Evict 1 (3 and 4 fill the store again): OnRemove's next report is that
	// eviction, not the engine's unlink of 2.
	clock.Advance(time.Second)
	put(t, s, 3)
	put(t, s, 4)
	if rel := removed.next(t); rel != evName(1) {
		t.Fatalf("OnRemove(%s), want the evicted %s (an engine unlink is not reported there)", rel, evName(1))
	}
	if rel := gone.next(t); rel != evName(1) {
		t.Fatalf("OnBlockGone(%s), want the evicted %s", rel, evName(1))
	}
	select {
	case rel := <-gone.ch:
		t.Fatalf("unexpected OnBlockGone(%s)", rel)
	default:
	}
}
