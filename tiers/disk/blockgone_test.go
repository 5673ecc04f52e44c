package disk

import (
	"testing"
	"time"
)

// TestListenersHearEveryEventInOrder: every listener hears every event, in
// the order the listeners were added: Published before Publish returns,
// Removed for a block the store evicted, Unlinked for one the engine
// removed; a block replaced by a rename over its name is Published again,
// never Removed.
func TestListenersHearEveryEventInOrder(t *testing.T) {
	s, clock, removed := evictStore(t, 2, Config{})
	type heard struct {
		listener int
		e        Event
	}
	events := make(chan heard, 1024)
	for i := range 2 {
		s.Listen(func(e Event) { events <- heard{i, e} })
	}
	// next takes the events told next, which may interleave (a removal is
	// told on the notifier goroutine, a publication on its own): each is
	// heard by listener 0, then by listener 1.
	next := func(want ...Event) {
		t.Helper()
		got := map[Event][]int{}
		for range 2 * len(want) {
			select {
			case h := <-events:
				got[h.e] = append(got[h.e], h.listener)
			case <-time.After(20 * time.Second): // liveness, not timing
				t.Fatalf("heard %v, want each of %+v heard by both listeners", got, want)
			}
		}
		for _, e := range want {
			if l := got[e]; len(l) != 2 || l[0] != 0 || l[1] != 1 {
				t.Fatalf("%+v heard by listeners %v, want 0 then 1 (all heard: %v)", e, l, got)
			}
		}
	}
	size := int64(len(pageData(0, 1)))
	put(t, s, 0)
	next(Event{Kind: Published, Rel: evName(0), Size: size})
	clock.Advance(time.Second)
	put(t, s, 1)
	next(Event{Kind: Published, Rel: evName(1), Size: size})
	clock.Advance(time.Second)
	// Block 1 replaced: Published again, not Removed; its tmp's write
	// makes room by evicting block 0.
	putBlock(t, s, evName(1), pageData(100, 1))
	next(Event{Kind: Published, Rel: evName(1), Size: size}, Event{Kind: Removed, Rel: evName(0)})
	if rel := removed.next(t); rel != evName(0) {
		t.Fatalf("Removed %s, want the evicted %s", rel, evName(0))
	}
	put(t, s, 2)
	next(Event{Kind: Published, Rel: evName(2), Size: size})

	if err := s.Remove(evName(2)); err != nil {
		t.Fatal(err)
	}
	next(Event{Kind: Unlinked, Rel: evName(2)})
	select {
	case h := <-events:
		t.Fatalf("unexpected event %+v", h.e)
	default:
	}
}
