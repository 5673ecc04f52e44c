package fusefs

import "testing"

// TestLoadModesNeverMixPassthroughAndCached walks the mode choices of
// overlapping O_DIRECT loads of one node: the kernel must never see a
// passthrough open and a cached open at the same time.
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
		if got := m.acquire(s.fromMemory, true); got != s.want {
			t.Fatalf("step %d: mode %d, want %d", i, got, s.want)
		}
		held = append(held, s.want)
	}
	for _, mode := range held {
		m.release(mode)
	}
	if got := m.acquire(false, true); got != passthrough {
		t.Fatalf("after every release a store load got mode %d, want passthrough", got)
	}
	if got := m.acquire(true, true); got != direct {
		t.Fatalf("a staged load during a passthrough load got mode %d, want direct", got)
	}
	if got := m.acquire(false, true); got != passthrough {
		t.Fatalf("a second store load got mode %d, want passthrough", got)
	}
}

// TestBufferedLoadsFromMemoryAreDirect checks that a buffered load of a
// staged block is served through FOPEN_DIRECT_IO (whole requests) rather
// than the kernel's page cache, and that it blocks no other mode.
func TestBufferedLoadsFromMemoryAreDirect(t *testing.T) {
	var m loadModes
	if got := m.acquire(true, false); got != direct {
		t.Fatalf("a buffered load from memory got mode %d, want direct", got)
	}
	if got := m.acquire(false, false); got != passthrough {
		t.Fatalf("a buffered store load beside it got mode %d, want passthrough", got)
	}
}
