package staging

import (
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/kvtierfs/kvtierfs/tiers/batch"
	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// Wave staging (issue 4, DESIGN §3 failure 3): lookups never stage; a read
// of a block whose successors are known stages the next wave of them into
// RAM so the engine's next loads are served from memory.
//
// Chains. The engine looks a request's keys up in prefix order, one batch
// per request per scheduler step, from one thread; it stores a request's
// chunks together. The Stager learns, per tier and KV group, a successor
// link between consecutive present keys of a lookup batch (a batch is the
// run of one thread's lookups; a pause longer than Options.BatchGap, or a
// key the batch already listed, starts a new one; an absent key breaks the
// link) and, weaker, between consecutive stores. Links learnt from lookups
// win over links learnt from stores; the latest lookup wins over older ones.
//
// Waves. A read (Take) of a known key walks its successors and
// queues fetches of the present ones, up to Options.WaveBlocks blocks ahead,
// skipping those already staged, in flight or read in the current pass.
// Options.QueueDepth workers run the fetches through the caller's Fetch.
// Every Take tops the wave up from the block taken.
//
// Budget. Staged bytes plus reservations of queued and in-flight fetches
// never exceed Options.Budget. A chain may hold at most budget / active
// chains (those holding staged or in-flight bytes, counting the one asking):
// a chain under its share that finds the budget full evicts the farthest
// staged blocks of chains over theirs. A fetch reserves its chain's block
// size, learnt from the chain's latest fetch (before that, from any
// chain's); the very first fetch, of unknown size, runs alone and is
// checked against the budget when it arrives.
//
// Correctness. Staged bytes are only those Fetch returned (the caller
// verifies them). Every staged or queued block is an entry of its own;
// Invalidate, NoteStore and an absent lookup drop the entry, so a fetch that
// completes afterwards finds its entry gone and is discarded, and a dropped
// entry's bytes are never served.
//
// Memory. Staged bytes are held by their entry, in the Stager's own map: the
// budget above decides what is staged and which block goes first (the
// farthest ahead of a chain over its share), which a general cache's
// admission and eviction policies cannot express, and a cache limit set
// high enough never to overrule it would only duplicate the accounting.

// Fetch reads the block key from the store, verifies it (checksum) and
// returns its bytes. The Stager keeps and serves the returned slice as is,
// so it must not be modified afterwards. Fetch is called from the Stager's
// worker goroutines, at most Options.QueueDepth at a time.
type Fetch func(key block.Ref) ([]byte, error)

// Options configure a Stager. Zero fields but Budget take the defaults.
type Options struct {
	// Budget is the most bytes staging holds at once: staged blocks plus
	// fetches queued or in flight. It must be positive: staging that is off
	// has no Stager. DefaultBudget is the mount's default.
	Budget int64
	// QueueDepth is the most reads from the store in flight at once: the
	// Stager's fetches plus the engine's loads that read the store
	// themselves (StoreLoadStarted), so staging adds depth where the engine
	// leaves the disk idle and never competes with its loads for it.
	// Default DefaultQueueDepth.
	QueueDepth int
	// IdleQueueDepth is the most fetches in flight while the engine opens
	// no load: it computes between waves, the disk is staging's, and the
	// next wave should be staged before the engine asks for it. Default
	// IdleDepthFactor × QueueDepth.
	IdleQueueDepth int
	// WaveBlocks is how many blocks of a chain are kept staged or in flight
	// ahead of the engine's latest read. Default DefaultWaveBlocks.
	WaveBlocks int
	// BatchGap separates lookup batches of one thread, and groups stores of a
	// chain: events further apart are not linked. Default DefaultBatchGap.
	BatchGap time.Duration
	// MaxKeys bounds the keys remembered for chain learning; when reached,
	// every learnt link is forgotten and learning starts over. Default
	// DefaultMaxKeys.
	MaxKeys int
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// Option defaults.
const (
	// DefaultQueueDepth is the default number of store reads in flight that
	// staging fills. Measured on a saturated disk, more fetches beside the
	// engine's 16 load threads only took CPU and disk time from its loads,
	// while 4 let an engine with one or two load threads stream from memory.
	DefaultQueueDepth = 4
	// IdleDepthFactor sets the default IdleQueueDepth: 16 fetches beside
	// the default 4, as many as the engine's own load threads.
	IdleDepthFactor = 4
	// DefaultWaveBlocks is the default number of blocks staged ahead of a read.
	DefaultWaveBlocks = 32
	// DefaultBatchGap is the default pause that ends a lookup batch, the one
	// the disk tier's prefixes use.
	DefaultBatchGap = batch.Gap
	// DefaultMaxKeys is the default bound on remembered keys (about 50 MB).
	DefaultMaxKeys = 1 << 18
)

// Bounds on what lookups teach the Stager, so that no flood of lookups or
// match requests grows it without limit (DESIGN "Threat model").
const (
	// maxChains bounds the (tier, group) chains.
	maxChains = 4096
)

// Stager stages the blocks that follow a read into RAM (see the comment at
// the top of this file). Its methods are safe for concurrent use.
//
// Lock discipline: mu guards every field below it. mu is never held while
// calling Fetch. An entry's done channel is closed with mu held and waited
// on without it.
type Stager struct {
	fetch   Fetch
	opts    Options
	workers sync.WaitGroup

	mu       sync.Mutex
	work     *sync.Cond // signalled when the queue grows or the Stager closes
	settled  *sync.Cond // broadcast when pending drops to zero
	closed   bool
	chains   map[chainID]*chain
	cursors  *batch.Cursors[cursorID, cursor]
	keys     int                  // members over all chains
	entries  map[block.Ref]*entry // live entries: queued, fetching or staged
	queue    []*entry             // fetches to run, oldest first; dropped ones are skipped
	pending  int                  // entries queued or fetching, dropped fetches included until they return
	fetching int                  // fetches running now
	loading  int                  // the engine's loads reading the store now (StoreLoadStarted)
	// lastTake is when the engine last opened a load (Take); idleWake wakes
	// the workers once it has been idle for engineIdleAfter since.
	lastTake time.Time
	idleWake *time.Timer
	used     int64  // staged bytes plus reservations of queued and fetching entries
	peakUsed int64  // highest used so far
	staged   int64  // bytes of staged entries
	counters Stats  // Waves, Hits, Misses, Late and WastedBytes
	lastRun  uint64 // id of the newest lookup batch
	// chainUses numbers the uses of chains (present lookups, stores, reads):
	// chain.lastUsed orders them for forgetIdleChainsLocked.
	chainUses uint64
	// lastBlockBytes is the size of the latest block fetched, the reservation
	// of a chain's fetches until the chain has fetched a block of its own.
	lastBlockBytes int64
}

type entryState uint8

const (
	queued entryState = iota
	fetching
	staged
	dropped // out of entries: taken, invalidated, evicted, discarded or closed
)

// entry is one block in staging.
type entry struct {
	key   block.Ref
	chain *chain
	state entryState
	cost  int64         // bytes reserved (the chain's block size; 0 if unknown) until staged, then the block's size
	done  chan struct{} // closed when the entry stops fetching
	data  []byte        // the block's verified bytes while staged
}

// chain is the learnt order of one tier and group's keys and the staging
// state of their blocks.
type chain struct {
	members    map[block.Ref]*member
	held       int64     // used by this chain's entries
	ahead      []*entry  // this chain's live entries in the order they were queued
	blockBytes int64     // size of the chain's latest fetched block; 0 before the first
	reads      uint64    // reads of this chain so far
	passStart  uint64    // reads before the current pass over the chain began
	lastRead   block.Ref // the key read most recently
	lastStored block.Ref
	storedAt   time.Time
	lastUsed   uint64 // Stager.chainUses at the chain's latest use
}

// member is what is known of one key of a chain.
type member struct {
	next           block.Ref // successor in prefix order; zero if none learnt
	nextFromLookup bool      // next came from a lookup batch, which store order does not override
	present        bool      // the store holds the block, as last seen
	run            uint64    // the latest lookup batch that listed the key
	readSeq        uint64    // chain.reads just after the key's latest read; 0 if never read
}

type cursorID struct {
	thread uint32
	chain  chainID
}

// cursor is where one thread's current lookup batch is in one chain.
type cursor struct {
	run  uint64    // the batch's id; 0 until its first present key
	prev block.Ref // the batch's latest present key; zero after an absent one
}

// NewStager starts a Stager that fetches blocks with fetch. Call Close to
// stop its workers.
func NewStager(fetch Fetch, opts Options) (*Stager, error) {
	if fetch == nil {
		return nil, errors.New("staging: nil Fetch")
	}
	if opts.Budget < 0 || opts.QueueDepth < 0 || opts.IdleQueueDepth < 0 || opts.WaveBlocks < 0 || opts.BatchGap < 0 || opts.MaxKeys < 0 {
		return nil, errors.New("staging: negative option")
	}
	if opts.Budget == 0 {
		return nil, errors.New("staging: a budget of 0 bytes stages nothing; staging that is off has no Stager")
	}
	if opts.QueueDepth == 0 {
		opts.QueueDepth = DefaultQueueDepth
	}
	if opts.IdleQueueDepth == 0 {
		opts.IdleQueueDepth = IdleDepthFactor * opts.QueueDepth
	}
	opts.IdleQueueDepth = max(opts.IdleQueueDepth, opts.QueueDepth)
	if opts.WaveBlocks == 0 {
		opts.WaveBlocks = DefaultWaveBlocks
	}
	if opts.BatchGap == 0 {
		opts.BatchGap = DefaultBatchGap
	}
	if opts.MaxKeys == 0 {
		opts.MaxKeys = DefaultMaxKeys
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	s := &Stager{
		fetch:   fetch,
		opts:    opts,
		chains:  make(map[chainID]*chain),
		cursors: batch.New[cursorID, cursor](opts.BatchGap),
		entries: make(map[block.Ref]*entry),
	}
	s.work = sync.NewCond(&s.mu)
	s.settled = sync.NewCond(&s.mu)
	for range opts.IdleQueueDepth {
		s.workers.Go(s.worker)
	}
	return s, nil
}

// NoteLookup records the answer to the engine's lookup of key by thread
// (the FUSE caller's thread id, see disk.Store.Lookup): present keys looked up one after
// the other by a thread are linked in prefix order. An absent answer also
// drops any staged copy of key.
// A lookup never fetches anything.
func (s *Stager) NoteLookup(key block.Ref, thread uint32, present bool) {
	id := chainOf(key)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	now := s.opts.Now()
	if !present {
		// An absent key creates no state: a thread with no cursor yet starts
		// a new batch at its next present key anyway.
		if c := s.chains[id]; c != nil {
			if n := c.members[key]; n != nil {
				n.present = false
			}
		}
		if e := s.entries[key]; e != nil {
			s.dropLocked(e, true)
		}
		if cur, _ := s.cursors.NoteKnown(cursorID{thread: thread, chain: id}, now.UnixNano()); cur != nil {
			cur.prev = block.Ref{}
		}
		s.mu.Unlock()
		return
	}
	c := s.chainLocked(id)
	cur, _ := s.cursors.Note(cursorID{thread: thread, chain: id}, now.UnixNano())
	n := s.memberLocked(c, key)
	n.present = true
	if cur.run == 0 || n.run == cur.run { // a new batch, or listed again: the thread started over
		cur.run, cur.prev = s.newRunLocked(), block.Ref{}
	}
	n.run = cur.run
	if p := c.members[cur.prev]; p != nil && cur.prev != key {
		p.next, p.nextFromLookup = key, true
	}
	cur.prev = key
	s.mu.Unlock()
}

// NoteStore records that key was stored (its rename landed): the block is
// present with new bytes, so any staged or in-flight copy is dropped, and
// key is linked after the chain's previous store when that was within
// BatchGap and no lookup linked it already.
func (s *Stager) NoteStore(key block.Ref) {
	id := chainOf(key)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	if e := s.entries[key]; e != nil {
		s.dropLocked(e, true)
	}
	now := s.opts.Now()
	c := s.chainLocked(id)
	s.memberLocked(c, key).present = true
	if p := c.members[c.lastStored]; p != nil && c.lastStored != key && now.Sub(c.storedAt) <= s.opts.BatchGap && !p.nextFromLookup {
		p.next = key
	}
	c.lastStored, c.storedAt = key, now
	s.mu.Unlock()
}

// Take is the engine's load of key (call it when the block is opened for a
// load). If the block is staged, Take removes it from staging and returns
// its verified bytes, which the caller then owns; if a fetch of it is in
// flight, Take waits for that fetch first. Either way it stages the wave
// that follows key. It returns false when the block is not staged: the
// caller reads it from the store.
func (s *Stager) Take(key block.Ref) ([]byte, bool) {
	id := chainOf(key)
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return nil, false
		}
		e := s.entries[key]
		if e != nil && e.state == fetching {
			done := e.done
			s.mu.Unlock()
			<-done
			continue
		}
		var held []byte
		if e != nil {
			if e.state == staged {
				held = e.data
			}
			// A queued fetch is cancelled: the caller reads the block itself.
			s.dropLocked(e, false)
		}
		switch {
		case held != nil:
			s.counters.Hits++
		case e != nil:
			// Queued: the wave was foreseen, its fetch not started yet.
			s.counters.Misses++
			s.counters.Late++
		default:
			s.counters.Misses++
		}
		s.noteReadLocked(id, key)
		s.noteEngineBusyLocked()
		s.mu.Unlock()
		return held, held != nil
	}
}

// Invalidate drops any staged copy of key and discards any fetch of it in
// flight or queued, and marks it absent until a lookup or store says
// otherwise. Call it whenever the block is overwritten, removed, evicted or
// fails its checksum, before the operation is answered.
func (s *Stager) Invalidate(key block.Ref) {
	id := chainOf(key)
	s.mu.Lock()
	if c := s.chains[id]; c != nil {
		if n := c.members[key]; n != nil {
			n.present = false
		}
	}
	if e := s.entries[key]; e != nil {
		s.dropLocked(e, true)
	}
	s.mu.Unlock()
}

// StoreLoadStarted records a load of the engine that reads the store itself
// (not served from staging); call StoreLoadDone when its read is over.
// While such loads are in flight, staging starts only as many fetches as
// Options.QueueDepth leaves beside them.
func (s *Stager) StoreLoadStarted() {
	s.mu.Lock()
	s.loading++
	s.mu.Unlock()
}

// StoreLoadDone records the end of a load StoreLoadStarted recorded.
func (s *Stager) StoreLoadDone() {
	s.mu.Lock()
	s.loading--
	s.work.Signal()
	s.mu.Unlock()
}

// Stats is a snapshot of staging (the "staging" section of stats.json,
// fusefs/ctlabi.Staging, documents the fields).
type Stats struct {
	BudgetBytes int64
	Bytes       int64
	Chains      int
	Waves       int64
	Hits        int64
	Misses      int64
	Late        int64
	WastedBytes int64
}

// Stats returns a snapshot of the staging counters.
func (s *Stager) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.counters
	st.BudgetBytes = s.opts.Budget
	st.Bytes = s.staged
	for _, c := range s.chains {
		if c.held > 0 {
			st.Chains++
		}
	}
	return st
}

// Close drops everything staged (counted as wasted), discards queued and
// in-flight fetches and waits for the workers to return.
// Afterwards Take answers false and the Note methods do nothing.
func (s *Stager) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	if s.idleWake != nil {
		s.idleWake.Stop()
	}
	for _, e := range s.entries {
		s.dropLocked(e, true)
	}
	s.queue = nil
	s.work.Broadcast()
	s.mu.Unlock()
	s.workers.Wait()
}

// engineIdleAfter is how long after its latest load the engine counts as
// idle (computing between waves), so that fetches may fill the disk.
const engineIdleAfter = 20 * time.Millisecond

// noteEngineBusyLocked records a load of the engine and arms the wake-up of
// the workers for when it has been idle for engineIdleAfter.
func (s *Stager) noteEngineBusyLocked() {
	s.lastTake = time.Now()
	if s.idleWake == nil {
		s.idleWake = time.AfterFunc(engineIdleAfter, func() {
			s.mu.Lock()
			s.work.Broadcast()
			s.mu.Unlock()
		})
		return
	}
	s.idleWake.Reset(engineIdleAfter)
}

// depthFullLocked reports whether no more fetch may start now: fetches and
// the engine's loads that read the store share QueueDepth, and while the
// engine is idle (no load for engineIdleAfter; it computes between waves)
// fetches may run up to IdleQueueDepth.
func (s *Stager) depthFullLocked() bool {
	if s.loading > 0 || time.Since(s.lastTake) < engineIdleAfter {
		return s.fetching+s.loading >= s.opts.QueueDepth
	}
	return s.fetching >= s.opts.IdleQueueDepth
}

// worker runs queued fetches until Close.
func (s *Stager) worker() {
	for {
		s.mu.Lock()
		for (len(s.queue) == 0 || s.depthFullLocked()) && !s.closed {
			s.work.Wait()
		}
		if s.closed {
			s.mu.Unlock()
			return
		}
		e := s.queue[0]
		s.queue[0] = nil
		s.queue = s.queue[1:]
		if e.state != queued {
			s.mu.Unlock()
			continue
		}
		e.state = fetching
		s.fetching++
		s.mu.Unlock()
		data, err := s.fetch(e.key)
		s.complete(e, data, err)
	}
}

// complete stages the result of e's fetch, or discards it when e was
// dropped meanwhile, the fetch failed or the block does not fit the budget.
// A chain's first fetch (a probe, reserving nothing) teaches it its block
// size and then resumes the wave after the chain's latest read.
func (s *Stager) complete(e *entry, data []byte, err error) {
	probe := e.cost == 0
	s.mu.Lock()
	s.fetching--
	if err == nil && len(data) > 0 {
		e.chain.blockBytes = int64(len(data))
		s.lastBlockBytes = e.chain.blockBytes
	}
	if s.acceptLocked(e, data, err) {
		e.state, e.data = staged, data
		s.staged += e.cost
		close(e.done)
	}
	if probe && !s.closed && e.chain.lastRead != (block.Ref{}) {
		s.stageAfterLocked(e.chain, e.chain.lastRead)
	}
	s.finishPendingLocked()
	s.mu.Unlock()
}

// acceptLocked decides whether a fetched block may be staged and, if so,
// turns e's reservation into the block's real size.
func (s *Stager) acceptLocked(e *entry, data []byte, err error) bool {
	size := int64(len(data))
	switch {
	case e.state == dropped:
		s.abandonLocked(e, size)
		return false
	case err != nil:
		if n := e.chain.members[e.key]; n != nil {
			n.present = false
		}
		s.abandonLocked(e, 0)
		return false
	}
	if s.used-e.cost+size > s.opts.Budget {
		s.abandonLocked(e, size)
		return false
	}
	s.reserveLocked(e.chain, size-e.cost)
	e.cost = size
	return true
}

// abandonLocked gives back the reservation of e, a fetching entry whose
// result will not be staged, and counts the fetched bytes as wasted.
func (s *Stager) abandonLocked(e *entry, fetched int64) {
	if e.state != dropped {
		s.dropLocked(e, false)
	}
	s.releaseLocked(e)
	s.counters.WastedBytes += fetched
}

// dropLocked removes e from staging. A queued entry gives its reservation
// back now; a fetching one is marked dropped, wakes its waiters and gives
// its reservation back when its fetch returns; a staged one gives its bytes
// back (counted as wasted if wasted is set).
func (s *Stager) dropLocked(e *entry, wasted bool) {
	if s.entries[e.key] == e {
		delete(s.entries, e.key)
	}
	if i := slices.Index(e.chain.ahead, e); i >= 0 {
		e.chain.ahead = slices.Delete(e.chain.ahead, i, i+1)
	}
	was := e.state
	e.state = dropped
	switch was {
	case queued:
		s.releaseLocked(e)
		s.finishPendingLocked()
	case fetching:
		close(e.done)
	case staged:
		s.releaseLocked(e)
		s.staged -= e.cost
		e.data = nil
		if wasted {
			s.counters.WastedBytes += e.cost
		}
	}
}

func (s *Stager) reserveLocked(c *chain, bytes int64) {
	s.used += bytes
	c.held += bytes
	s.peakUsed = max(s.peakUsed, s.used)
}

func (s *Stager) releaseLocked(e *entry) {
	s.used -= e.cost
	e.chain.held -= e.cost
}

func (s *Stager) finishPendingLocked() {
	s.pending--
	if s.pending == 0 {
		s.settled.Broadcast()
	}
}
