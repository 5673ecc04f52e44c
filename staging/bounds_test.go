package staging

import (
	"fmt"
	"testing"

	"github.com/kvtierfs/kvtierfs/tiers/batch"
)

// TestStagerStateBounded floods the Stager with lookups of new tiers,
// groups and threads, as a flood of match requests does: absent keys leave
// no state, present ones at most maxChains chains and batch.MaxCursors cursors,
// and a chain in use keeps what it learnt.
func TestStagerStateBounded(t *testing.T) {
	f := newFakeStore(1000)
	s := newTestStager(t, f.fetch, Options{Budget: 1 << 20, WaveBlocks: 4, QueueDepth: 2})
	keys := chunkKeys(tierA, 0, 10)
	lookUp(s, 1, keys...)
	for i := range 4 * maxChains {
		tier := fmt.Sprintf("flood%d", i)
		s.NoteLookup(chunkKey(tier, i, 0), uint32(1000+i), false)
		s.NoteLookup(chunkKey(tier, i, 1), uint32(1000+i), true)
		if i%(maxChains/8) == 0 {
			lookUp(s, 1, keys[0]) // the engine's chain stays in use
		}
	}
	s.mu.Lock()
	chains, cursors := len(s.chains), s.cursors.Len()
	s.mu.Unlock()
	if chains > maxChains || cursors > batch.MaxCursors {
		t.Fatalf("after a flood of %d (tier, group) pairs: %d chains (limit %d), %d cursors (limit %d)",
			4*maxChains, chains, maxChains, cursors, batch.MaxCursors)
	}
	mustMiss(t, s, keys[0])
	wantFetched(t, f, keys[1:5]...)
}

// TestStagerAbsentLookupsLeaveNoState checks that lookups of absent keys
// create neither chains nor cursors.
func TestStagerAbsentLookupsLeaveNoState(t *testing.T) {
	s := newTestStager(t, newFakeStore(1000).fetch, Options{Budget: 1 << 20})
	for i := range 1000 {
		s.NoteLookup(chunkKey(fmt.Sprintf("t%d", i), i, 0), uint32(i), false)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.chains) != 0 || s.cursors.Len() != 0 {
		t.Fatalf("absent lookups left %d chains and %d cursors", len(s.chains), s.cursors.Len())
	}
}
