// Package batch learns a thread's lookup batches: the engine looks a
// request's block keys up in prefix order, one thread after the other, and
// starts again from the first key every scheduler step. The store's eviction
// (tiers/disk, keyed by thread) and staging's chains (keyed by thread and
// chain) both follow those batches through one Cursors table, so the pause
// that ends a batch and the bound on remembered threads are one rule.
package batch

import "time"

// Gap is the pause that ends a lookup batch: a thread's lookups further
// apart than Gap belong to different batches.
const Gap = time.Second

// MaxCursors bounds the cursors a table remembers, so that a flood of
// lookups from new threads (or match requests, one id each) cannot grow it
// (DESIGN "Threat model").
const MaxCursors = 1024

// Cursors remembers where each key's (a thread's) current batch is: a value
// of type S the caller owns, and the time of the key's latest lookup. It is
// not safe for concurrent use; its owner's lock guards it.
type Cursors[K comparable, S any] struct {
	gap     int64
	cursors map[K]*cursor[S]
}

type cursor[S any] struct {
	state S
	at    int64
}

// New returns an empty table whose batches end after a pause of gap
// (Gap when gap is 0).
func New[K comparable, S any](gap time.Duration) *Cursors[K, S] {
	if gap == 0 {
		gap = Gap
	}
	return &Cursors[K, S]{gap: int64(gap), cursors: make(map[K]*cursor[S])}
}

// Note records a lookup by key at now (Unix nanoseconds) and returns key's
// batch state. started reports a new batch: key's first lookup, or one more
// than the gap after its previous one; its state is then the zero S. A new
// key when MaxCursors are kept first forgets the idle ones and, in a flood of
// busy ones, any down to three quarters of the bound, so each full table
// costs one walk per MaxCursors/4 new keys. A forgotten key only starts a
// new batch.
func (c *Cursors[K, S]) Note(key K, now int64) (state *S, started bool) {
	cur := c.cursors[key]
	if cur == nil {
		c.pruneFor(now)
		cur = &cursor[S]{}
		c.cursors[key] = cur
		started = true
	} else if now-cur.at > c.gap {
		var zero S
		cur.state, started = zero, true
	}
	cur.at = now
	return &cur.state, started
}

// NoteKnown is Note for a key already in the table; it returns nil (and
// remembers nothing) for any other key.
func (c *Cursors[K, S]) NoteKnown(key K, now int64) (state *S, started bool) {
	if c.cursors[key] == nil {
		return nil, false
	}
	return c.Note(key, now)
}

// pruneFor makes room for one more key when the table is full.
func (c *Cursors[K, S]) pruneFor(now int64) {
	if len(c.cursors) < MaxCursors {
		return
	}
	for key, cur := range c.cursors {
		if now-cur.at > c.gap {
			delete(c.cursors, key)
		}
	}
	for key := range c.cursors {
		if len(c.cursors) < MaxCursors*3/4 {
			break
		}
		delete(c.cursors, key)
	}
}

// DeleteFunc forgets every key for which forget returns true.
func (c *Cursors[K, S]) DeleteFunc(forget func(K) bool) {
	for key := range c.cursors {
		if forget(key) {
			delete(c.cursors, key)
		}
	}
}

// Len is the number of keys remembered.
func (c *Cursors[K, S]) Len() int { return len(c.cursors) }
