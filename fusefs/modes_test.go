package fusefs

import "testing"

// TestLoadModesNeverMixPassthroughAndCached walks the mode choices of
// overlapping loads of one node: the kernel must never see a passthrough
// open and a cached open at the same time.
func TestLoadModesNeverMixPassthroughAndCached(t *testing.T) {
	var m loadModes
	steps := []struct {
		fromMemory bool
		want       loadMode
	}{
		{true, cached},  // a staged load
		{false, direct}, // a store load while the staged one is open
		{true, cached},  // another staged load shares the cached mode
		{false, direct}, // still cached opens
	}
	var held []loadMode
	for i, s := range steps {
		if got := m.acquire(s.fromMemory); got != s.want {
			t.Fatalf("step %d: mode %d, want %d", i, got, s.want)
		}
		held = append(held, s.want)
	}
	for _, mode := range held {
		m.release(mode)
	}
	if got := m.acquire(false); got != passthrough {
		t.Fatalf("after every release a store load got mode %d, want passthrough", got)
	}
	if got := m.acquire(true); got != direct {
		t.Fatalf("a staged load during a passthrough load got mode %d, want direct", got)
	}
	if got := m.acquire(false); got != passthrough {
		t.Fatalf("a second store load got mode %d, want passthrough", got)
	}
}
