// Package lookupbudget decides which present blocks a lookup may answer
// present, so that an engine whose lookup promotes every key it confirms
// (stock vLLM: one primary-tier row per key found on disk, issue 23) is
// never told of more keys than its primary tier can promote at once. It
// needs neither FUSE nor I/O; fusefs asks it for every block lookup.
//
// # The rule
//
// A batch is the run of one thread's block lookups of one tier: vLLM's
// fs-tier lookup thread looks one request's keys up per step, the
// full-attention group in prefix order, then each window group from the
// end (DESIGN.md "The lookup budget"). A pause longer than Options.Gap, a
// lookup of another tier, of a group the batch already left, or of a prefix
// key the batch already has, starts a new batch.
//
// The first group of a batch is its prefix group. Each of its present keys
// answers present while a row is left for it: rows of the primary region,
// minus the rows promised to keys the same thread answered present and that
// are not loaded yet (the batches of the requests looked up at once share
// the rows), minus a reserve of Options.WindowRows rows for every other group
// the tier has. The first key without a row caps the batch: it and every
// later key of the prefix group answer absent. A key the store lacks ends
// a prefix that has begun (the engine's walk stops at its first miss).
//
// Other groups answer present for the WindowRows chunks just before the
// prefix's end (the window the engine's scan from the end finds first, one
// chunk more for an unverified EAGLE group) while rows are left, and for
// other chunks only while the batch is not capped and rows are left beyond
// a window's (an engine that walks a window group from its start takes a
// row for every key it confirms). So vLLM's walk returns the cap's chunks
// instead of 0 or parking, and a prefix that fits is answered exactly as
// without the budget.
//
// An answer holds for Options.Gap after the key's latest lookup, within the
// batch it was given in (an engine that asks again within a request gets
// the same answer; an absent prefix key ends the prefix). Any other batch
// decides afresh and takes a row of its own: the same thread's next
// request, or another thread's lookup (a load's lookup of a promised key
// finds a row, the promise passing to it; a store's check of a block
// already on disk never lifts the lookup thread's cap). A promise ends when its block is
// loaded, Options.Gap after the latest load of its batch (the engine
// promotes a step's hits together; the window keys it did not need are
// never loaded), when its thread starts a batch after the promise's batch
// had a load or began more than Options.Gap/10 before (that request is past
// its lookups), or after Options.PromiseTTL. A thread that creates a block
// tmp file or opens a block for a load is one of the engine's I/O threads,
// not its lookup thread (vLLM's lookups only ask faccessat or stat): its
// lookups check what it is about to write or read, so they answer as the
// store says (a present one puts the block in the estimate of the engine's
// rows), and its promises end.
//
// The engine's walk does not look up what its rows hold. The budget keeps
// an estimate of those rows (the latest blocks loaded, stored or checked by
// an I/O thread) and charges a batch for the resident chunks it skips, and
// for their keys of the other groups, along the links of its chains that
// batches taught: consecutive prefix keys, and consecutive keys of a window
// group scanned from the end, which asks the chunks the prefix skipped
// (DESIGN.md "The lookup budget").
//
// A tier whose engine matches through .kvtier/match loads in waves: it is
// exempt. Every other tier's present entries must reach Answer at every
// lookup (MustAsk).
package lookupbudget

import (
	"container/list"
	"sync"
	"time"
)

// Key names one block: its tier directory, KV group and chunk hash.
type Key struct {
	Tier  string
	Group int
	Hash  string
}

// Options configure a Budget; zero fields take the defaults.
type Options struct {
	// WindowRows is the rows reserved for each group of a tier other than
	// its prefix group. Default DefaultWindowRows.
	WindowRows int
	// Gap ends a batch and a key's answer. Default DefaultGap.
	Gap time.Duration
	// PromiseTTL is how long a key answered present holds its row unloaded.
	// Default DefaultPromiseTTL.
	PromiseTTL time.Duration
	// MaxKeys bounds the answers and promises remembered; past it they are
	// all forgotten. Default DefaultMaxKeys.
	MaxKeys int
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// Defaults.
const (
	// DefaultWindowRows covers a sliding window of up to 3 chunks plus
	// EAGLE's extra chunk, or a window of 4.
	DefaultWindowRows = 4
	// DefaultGap is the pause that ends a batch (staging's batch gap).
	DefaultGap = time.Second
	// DefaultPromiseTTL is how long an unloaded present answer holds a row:
	// the engine promotes what a step's lookup found within a step or two,
	// and a request whose walk gave up must not hold rows from the next.
	DefaultPromiseTTL = time.Second
	// DefaultMaxKeys bounds the remembered keys.
	DefaultMaxKeys = 1 << 18
	// maxThreads bounds the threads with a batch.
	maxThreads = 1024
)

// Stats describe what the budget did since the mount.
type Stats struct {
	// Rows is the primary region's row count the budget works with (0:
	// unknown, nothing is withheld).
	Rows int `json:"rows"`
	// WindowRows is the rows reserved per window group.
	WindowRows int `json:"window_rows"`
	// ChainsCapped counts batches whose prefix was cut at the budget;
	// KeysWithheld the present keys answered absent because of it.
	ChainsCapped int64 `json:"chains_capped"`
	KeysWithheld int64 `json:"keys_withheld"`
	// LastCap is the prefix chunks the latest capped batch answered present.
	LastCap int `json:"last_cap"`
	// Promised is the rows promised now to keys not loaded yet.
	Promised int `json:"promised"`
}

// Budget applies the rule (see the package doc). Safe for concurrent use.
type Budget struct {
	opts Options

	mu       sync.Mutex
	rows     int
	present  map[Key]answer       // latest present answer per key
	withheld map[threadKey]answer // latest absent answer per key and thread
	promises map[Key]promise
	promised map[uint32]int // promises per thread
	batches  map[uint32]*batch
	io       map[uint32]bool         // the engine's I/O threads (NoteIOThread)
	groups   map[string]map[int]bool // groups seen per tier
	exempt   map[string]bool
	// prev links a key to the one before it in its chain, from a batch's
	// consecutive prefix keys.
	prev map[Key]Key
	// resident estimates the blocks the engine's primary rows hold: the
	// latest rows' worth of blocks loaded or stored, most recent last.
	resident      *list.List
	residentEntry map[Key]*list.Element
	// lookedUp is the keys the lookup thread looked up since the engine
	// last stored or loaded them: its rows lack them.
	lookedUp  map[Key]bool
	lastSweep time.Time
	stats     Stats
}

// answer is when a key was last answered, and in which batch.
type answer struct {
	at    time.Time
	batch *batch
}

// threadKey is a key as one thread was answered it.
type threadKey struct {
	key    Key
	thread uint32
}

type promise struct {
	at     time.Time
	batch  *batch
	thread uint32
}

// batch is one thread's run of lookups of one tier.
type batch struct {
	tier         string
	began, at    time.Time
	groups       []int // in the order the batch reached them
	positions    map[string]int
	prefixLen    int // prefix keys answered present or found resident before them
	held         int // rows of resident prefix keys the engine did not look up
	last         Key // the latest prefix key looked up
	hasLast      bool
	endHash      string // the hash of the latest prefix key asked, answered or not
	scan         scanState
	scanLastHash string // the window group's latest key in a scan from the end, by hash
	counted      map[Key]bool
	ended        bool // the prefix ended: a miss or the cap
	capped       bool
	loadedAt     time.Time // latest load of a key the batch answered present
}

// New returns a budget with no rows known yet.
func New(opts Options) *Budget {
	if opts.WindowRows <= 0 {
		opts.WindowRows = DefaultWindowRows
	}
	if opts.Gap <= 0 {
		opts.Gap = DefaultGap
	}
	if opts.PromiseTTL <= 0 {
		opts.PromiseTTL = DefaultPromiseTTL
	}
	if opts.MaxKeys <= 0 {
		opts.MaxKeys = DefaultMaxKeys
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Budget{
		opts:          opts,
		present:       map[Key]answer{},
		withheld:      map[threadKey]answer{},
		promises:      map[Key]promise{},
		promised:      map[uint32]int{},
		batches:       map[uint32]*batch{},
		io:            map[uint32]bool{},
		groups:        map[string]map[int]bool{},
		exempt:        map[string]bool{},
		prev:          map[Key]Key{},
		resident:      list.New(),
		residentEntry: map[Key]*list.Element{},
		lookedUp:      map[Key]bool{},
	}
}

// SetRows sets the primary region's row count; 0 withholds nothing.
func (b *Budget) SetRows(rows int) {
	b.mu.Lock()
	b.rows = rows
	b.mu.Unlock()
}

// Rows is the row count SetRows set last.
func (b *Budget) Rows() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.rows
}

// NoteGroup records that tier has group (the store holds its blocks).
func (b *Budget) NoteGroup(tier string, group int) {
	b.mu.Lock()
	b.noteGroupLocked(tier, group)
	b.mu.Unlock()
}

func (b *Budget) noteGroupLocked(tier string, group int) {
	g := b.groups[tier]
	if g == nil {
		if len(b.groups) >= maxThreads*4 {
			clear(b.groups)
		}
		g = map[int]bool{}
		b.groups[tier] = g
	}
	g[group] = true
}

// Exempt turns the budget off for tier: its engine matches without staging
// (.kvtier/match) and loads the hit in waves.
func (b *Budget) Exempt(tier string) {
	b.mu.Lock()
	if len(b.exempt) >= maxThreads*4 {
		clear(b.exempt)
	}
	b.exempt[tier] = true
	b.mu.Unlock()
}

// MustAsk reports whether every lookup of a present block of tier must
// reach Answer: the kernel may cache no such entry (a cached one answers a
// later request's lookup, which then takes a row the budget never counted;
// the entry cache is per block, not per thread, so a load's lookup would
// answer the lookup thread's). Withheld blocks are never cached either (the
// next request asks again). Only an exempt tier's entries may be cached;
// a tier with no rows known yet is not exempt, as rows come with the
// engine's first store.
func (b *Budget) MustAsk(tier string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return !b.exempt[tier]
}

// Answer returns what the lookup of key by thread answers, the store
// holding it (present) or not.
func (b *Budget) Answer(key Key, thread uint32, present bool) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.io[thread] && present && b.rows > 0 {
		// A check before a store or a load: the engine's row holds the
		// block (a store skipped as the block is on disk) or is about to.
		b.residentLocked(key)
	}
	if b.rows <= 0 || b.exempt[key.Tier] || b.io[thread] {
		return present
	}
	now := b.opts.Now()
	b.sweepLocked(now)
	// The engine looks up only what its rows lack.
	if e := b.residentEntry[key]; e != nil {
		b.resident.Remove(e)
		delete(b.residentEntry, key)
	}
	if len(b.lookedUp) >= b.opts.MaxKeys {
		clear(b.lookedUp)
	}
	b.lookedUp[key] = true
	bt := b.batchLocked(key, thread, now)
	b.learnScanLocked(bt, key)
	if !present {
		if key.Group == bt.groups[0] && bt.prefixLen > 0 {
			bt.ended = true
		}
		return false
	}
	b.noteGroupLocked(key.Tier, key.Group)
	if key.Group == bt.groups[0] && !bt.ended {
		b.countSkippedLocked(bt, key)
	}
	tk := threadKey{key: key, thread: thread}
	// An absent answer holds for the batch it was given in, and ends its
	// prefix; the thread's next batch (its next request) decides afresh.
	if w, ok := b.withheld[tk]; ok && w.batch == bt && now.Sub(w.at) <= b.opts.Gap {
		w.at = now
		b.withheld[tk] = w
		if key.Group == bt.groups[0] {
			bt.ended = true
		}
		return false
	}
	// A present answer holds for the batch it was given in. Any other batch
	// decides afresh and takes a row of its own: the same thread's next
	// request, or another thread (a load's lookup of a promised key gets
	// its row, the promise passing to it; a store's check of a block on disk
	// does not lift the lookup thread's cap).
	if a, ok := b.present[key]; ok && now.Sub(a.at) <= b.opts.Gap && a.batch == bt {
		a.at = now
		b.present[key] = a
		return true
	}
	if len(b.present)+len(b.withheld) >= b.opts.MaxKeys {
		clear(b.present)
		clear(b.withheld)
	}
	if !b.decideLocked(key, bt, thread, now) {
		b.withheld[tk] = answer{at: now, batch: bt}
		b.stats.KeysWithheld++
		return false
	}
	b.present[key] = answer{at: now, batch: bt}
	return true
}

// decideLocked applies the rule to a present key not answered lately.
func (b *Budget) decideLocked(key Key, bt *batch, thread uint32, now time.Time) bool {
	if key.Group == bt.groups[0] {
		if bt.ended {
			return false
		}
		reserve := b.opts.WindowRows * (len(b.groups[key.Tier]) - 1)
		if b.rows-b.promised[thread]-bt.held-reserve <= 0 {
			bt.ended = true
			if !bt.capped {
				bt.capped = true
				b.stats.ChainsCapped++
				b.stats.LastCap = bt.prefixLen
			}
			return false
		}
		b.promiseLocked(key, bt, thread, now)
		bt.positions[key.Hash] = bt.prefixLen
		bt.prefixLen++
		return true
	}
	used := b.promised[thread] + bt.held
	inWindow := b.inWindowLocked(key, bt)
	if inWindow && used < b.rows || !bt.capped && used+b.opts.WindowRows < b.rows {
		b.promiseLocked(key, bt, thread, now)
		return true
	}
	return false
}

// inWindowLocked reports whether key, of a group other than bt's prefix
// group, is one of the WindowRows chunks just before the batch's prefix end.
func (b *Budget) inWindowLocked(key Key, bt *batch) bool {
	pos, known := bt.positions[key.Hash]
	return known && pos >= bt.prefixLen-b.opts.WindowRows
}

func (b *Budget) promiseLocked(key Key, bt *batch, thread uint32, now time.Time) {
	if len(b.promises) >= b.opts.MaxKeys {
		clear(b.promises)
		clear(b.promised)
	}
	if p, ok := b.promises[key]; ok {
		b.dropPromiseLocked(key, p)
	}
	b.promises[key] = promise{at: now, batch: bt, thread: thread}
	b.promised[thread]++
}

// dropPromiseLocked ends key's promise.
func (b *Budget) dropPromiseLocked(key Key, p promise) {
	delete(b.promises, key)
	if b.promised[p.thread]--; b.promised[p.thread] <= 0 {
		delete(b.promised, p.thread)
	}
}

// scanState is where a batch is in learning links from a window group.
type scanState uint8

const (
	scanNone scanState = iota
	scanFromEnd
	scanOther
)

// learnScanLocked teaches links from a window group scanned from the end
// (vLLM main's _sliding_window_lookup): it asks the chain's chunks in
// reverse from the prefix's last one, and the engine's rows seldom hold a
// window group's blocks, so consecutive keys of that scan are consecutive
// chunks, also where the prefix group skipped chunks its rows held.
func (b *Budget) learnScanLocked(bt *batch, key Key) {
	if key.Group == bt.groups[0] {
		bt.endHash = key.Hash
		return
	}
	if key.Group != bt.groups[1] {
		bt.scan = scanOther
		return
	}
	switch bt.scan {
	case scanNone:
		bt.scan = scanOther
		if key.Hash == bt.endHash {
			bt.scan = scanFromEnd
		}
	case scanFromEnd:
		later := Key{Tier: key.Tier, Group: bt.groups[0], Hash: bt.scanLastHash}
		if len(b.prev) >= b.opts.MaxKeys {
			clear(b.prev)
		}
		b.prev[later] = Key{Tier: key.Tier, Group: bt.groups[0], Hash: key.Hash}
	}
	bt.scanLastHash = key.Hash
}

// countSkippedLocked counts the keys of key's chain just before it that the
// batch did not look up and the engine's rows hold (its walk found them
// there, or is promoting them): they take rows of the batch too. The walk
// back from key follows the links earlier batches taught and must end at
// the batch's previous prefix key, or at a chain's head for the batch's
// first one. A key the lookup thread looked up since its last store or
// load is not in the engine's rows and ends the walk; any other may be,
// whether or not the estimate of the engine's rows still has it (the
// estimate's latest rows' worth of blocks, of every chain and group,
// misses a long chain's older chunks). Key is then linked after the
// previous prefix key when nothing lies between.
func (b *Budget) countSkippedLocked(bt *batch, key Key) {
	var skipped []Key
	joined := false
	for k := key; len(skipped) < b.rows; {
		prev, ok := b.prev[k]
		switch {
		case !ok:
			joined = !bt.hasLast
		case bt.hasLast && prev == bt.last:
			joined = true
		case prev != key && !bt.counted[prev] && !b.lookedUp[prev]:
			k = prev
			skipped = append(skipped, k)
			continue
		}
		break
	}
	if !joined {
		skipped = nil
	}
	for i := len(skipped) - 1; i >= 0; i-- {
		k := skipped[i]
		bt.counted[k] = true
		bt.positions[k.Hash] = bt.prefixLen
		bt.prefixLen++
		bt.held++
		b.chargeResidentLocked(bt, k)
	}
	if bt.hasLast && len(skipped) == 0 {
		if len(b.prev) >= b.opts.MaxKeys {
			clear(b.prev)
		}
		b.prev[key] = bt.last
	}
	bt.last, bt.hasLast = key, true
}

// chargeResidentLocked charges the batch for the keys of a resident prefix
// chunk in the tier's other groups that the engine's rows hold: the stock
// walk finds them there and pins them, vLLM main's _touch makes them the
// most recently used, so the hit's promotions evict the request's own
// prefix chunks before them. A chunk whose prefix key the engine looks up
// is not charged: its rows lack the chunk (the blocks of a chunk are stored
// and promoted together), whatever the estimate says (it outlives an
// engine restart).
func (b *Budget) chargeResidentLocked(bt *batch, prefix Key) {
	for g := range b.groups[prefix.Tier] {
		k := Key{Tier: prefix.Tier, Group: g, Hash: prefix.Hash}
		if g != prefix.Group && !bt.counted[k] && b.residentEntry[k] != nil {
			bt.counted[k] = true
			bt.held++
		}
	}
}

// NoteStore records that the engine stored key (its rename landed): a row
// of the engine holds the block.
func (b *Budget) NoteStore(key Key) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.noteGroupLocked(key.Tier, key.Group)
	b.residentLocked(key)
}

// residentLocked notes that a row of the engine holds key now.
func (b *Budget) residentLocked(key Key) {
	delete(b.lookedUp, key)
	if e := b.residentEntry[key]; e != nil {
		b.resident.MoveToBack(e)
		return
	}
	b.residentEntry[key] = b.resident.PushBack(key)
	for b.resident.Len() > max(b.rows, 1) {
		delete(b.residentEntry, b.resident.Remove(b.resident.Front()).(Key))
	}
}

// batchLocked returns the batch key's lookup by thread belongs to, starting
// a new one where the rule says so.
func (b *Budget) batchLocked(key Key, thread uint32, now time.Time) *batch {
	bt := b.batches[thread]
	fresh := bt == nil || bt.tier != key.Tier || now.Sub(bt.at) > b.opts.Gap
	if !fresh && key.Group == bt.groups[0] {
		// A prefix key the batch already has: the thread started over.
		_, again := bt.positions[key.Hash]
		fresh = again || bt.counted[key]
	}
	if !fresh && bt.groups[len(bt.groups)-1] != key.Group {
		for _, g := range bt.groups {
			fresh = fresh || g == key.Group
		}
		if !fresh {
			bt.groups = append(bt.groups, key.Group)
		}
	}
	if fresh {
		if bt == nil && len(b.batches) >= maxThreads {
			clear(b.batches)
		}
		b.endRequestsLocked(thread, now)
		bt = &batch{tier: key.Tier, began: now, groups: []int{key.Group}, positions: map[string]int{}, counted: map[Key]bool{}}
		b.batches[thread] = bt
	}
	bt.at = now
	return bt
}

// endRequestsLocked ends, as thread starts a new batch, the promises of its
// earlier batches whose requests are past their lookups: a batch that had
// a load (the engine loads a hit once it is decided), or one that began
// more than a tenth of Gap ago and had none (its walk gave up). Batches of
// the requests looked up in the same step begin within that tenth and keep
// sharing the rows.
func (b *Budget) endRequestsLocked(thread uint32, now time.Time) {
	for k, p := range b.promises {
		if p.thread == thread && (!p.batch.loadedAt.IsZero() || now.Sub(p.batch.began) > b.opts.Gap/10) {
			b.dropPromiseLocked(k, p)
		}
	}
}

// sweepLocked drops expired promises and answers, at most four times per
// PromiseTTL.
func (b *Budget) sweepLocked(now time.Time) {
	if now.Sub(b.lastSweep) < b.opts.PromiseTTL/4 {
		return
	}
	b.lastSweep = now
	for k, p := range b.promises {
		loaded := !p.batch.loadedAt.IsZero() && now.Sub(p.batch.loadedAt) > b.opts.Gap
		if loaded || now.Sub(p.at) > b.opts.PromiseTTL {
			b.dropPromiseLocked(k, p)
		}
	}
	for k, a := range b.present {
		if now.Sub(a.at) > b.opts.Gap {
			delete(b.present, k)
		}
	}
	for k, w := range b.withheld {
		if now.Sub(w.at) > b.opts.Gap {
			delete(b.withheld, k)
		}
	}
}

// Loaded records that the engine opened key for a load: its row is the
// engine's now, no longer a promise.
func (b *Budget) Loaded(key Key) {
	b.mu.Lock()
	if p, ok := b.promises[key]; ok {
		p.batch.loadedAt = b.opts.Now()
		b.dropPromiseLocked(key, p)
	}
	b.residentLocked(key)
	b.mu.Unlock()
}

// NoteIOThread records that thread created a block tmp file or opened a
// block for a load: it is one of the engine's I/O threads, whose lookups
// check the block it is about to write or read.
func (b *Budget) NoteIOThread(thread uint32) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.io[thread] {
		return
	}
	if len(b.io) >= maxThreads {
		clear(b.io)
	}
	b.io[thread] = true
	delete(b.batches, thread)
	for k, p := range b.promises {
		if p.thread == thread {
			b.dropPromiseLocked(k, p)
		}
	}
}

// Stats returns the counters.
func (b *Budget) Stats() Stats {
	b.mu.Lock()
	defer b.mu.Unlock()
	st := b.stats
	st.Rows, st.WindowRows, st.Promised = b.rows, b.opts.WindowRows, len(b.promises)
	return st
}
