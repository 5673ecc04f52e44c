package diagnose

import (
	"fmt"
	"testing"
	"time"
)

// TestDiagnosticsGroupsBounded floods the diagnostics with new (tier,
// group) pairs: at most MaxTrackedGroups are counted, and a group counted
// all along keeps its counts.
func TestDiagnosticsGroupsBounded(t *testing.T) {
	clock := newFakeClock()
	d := New(Options{Now: clock.Now, MaxTrackedGroups: 64})
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
	if w := d.groups[groupID{tier: tierA, group: 0}]; w != nil {
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
