package disk

import (
	"fmt"
	"syscall"
)

// protectedLocked reports whether a block must not be evicted now: a load is
// in flight, or it answered a lookup within the protection window.
func (s *Store) protectedLocked(b *entry, now int64) bool {
	return b.readers > 0 || now-b.lastLookup < int64(s.cfg.LookupProtect+s.cfg.LookupCacheTTL)
}

// pickVictimLocked chooses the block to evict: the least recently used
// unprotected one not in chosen, except that a prefix loses its tail before its head.
func (s *Store) pickVictimLocked(now int64, chosen map[*entry]bool) *entry {
	for e := s.lru.Back(); e != nil; e = e.Prev() {
		b := e.Value.(*entry)
		if chosen[b] || s.protectedLocked(b, now) {
			continue
		}
		if b.prefix != nil {
			if tail := s.prefixTailLocked(b.prefix, now, chosen); tail != nil {
				return tail
			}
		}
		return b
	}
	return nil
}

// prefixTailLocked is the last present, unprotected member of a prefix not in chosen.
func (s *Store) prefixTailLocked(c *prefix, now int64, chosen map[*entry]bool) *entry {
	for i := len(c.members) - 1; i >= 0; i-- {
		m := c.members[i]
		if m.present && m.prefix == c && !chosen[m] && !s.protectedLocked(m, now) {
			return m
		}
	}
	return nil
}

// makeRoomLocked evicts blocks until n more bytes fit, choosing every victim
// before evicting any: when the room cannot be made, nothing is evicted and
// the write fails with ENOSPC.
func (s *Store) makeRoomLocked(n int64, forRel string) error {
	limit := s.limitLocked()
	need := s.used + n - limit
	if need <= 0 {
		return nil
	}
	now := s.nowNano()
	chosen := make(map[*entry]bool)
	var victims []*entry
	for freed := int64(0); freed < need; {
		v := s.pickVictimLocked(now, chosen)
		if v == nil {
			var tmpBytes int64
			for _, t := range s.tmps {
				tmpBytes += t.allocated
			}
			filesystem := ""
			if limit < s.capacity {
				filesystem = fmt.Sprintf(" (the store filesystem is filling up from outside: %d bytes of the %d-byte capacity are left to blocks; free space there, df)", limit, s.capacity)
			}
			return newError("write", forRel, syscall.ENOSPC,
				"store full: %d bytes used of %d%s: %d by %d tmp files not yet renamed (one whose writer closed it is removed %s later), the rest by blocks that are all protected (read in flight or looked up in the last %s)",
				s.used, limit, filesystem, tmpBytes, len(s.tmps), s.cfg.TmpMaxAge, s.cfg.LookupProtect)
		}
		chosen[v] = true
		victims = append(victims, v)
		freed += v.physical
	}
	for _, v := range victims {
		s.evictLocked(v)
	}
	return nil
}

// evictLocked removes a block to make room.
func (s *Store) evictLocked(b *entry) {
	s.dropLocked(b)
	if err := s.removeFile(b.rel); err != nil {
		s.cfg.Logger.Error("evicting block", "path", s.Path(b.rel), "err", err)
	}
	s.counters.Evictions.Add(1)
	s.cfg.Logger.Debug("evicted block", "path", b.rel)
	s.queueRemoval(b.rel)
}

// extendPrefixLocked appends a looked-up block to the prefix of its thread. A
// thread that pauses, or comes back to a key it already listed, starts a new
// prefix: the engine looks a request's keys up again from the start every step.
func (s *Store) extendPrefixLocked(b *entry, thread uint32, now int64) {
	current, _ := s.lookups.Note(thread, now)
	if *current == nil || b.prefix == *current {
		*current = &prefix{}
	}
	(*current).members = append((*current).members, b)
	b.prefix = *current
}

// replaceInPrefixLocked puts a republished block in its predecessor's prefix slot.
func (s *Store) replaceInPrefixLocked(old, b *entry) {
	if old.prefix == nil {
		return
	}
	for i, m := range old.prefix.members {
		if m == old {
			old.prefix.members[i] = b
		}
	}
}
