package staging

import (
	"cmp"
	"slices"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// Chain learning and wave scheduling of the Stager. Every function here is
// called with Stager.mu held.

// chainLocked returns the chain of id, creating it. When maxChains are
// kept, the chains holding nothing staged or in flight are forgotten first,
// with what they learnt.
func (s *Stager) chainLocked(id chainID) *chain {
	c := s.chains[id]
	if c == nil {
		if len(s.chains) >= maxChains {
			s.forgetIdleChainsLocked()
		}
		c = &chain{members: make(map[block.Ref]*member)}
		s.chains[id] = c
	}
	s.touchLocked(c)
	return c
}

// touchLocked marks c as the most recently used chain.
func (s *Stager) touchLocked(c *chain) {
	s.chainUses++
	c.lastUsed = s.chainUses
}

// forgetIdleChainsLocked drops the chains that hold no entry, and their
// cursors: at least a quarter of maxChains when that many are idle, the
// least recently read or stored first, so a chain in use outlives a flood
// of new ones.
func (s *Stager) forgetIdleChainsLocked() {
	type idle struct {
		id   chainID
		last uint64
	}
	var candidates []idle
	for id, c := range s.chains {
		if len(c.ahead) == 0 && c.held == 0 {
			candidates = append(candidates, idle{id, c.lastUsed})
		}
	}
	slices.SortFunc(candidates, func(a, b idle) int { return cmp.Compare(a.last, b.last) })
	for _, cand := range candidates[:min(len(candidates), max(maxChains/4, len(s.chains)-maxChains+1))] {
		s.keys -= len(s.chains[cand.id].members)
		delete(s.chains, cand.id)
	}
	s.cursors.DeleteFunc(func(id cursorID) bool { return s.chains[id.chain] == nil })
}

// memberLocked returns key's member in c, creating it. When the Stager already
// remembers MaxKeys keys, every chain's links are forgotten first.
func (s *Stager) memberLocked(c *chain, key block.Ref) *member {
	if n := c.members[key]; n != nil {
		return n
	}
	if s.keys >= s.opts.MaxKeys {
		for _, other := range s.chains {
			clear(other.members)
			other.lastStored = block.Ref{}
		}
		s.keys = 0
	}
	n := &member{}
	c.members[key] = n
	s.keys++
	return n
}

// newRunLocked returns the id of a new lookup batch; ids start at 1, so a
// member never listed (run 0) is in no batch.
func (s *Stager) newRunLocked() uint64 {
	s.lastRun++
	return s.lastRun
}

// walkLimit bounds a wave's walk to walkLimit × WaveBlocks links.
const walkLimit = 4

// readInPass reports whether n was read in the current pass over c: such a
// key is not staged again until a new pass starts.
func (c *chain) readInPass(n *member) bool {
	return n.readSeq > c.passStart
}

// noteReadLocked records a read of key and stages the wave after it. Reading
// a key again within its pass starts a new pass over the chain (the engine
// loads the prefix again, for another request).
func (s *Stager) noteReadLocked(id chainID, key block.Ref) {
	c := s.chains[id]
	if c == nil {
		return
	}
	n := c.members[key]
	if n == nil {
		return
	}
	if c.readInPass(n) {
		c.passStart = c.reads
	}
	s.touchLocked(c)
	c.reads++
	n.readSeq = c.reads
	c.lastRead = key
	s.stageAfterLocked(c, key)
}

// stageAfterLocked follows c's links from key and queues fetches of the
// present blocks not yet staged, in flight or read in this pass, until
// WaveBlocks blocks after key are staged or in flight, admission refuses, or
// the links end. At most walkLimit × WaveBlocks links are followed, which
// also ends a walk caught in a cycle of links.
func (s *Stager) stageAfterLocked(c *chain, key block.Ref) {
	startsWave := len(c.ahead) == 0
	queuedAny := false
	ahead := 0
	n := c.members[key]
	for steps := 0; n != nil && ahead < s.opts.WaveBlocks && steps < walkLimit*s.opts.WaveBlocks; steps++ {
		key = n.next
		if n = c.members[key]; n == nil {
			break
		}
		if !n.present || c.readInPass(n) {
			continue
		}
		if s.entries[key] != nil {
			ahead++
			continue
		}
		reservation, ok := s.admitLocked(c)
		if !ok {
			break
		}
		s.enqueueLocked(c, key, reservation)
		queuedAny = true
		ahead++
	}
	if startsWave && queuedAny {
		s.counters.Waves++
	}
}

// admitLocked decides whether c may queue one more fetch and returns the
// bytes to reserve for it: c's block size, else the latest block size of
// any chain, else 0 for a probe, which may only be c's only fetch queued or
// in flight and whose size the budget checks on arrival. A chain may hold up to
// its fair share, budget / active chains; under it, a chain that finds the
// budget full evicts staged blocks of chains over their share.
func (s *Stager) admitLocked(c *chain) (int64, bool) {
	size := c.blockBytes
	if size == 0 {
		size = s.lastBlockBytes
	}
	if size == 0 {
		return 0, len(c.ahead) == 0
	}
	active := 0
	for _, other := range s.chains {
		if other.held > 0 || other == c {
			active++
		}
	}
	share := s.opts.Budget / int64(active)
	if c.held+size > share {
		return 0, false
	}
	if over := s.used + size - s.opts.Budget; over > 0 {
		s.reclaimLocked(over, share)
	}
	return size, s.used+size <= s.opts.Budget
}

// reclaimLocked evicts staged blocks, counted as wasted, until need bytes
// are freed or no chain holding more than share has a staged block left:
// each time the farthest-ahead staged block of the chain most over its share.
func (s *Stager) reclaimLocked(need, share int64) {
	for need > 0 {
		var victim *entry
		var excess int64
		for _, c := range s.chains {
			if c.held-share <= excess {
				continue
			}
			for i := len(c.ahead) - 1; i >= 0; i-- {
				if c.ahead[i].state == staged {
					victim, excess = c.ahead[i], c.held-share
					break
				}
			}
		}
		if victim == nil {
			return
		}
		need -= victim.cost
		s.dropLocked(victim, true)
	}
}

// enqueueLocked queues a fetch of key for c, reserving reservation bytes.
func (s *Stager) enqueueLocked(c *chain, key block.Ref, reservation int64) {
	e := &entry{key: key, chain: c, state: queued, cost: reservation, done: make(chan struct{})}
	s.entries[key] = e
	c.ahead = append(c.ahead, e)
	s.queue = append(s.queue, e)
	s.reserveLocked(c, reservation)
	s.pending++
	s.work.Signal()
}
