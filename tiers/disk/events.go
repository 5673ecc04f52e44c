package disk

// EventKind is what happened to a block (Event).
type EventKind int

// The events of a block's life the store tells its listeners.
const (
	// Published: the engine published the block through the mount
	// (Publish); Size is its size.
	Published EventKind = iota
	// Imported: Import published the block, whose bytes came from
	// elsewhere (the shared level).
	Imported
	// Removed: the store removed the block by itself (eviction, a failed
	// check or proof, its file gone from the store directory).
	Removed
	// Unlinked: the engine unlinked the block through the mount (Remove).
	Unlinked
)

// Event is a change to the blocks the store holds. A block replaced by a
// rename over its name is Published again, never Removed.
type Event struct {
	Kind EventKind
	Rel  string
	// Size is a Published block's size.
	Size int64
}

// Listen adds a listener of the store's block events. The delivery rule:
// every listener hears every event, one call at a time, in the order the
// listeners were added. Published and Imported are told on the goroutine
// that published, after the rename and before Publish or Import returns;
// Removed and Unlinked are told later, on the store's one notifier
// goroutine, in the order the blocks left (the store's lock is never held
// while a listener runs). A listener must not block, and ignores the kinds
// it does not need.
func (s *Store) Listen(fn func(Event)) {
	s.listenMu.Lock()
	defer s.listenMu.Unlock()
	s.listeners = append(s.listeners[:len(s.listeners):len(s.listeners)], fn)
}

// tell delivers an event to every listener, in order.
func (s *Store) tell(e Event) {
	s.listenMu.Lock()
	listeners := s.listeners
	s.listenMu.Unlock()
	for _, fn := range listeners {
		fn(e)
	}
}
