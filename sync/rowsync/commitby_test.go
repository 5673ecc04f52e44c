package rowsync

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestCommitByInThePeersClock: CommitBy is the peer's reading plus the time
// left to the deadline, less the margin, whatever the peer's clock reads
// against the sender's: just started, far ahead, or near its end.
func TestCommitByInThePeersClock(t *testing.T) {
	h := time.Unix(1_000_000, 0) // the sender's clock, arbitrary
	const left = 2 * time.Second
	margin := driftSlack + commitBound + left/1_000_000*driftPPM
	for _, q := range []uint64{0, 1, uint64(time.Hour), uint64(200*365*24*time.Hour) * 2} {
		if got, want := commitBy(q, h, h.Add(left), 0), q+uint64(left-margin); got != want {
			t.Errorf("peer clock %d: CommitBy %d, want %d", q, got, want)
		}
		// Received later, the same reading leaves less time to the deadline.
		if got, want := commitBy(q, h.Add(time.Second), h.Add(left), 0), q+uint64(left-time.Second-(driftSlack+commitBound+time.Second/1_000_000*driftPPM)); got != want {
			t.Errorf("peer clock %d read a second later: CommitBy %d, want %d", q, got, want)
		}
		// The commit of a larger row takes longer: a 256 MiB row's copy
		// is given 268 ms (commitRate).
		if got, want := commitBy(q, h, h.Add(left), MaxRowBytes), q+uint64(left-margin-MaxRowBytes*time.Second/commitRate); got != want {
			t.Errorf("peer clock %d, a row of %d bytes: CommitBy %d, want %d", q, MaxRowBytes, got, want)
		}
	}
	for name, tc := range map[string]struct {
		q           uint64
		h, deadline time.Time
	}{
		"no reading":             {5, time.Time{}, h.Add(left)},
		"deadline passed":        {5, h, h.Add(-time.Millisecond)},
		"deadline within margin": {5, h, h.Add(commitBound)},
		"peer clock at its end":  {^uint64(0) - 1, h, h.Add(left)},
	} {
		if got := commitBy(tc.q, tc.h, tc.deadline, 0); got != 0 {
			t.Errorf("%s: CommitBy %d, want 0 (already late)", name, got)
		}
	}
}

// TestMirrorRefusesADeadlineWithinTheMargin: a Deadline that leaves no
// window after a row's margin is refused, naming the bound; one past it is
// taken.
func TestMirrorRefusesADeadlineWithinTheMargin(t *testing.T) {
	for _, d := range []time.Duration{time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond} {
		m, err := NewMirror(MirrorConfig{Secret: testSecret, Deadline: d, Logf: discard})
		if err == nil {
			m.Close()
			t.Errorf("NewMirror took a deadline of %s", d)
		} else if !strings.Contains(err.Error(), "must be over") {
			t.Errorf("deadline %s: %v, want the bound named", d, err)
		}
	}
	m, err := NewMirror(MirrorConfig{Secret: testSecret, Deadline: 300 * time.Millisecond, Logf: discard})
	if err != nil {
		t.Fatalf("a deadline of 300ms: %v", err)
	}
	m.Close()
}

// TestIdleLaneRefreshesItsClockReading: a lane whose reading of the peer's
// clock is an hour old (an idle lane receives no Ack) probes the peer for a
// fresh one before a row, and the row commits: with the old reading, drift
// over the hour (3.6 s at 1000 ppm) is more than the 2 s deadline, and the
// peer refused the row as late.
func TestIdleLaneRefreshesItsClockReading(t *testing.T) {
	epoch := serverEpoch
	serverEpoch = func() uint64 { return epoch() - uint64(2*time.Hour) } // the peer's clock reads 2 h: an hour-old reading exists
	defer func() { serverEpoch = epoch }()
	dst := filledRegion(t)
	s := startServer(t, "127.0.0.1:0", testSecret, dst)
	src := shmRegion(t, testRows, testRowBytes)
	fillHalf(src.Row(5), 5)
	m, err := NewMirror(MirrorConfig{Peers: []string{s.Addr().String()}, Secret: testSecret,
		Deadline: DefaultDeadline, Lanes: 1, Logf: discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	waitFor(t, "peer up", m.Healthy)
	p := m.peers[0].lanes[0]
	l, err := p.current()
	if err != nil {
		t.Fatal(err)
	}
	// The reading as it was an hour ago: both clocks an hour earlier.
	l.clock.mu.Lock()
	l.clock.q -= uint64(time.Hour)
	l.clock.h = l.clock.h.Add(-time.Hour)
	l.clock.mu.Unlock()
	if err := m.MirrorRow(context.Background(), src, 5, bytes.Clone(src.Row(5))); err != nil || !bytes.Equal(dst.Row(5), src.Row(5)) {
		t.Errorf("a row after an hour idle: %v (landed: %v, rows late: %d)", err, bytes.Equal(dst.Row(5), src.Row(5)), s.RowsLate())
	}
	if n := p.clockProbes.Load(); n != 1 {
		t.Errorf("clock probes = %d, want 1", n)
	}
}

// TestPeerClockKeepsTheFreshestReading: a reading received earlier than the
// one held does not replace it.
func TestPeerClockKeepsTheFreshestReading(t *testing.T) {
	var c peerClock
	h := time.Now()
	c.note(100, h)
	c.note(50, h.Add(-time.Second))
	if got, want := c.commitBy(h.Add(time.Second), 0), commitBy(100, h, h.Add(time.Second), 0); got != want {
		t.Errorf("CommitBy %d after an older reading, want %d", got, want)
	}
	c.note(7, h.Add(time.Millisecond))
	if got, want := c.commitBy(h.Add(time.Second), 0), commitBy(7, h.Add(time.Millisecond), h.Add(time.Second), 0); got != want {
		t.Errorf("CommitBy %d after a fresher reading, want %d", got, want)
	}
}

// holdConn is a connection whose writes, while held, are accepted and
// queued instead of sent, as a relay on the path that keeps them would
// (integration/multinode's MITM proxy). Closed while holding, it stops its
// reads but keeps the connection to the peer open; release sends what was
// queued, then closes it. With failTail, every held write after the first
// fails once queued: the sender sees its frame cut after the head, while
// the relay holds it whole, as an attacker completing it with the same
// bulk records from another peer's lane would.
type holdConn struct {
	net.Conn
	mu       sync.Mutex
	held     bool
	failTail bool
	closed   bool
	queued   []byte
	holding  chan struct{} // closed at the first write held
}

func (c *holdConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held {
		first := len(c.queued) == 0
		if first {
			close(c.holding)
		}
		c.queued = append(c.queued, b...)
		if c.failTail && !first {
			return 0, errors.New("cut by the relay")
		}
		return len(b), nil
	}
	return c.Conn.Write(b)
}

func (c *holdConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	if c.held {
		return c.Conn.(*net.TCPConn).CloseRead()
	}
	return c.Conn.Close()
}

// release sends the queued bytes, and closes the connection if Close came.
func (c *holdConn) release() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.held = false
	c.Conn.SetWriteDeadline(time.Time{}) // the sender's, long passed
	_, err := c.Conn.Write(c.queued)
	if c.closed {
		c.Conn.Close()
	}
	return err
}

// TestRowHeldPastItsDeadlineIsNotWritten holds a row's frame on its way to
// the peer until the head's MirrorRow failed at the deadline, and the
// engine wrote new data into the row at the peer; then the frame arrives
// whole: the peer must not write it (its CommitBy passed), and counts it.
// Without the check the stale row lands over the new data and the ranks
// differ (the MITM attack of integration/multinode).
// A row on time lands first. The peer's clock started with it, or reads
// years more: only the readings of it the head received count. When the
// lane fails before the deadline (its reads cut, or its frame's write after
// the head), MirrorRow still returns no earlier than the deadline, so the
// engine's reuse cannot come first.
func TestRowHeldPastItsDeadlineIsNotWritten(t *testing.T) {
	for _, tc := range []struct {
		name       string
		ahead      time.Duration
		cut, write bool
	}{
		{"peer started now", 0, false, false},
		{"peer clock years ahead", 100_000 * time.Hour, false, false},
		{"lane cut before the deadline", 0, true, false},
		{"frame's write cut after its head", 0, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) { testRowHeldPastItsDeadline(t, tc.ahead, tc.cut, tc.write) })
	}
}

func testRowHeldPastItsDeadline(t *testing.T, ahead time.Duration, cut, cutWrite bool) {
	epoch := serverEpoch
	serverEpoch = func() uint64 { return epoch() - uint64(ahead) }
	defer func() { serverEpoch = epoch }()
	// Rows of 64 KiB whatever the page size: a row's bulk is then one
	// sealed chunk, one write after the head's, which the relay of the
	// write-cut case holds whole (at 1 MiB, 16 pages of 64 KiB, the sender
	// stops at the failed write and the relay holds part of the bulk).
	const rowBytes = 64 << 10
	dst := shmRegion(t, testRows, rowBytes)
	for i := range testRows {
		fillHalf(dst.Row(i), uint64(1000+i))
	}
	s := startServer(t, "127.0.0.1:0", testSecret, dst)
	src := shmRegion(t, testRows, rowBytes)
	fillHalf(src.Row(3), 3)
	fillHalf(src.Row(4), 4)
	var (
		mu    sync.Mutex
		conns []*holdConn
	)
	m, err := NewMirror(MirrorConfig{Peers: []string{s.Addr().String()}, Secret: testSecret,
		Deadline: 300 * time.Millisecond, Lanes: 1, Logf: discard,
		Dial: func(ctx context.Context, addr string) (net.Conn, error) {
			mu.Lock()
			defer mu.Unlock()
			if len(conns) > 0 {
				// A reconnection would take the session over and end
				// the held connection (Server.takeSession): the relay
				// keeps the lane down.
				return nil, errors.New("held by the relay")
			}
			conn, err := dialTCP(ctx, addr)
			if err != nil {
				return nil, err
			}
			c := &holdConn{Conn: conn, holding: make(chan struct{})}
			conns = append(conns, c)
			return c, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	waitFor(t, "peer up", m.Healthy)
	if err := m.MirrorRow(context.Background(), src, 3, bytes.Clone(src.Row(3))); err != nil || !bytes.Equal(dst.Row(3), src.Row(3)) {
		t.Fatalf("a row on time: %v (landed: %v)", err, bytes.Equal(dst.Row(3), src.Row(3)))
	}
	mu.Lock()
	held := conns[0]
	mu.Unlock()
	held.mu.Lock()
	held.held, held.failTail = true, cutWrite
	held.mu.Unlock()
	if cut {
		go func() {
			<-held.holding
			held.Conn.(*net.TCPConn).CloseRead() // the head's reads end: its link fails
		}()
	}

	err = m.MirrorRow(context.Background(), src, 4, bytes.Clone(src.Row(4)))
	if err == nil || !cut && !cutWrite && !strings.Contains(err.Error(), "deadline") {
		t.Fatalf("MirrorRow of a held row = %v, want a failure (at the deadline unless cut)", err)
	}
	<-held.holding
	// The engine reuses the row at every rank.
	fresh := dst.Row(4)
	fillHalf(fresh, 99)
	want := bytes.Clone(fresh)
	if err := held.release(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the held row counted late, or written", func() bool {
		return s.RowsLate() > 0 || !bytes.Equal(dst.Row(4), want)
	})
	if !bytes.Equal(dst.Row(4), want) {
		t.Errorf("the row held past its deadline was written over the engine's new data (the row it held: %v)", bytes.Equal(dst.Row(4), src.Row(4)))
	}
	if n := s.RowsLate(); n != 1 {
		t.Errorf("RowsLate = %d, want 1", n)
	}
}
