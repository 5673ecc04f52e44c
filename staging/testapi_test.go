package staging

import "github.com/kvtierfs/kvtierfs/tiers/block"

// Stager methods only the tests need.

// NoteRead records that the engine loads key without taking staged bytes
// and stages the wave that follows it, as Take does (tests drive the wave
// with it without consuming staged blocks).
func (s *Stager) NoteRead(key block.Ref) {
	s.mu.Lock()
	if !s.closed {
		s.noteReadLocked(chainOf(key), key)
	}
	s.mu.Unlock()
}

// Settle waits until no fetch is queued or in flight: every fetch started
// so far has been staged, discarded or failed, so tests observe staging
// deterministically.
func (s *Stager) Settle() {
	s.mu.Lock()
	for s.pending > 0 {
		s.settled.Wait()
	}
	s.mu.Unlock()
}
