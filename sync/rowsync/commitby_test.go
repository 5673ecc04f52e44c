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
		if got, want := commitBy(q, h, h.Add(left)), q+uint64(left-margin); got != want {
			t.Errorf("peer clock %d: CommitBy %d, want %d", q, got, want)
		}
		// Received later, the same reading leaves less time to the deadline.
		if got, want := commitBy(q, h.Add(time.Second), h.Add(left)), q+uint64(left-time.Second-(driftSlack+commitBound+time.Second/1_000_000*driftPPM)); got != want {
			t.Errorf("peer clock %d read a second later: CommitBy %d, want %d", q, got, want)
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
		if got := commitBy(tc.q, tc.h, tc.deadline); got != 0 {
			t.Errorf("%s: CommitBy %d, want 0 (already late)", name, got)
		}
	}
}

// TestPeerClockKeepsTheFreshestReading: a reading received earlier than the
// one held does not replace it.
func TestPeerClockKeepsTheFreshestReading(t *testing.T) {
	var c peerClock
	h := time.Now()
	c.note(100, h)
	c.note(50, h.Add(-time.Second))
	if got, want := c.commitBy(h.Add(time.Second)), commitBy(100, h, h.Add(time.Second)); got != want {
		t.Errorf("CommitBy %d after an older reading, want %d", got, want)
	}
	c.note(7, h.Add(time.Millisecond))
	if got, want := c.commitBy(h.Add(time.Second)), commitBy(7, h.Add(time.Millisecond), h.Add(time.Second)); got != want {
		t.Errorf("CommitBy %d after a fresher reading, want %d", got, want)
	}
}

// holdConn is a connection whose writes, while held, are accepted and
// queued instead of sent, as a relay on the path that keeps them would
// (integration/multinode's MITM proxy). Closed while holding, it stops its
// reads but keeps the connection to the peer open; release sends what was
// queued, then closes it.
type holdConn struct {
	net.Conn
	mu      sync.Mutex
	held    bool
	closed  bool
	queued  []byte
	holding chan struct{} // closed at the first write held
}

func (c *holdConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held {
		if len(c.queued) == 0 {
			close(c.holding)
		}
		c.queued = append(c.queued, b...)
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
// lane fails before the deadline (its reads cut), MirrorRow still returns
// no earlier than the deadline, so the engine's reuse cannot come first.
func TestRowHeldPastItsDeadlineIsNotWritten(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ahead time.Duration
		cut   bool
	}{
		{"peer started now", 0, false},
		{"peer clock years ahead", 100_000 * time.Hour, false},
		{"lane cut before the deadline", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) { testRowHeldPastItsDeadline(t, tc.ahead, tc.cut) })
	}
}

func testRowHeldPastItsDeadline(t *testing.T, ahead time.Duration, cut bool) {
	epoch := serverEpoch
	serverEpoch = func() time.Time { return epoch().Add(-ahead) }
	defer func() { serverEpoch = epoch }()
	dst := filledRegion(t)
	s := startServer(t, "127.0.0.1:0", testSecret, dst)
	src := shmRegion(t, testRows, testRowBytes)
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
	held.held = true
	held.mu.Unlock()
	if cut {
		go func() {
			<-held.holding
			held.Conn.(*net.TCPConn).CloseRead() // the head's reads end: its link fails
		}()
	}

	err = m.MirrorRow(context.Background(), src, 4, bytes.Clone(src.Row(4)))
	if err == nil || !cut && !strings.Contains(err.Error(), "deadline") {
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
