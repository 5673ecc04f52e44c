package staging

import (
	"fmt"
	"testing"
	"time"
)

// TestStagerStateBounded floods the Stager with lookups of new tiers,
// groups and threads, as a flood of match requests does: absent keys leave
// no state, present ones at most maxChains chains and maxCursors cursors,
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
	chains, cursors := len(s.chains), len(s.cursors)
	s.mu.Unlock()
	if chains > maxChains || cursors > maxCursors {
		t.Fatalf("after a flood of %d (tier, group) pairs: %d chains (limit %d), %d cursors (limit %d)",
			4*maxChains, chains, maxChains, cursors, maxCursors)
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
	if len(s.chains) != 0 || len(s.cursors) != 0 {
		t.Fatalf("absent lookups left %d chains and %d cursors", len(s.chains), len(s.cursors))
	}
}

// TestDiagnosticsGroupsBounded floods the diagnostics with new (tier,
// group) pairs: at most MaxTrackedGroups are counted, and a group counted
// all along keeps its counts.
func TestDiagnosticsGroupsBounded(t *testing.T) {
	clock := newFakeClock()
	d := NewDiagnostics(DiagnosticsOptions{Now: clock.Now, MaxTrackedGroups: 64})
	engine := chunkKey(tierA, 0, 0)
	for i := range 64 * 20 {
		d.LookedUp(chunkKey(fmt.Sprintf("flood%d", i), i, 0), false)
		if i%16 == 0 {
			d.LookedUp(engine, true)
			clock.Advance(time.Second)
		}
	}
	d.mu.Lock()
	groups := len(d.groups)
	engineLookups := int64(-1)
	if w := d.groups[chainID{tier: tierA, group: 0}]; w != nil {
		engineLookups = w.sum(d.epoch(clock.Now())).lookups
	}
	d.mu.Unlock()
	if groups > 64 {
		t.Fatalf("%d groups counted, limit 64", groups)
	}
	if engineLookups != 80 {
		t.Fatalf("the engine's group counts %d lookups, want 80", engineLookups)
	}
}
