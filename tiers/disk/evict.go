package disk

// protectedLocked reports whether a block must not be evicted now: a load is
// in flight, or it answered a lookup within the protection window.
func (s *Store) protectedLocked(b *block, now int64) bool {
	return b.readers > 0 || now-b.lastLookup < int64(s.cfg.LookupProtect+s.cfg.LookupCacheTTL)
}

// pickVictimLocked chooses the block to evict: the least recently used
// unprotected one, except that a chain loses its tail before its head.
func (s *Store) pickVictimLocked(now int64) *block {
	for e := s.lru.Back(); e != nil; e = e.Prev() {
		b := e.Value.(*block)
		if s.protectedLocked(b, now) {
			continue
		}
		if b.chain != nil {
			if tail := s.chainTailLocked(b.chain, now); tail != nil {
				return tail
			}
		}
		return b
	}
	return nil
}

// chainTailLocked is the last present, unprotected member of a chain.
func (s *Store) chainTailLocked(c *chain, now int64) *block {
	for i := len(c.members) - 1; i >= 0; i-- {
		m := c.members[i]
		if m.present && m.chain == c && !s.protectedLocked(m, now) {
			return m
		}
	}
	return nil
}

// evictLocked removes a block to make room.
func (s *Store) evictLocked(b *block) {
	s.dropLocked(b)
	if err := s.removeFile(b.rel); err != nil {
		s.cfg.Logger.Error("evicting block", "path", s.Path(b.rel), "err", err)
	}
	s.counters.Evictions.Add(1)
	s.cfg.Logger.Debug("evicted block", "path", b.rel)
	s.queueRemoval(b.rel)
}

// extendChainLocked appends a looked-up block to the chain of its thread. A
// thread that pauses, or comes back to a key it already listed, starts a new
// chain: the engine looks a request's keys up again from the start every step.
func (s *Store) extendChainLocked(b *block, stream uint32, now int64) {
	st := s.streams[stream]
	if st == nil {
		s.pruneStreamsLocked(now)
		st = &lookupStream{}
		s.streams[stream] = st
	}
	if st.chain == nil || now-st.lastAt > int64(chainGap) || b.chain == st.chain {
		st.chain = &chain{}
	}
	st.lastAt = now
	st.chain.members = append(st.chain.members, b)
	b.chain = st.chain
}

// maxStreams bounds the lookup threads remembered before idle ones are forgotten.
const maxStreams = 1024

// pruneStreamsLocked forgets threads that have not looked anything up for a while.
func (s *Store) pruneStreamsLocked(now int64) {
	if len(s.streams) < maxStreams {
		return
	}
	for id, st := range s.streams {
		if now-st.lastAt > int64(chainGap) {
			delete(s.streams, id)
		}
	}
}
