package rowsync

import (
	"fmt"
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
	// commitBound and commitRate bound how long a receiver's commit of a
	// row may take once it checked CommitBy, while the receiver runs: the
	// end of the gaps' scans and a fixed part, commitBound, and mapping and
	// copying the row's bytes at commitRate bytes a second (a first-touch
	// copy of 256 MiB took about 200 ms, 1.3 GB/s; DESIGN "Lanes").
	commitBound = 50 * time.Millisecond
	commitRate  = 1_000_000_000
	// driftSlack and driftPPM bound how much less time the receiver's
	// clock may count than the sender's over an interval: a fixed part
	// (rounding, the reading's own cost) and 1000 ppm of the interval (NTP
	// may slew each machine's clock by up to 500 ppm). A reading is at most
	// clockRefresh old when a row is sent, so the interval stays within
	// clockRefresh plus the Deadline.
	driftSlack = time.Millisecond
	driftPPM   = 1000
	// clockRefresh is the age past which a lane refreshes its reading of
	// the peer's clock with a probe before a row (peer.refreshClock): an
	// idle lane receives no Ack, and the drift part of the margin grows
	// with the reading's age.
	clockRefresh = 10 * time.Second
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

// stale reports whether the reading is older than clockRefresh at now, or
// missing.
func (c *peerClock) stale(now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.h.IsZero() || now.Sub(c.h) > clockRefresh
}

// commitBy returns the peer's clock reading by which a row of rowBytes
// bytes must be written for the sender to fail its load no earlier than at
// deadline.
func (c *peerClock) commitBy(deadline time.Time, rowBytes uint64) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return commitBy(c.q, c.h, deadline, rowBytes)
}

// margin is how much of the time ahead of a reading a row of rowBytes
// bytes must leave: drift over it and the commit's own duration.
func margin(ahead time.Duration, rowBytes uint64) time.Duration {
	commit := commitBound + time.Duration(rowBytes*uint64(time.Second)/commitRate)
	return driftSlack + commit + time.Duration(int64(ahead)/1_000_000*driftPPM)
}

// checkDeadline refuses a MirrorConfig.Deadline that leaves a row no more
// time to arrive in than its margin takes, for the smallest row with a
// reading clockRefresh old.
func checkDeadline(d time.Duration) error {
	if m := margin(clockRefresh+d, 0); d <= 2*m {
		return fmt.Errorf("rowsync: deadline %s: a row's CommitBy is at least %s before it (clock drift, the commit's own duration; DESIGN \"Lanes\"), so it must be over %s", d, m, 2*m)
	}
	return nil
}

// commitBy is q + (deadline - h) - margin in the peer's clock; 0 (already past) when that is not after q, or without a
// reading.
func commitBy(q uint64, h, deadline time.Time, rowBytes uint64) uint64 {
	if h.IsZero() {
		return 0
	}
	ahead := deadline.Sub(h)
	if ahead <= 0 {
		return 0
	}
	m := margin(ahead, rowBytes)
	if ahead <= m || uint64(ahead-m) > ^uint64(0)-q {
		return 0
	}
	return q + uint64(ahead-m)
}
