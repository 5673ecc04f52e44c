package batch

import (
	"testing"
	"time"
)

// TestNoteStartsBatchesAtFirstLookupAndAfterGap: a key's first lookup and
// one after a pause longer than the gap start a batch with a zero state;
// lookups within the gap keep the state the caller left.
func TestNoteStartsBatchesAtFirstLookupAndAfterGap(t *testing.T) {
	c := New[uint32, int](0)
	state, started := c.Note(7, 0)
	if !started || *state != 0 {
		t.Fatalf("first lookup: started %v state %d, want a new batch with state 0", started, *state)
	}
	*state = 42
	state, started = c.Note(7, int64(Gap))
	if started || *state != 42 {
		t.Fatalf("lookup one gap later: started %v state %d, want the same batch with state 42", started, *state)
	}
	state, started = c.Note(7, 2*int64(Gap)+1)
	if !started || *state != 0 {
		t.Fatalf("lookup after a longer pause: started %v state %d, want a new batch with state 0", started, *state)
	}
	if state, started = c.Note(8, 2*int64(Gap)+1); !started || *state != 0 {
		t.Fatalf("another thread: started %v state %d, want its own new batch", started, *state)
	}
}

// TestNoteKnownCreatesNothing: NoteKnown follows a remembered key's batch
// and leaves unknown keys out of the table.
func TestNoteKnownCreatesNothing(t *testing.T) {
	c := New[string, int](time.Millisecond)
	if state, _ := c.NoteKnown("absent", 0); state != nil || c.Len() != 0 {
		t.Fatalf("NoteKnown of an unknown key returned %v and kept %d keys", state, c.Len())
	}
	state, _ := c.Note("a", 0)
	*state = 3
	if state, started := c.NoteKnown("a", int64(time.Millisecond)); state == nil || started || *state != 3 {
		t.Fatalf("NoteKnown within the gap lost the batch")
	}
	if state, started := c.NoteKnown("a", 3*int64(time.Millisecond)); state == nil || !started || *state != 0 {
		t.Fatalf("NoteKnown after the gap kept the old batch")
	}
}

// TestFloodIsBounded: a flood of new keys within one gap never grows the
// table past MaxCursors, and idle keys are forgotten before busy ones.
func TestFloodIsBounded(t *testing.T) {
	c := New[int, struct{}](0)
	for key := range 10 * MaxCursors {
		c.Note(key, 0)
		if c.Len() > MaxCursors {
			t.Fatalf("%d keys remembered, limit %d", c.Len(), MaxCursors)
		}
	}
	idle := New[int, int](0)
	for key := range MaxCursors {
		idle.Note(key, 0)
	}
	busy, _ := idle.Note(0, 2*int64(Gap))
	*busy = 9
	idle.Note(-1, 2*int64(Gap)) // full: the idle keys go, the busy one stays
	if idle.Len() != 2 {
		t.Fatalf("after pruning %d keys remembered, want the busy one and the new one", idle.Len())
	}
	if state, started := idle.Note(0, 2*int64(Gap)); started || *state != 9 {
		t.Fatalf("the busy key lost its batch to pruning")
	}
}

// TestDeleteFunc forgets exactly the keys chosen.
func TestDeleteFunc(t *testing.T) {
	c := New[int, int](0)
	for key := range 10 {
		c.Note(key, 0)
	}
	c.DeleteFunc(func(key int) bool { return key%2 == 0 })
	if c.Len() != 5 {
		t.Fatalf("%d keys left, want 5", c.Len())
	}
	if _, started := c.Note(1, 0); started {
		t.Fatal("a kept key lost its batch")
	}
	if _, started := c.Note(2, 0); !started {
		t.Fatal("a deleted key kept its batch")
	}
}
