package disk

import "testing"

// TestLookupStreamsBounded looks a block up from many more threads than
// maxStreams within one chain gap, as a flood of match requests (one
// stream each) does: the store remembers at most maxStreams of them.
func TestLookupStreamsBounded(t *testing.T) {
	clock := newFakeClock()
	s := openStore(t, Config{Now: clock.Now})
	rel := blockRel("T", 0, hashHex(1, 64))
	putBlock(t, s, rel, pageData(1, 1))
	for stream := range uint32(10 * maxStreams) {
		if !s.Lookup(rel, stream) {
			t.Fatal("the block answered absent")
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.streams) > maxStreams {
		t.Fatalf("%d lookup streams remembered, limit %d", len(s.streams), maxStreams)
	}
}
