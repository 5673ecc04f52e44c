package rowsync

import (
	"sync"
	"time"
)

// A row must land before its sender can have failed the load at the
// deadline, or the engine's next use of the row is overwritten by it
// (DESIGN "Lanes"). Nodes share no clock, so the sender names the latest
// moment in the receiver's clock (RowWrite.CommitBy), from the freshest
// reading of it that it received (peerClock), and the receiver writes the
// row only before its clock reaches it (Server.receiveRow).

// Bounds of the CommitBy arithmetic (peerClock.commitBy).
const (
	// commitBound is how long a receiver's commit of a row may take once
	// it checked CommitBy: waiting for the scans of the gaps and copying
	// at most MaxRowBytes into the region, a few milliseconds while the
	// receiver runs.
	commitBound = 50 * time.Millisecond
	// driftSlack and driftPPM bound how much less time the receiver's
	// clock may count than the sender's over an interval: a fixed part
	// (rounding, the reading's own cost) and 200 ppm of the interval,
	// ten times the tolerance of common crystal oscillators.
	driftSlack = time.Millisecond
	driftPPM   = 200
)

// peerClock is a lane's freshest reading of its peer's clock: the peer's
// clock read q (a Welcome's or an Ack's Clock) and the sender's time h at
// which that message was received. q was taken before h, so at any later
// time T of the sender the peer's clock reads at least q + (T - h), less
// drift.
type peerClock struct {
	mu sync.Mutex
	q  uint64    // guarded by mu
	h  time.Time // guarded by mu; zero: no reading yet
}

// note records the reading q of a message received at h, if it is fresher
// than the one held.
func (c *peerClock) note(q uint64, h time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.h.IsZero() || h.After(c.h) {
		c.q, c.h = q, h
	}
}

// commitBy returns the peer's clock reading by which a row must be written
// for the sender to fail its load no earlier than at deadline.
func (c *peerClock) commitBy(deadline time.Time) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return commitBy(c.q, c.h, deadline)
}

// commitBy is q + (deadline - h) - margin in the peer's clock, where the
// margin covers drift over (deadline - h) and the commit's own duration
// (commitBound); 0 (already past) when that is not after q, or without a
// reading.
func commitBy(q uint64, h, deadline time.Time) uint64 {
	if h.IsZero() {
		return 0
	}
	ahead := deadline.Sub(h)
	if ahead <= 0 {
		return 0
	}
	margin := driftSlack + commitBound + time.Duration(int64(ahead)/1_000_000*driftPPM)
	if ahead <= margin || uint64(ahead-margin) > ^uint64(0)-q {
		return 0
	}
	return q + uint64(ahead-margin)
}
