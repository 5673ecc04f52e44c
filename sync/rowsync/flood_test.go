package rowsync

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// maxUnauthenticatedConns is what a listener may hold open for connections
// that have not completed a handshake: a few lanes per listed peer, with
// room to spare, far below a daemon's descriptor limit.
const maxUnauthenticatedConns = 128

// TestUnauthenticatedConnectionsAreBounded: anyone who reaches --listen
// (every local user on loopback; the network between nodes, which the
// threat model does not trust, for 0.0.0.0:7470) opens connections and
// never speaks. The listener accepted every one, each holding a descriptor
// until the handshake timed out, so 600 renewed connections to a daemon
// limited to 512 descriptors made the engine's makedirs, stores and loads
// through the mount fail with EMFILE, and logged "accept: too many open
// files" every 100 ms, and each refusal logged a line. A listener must
// hold a bounded number of them and log refusals at a bounded rate.
func TestUnauthenticatedConnectionsAreBounded(t *testing.T) {
	region := shmRegion(t, 2, testRowBytes)
	var logMu sync.Mutex
	var logLines int
	s, err := StartServer(ServerConfig{
		Listen:   "127.0.0.1:0",
		Secret:   testSecret,
		Region:   func(int) (*Region, error) { return region, nil },
		RowBytes: region.RowBytes(),
		Logf: func(string, ...any) {
			logMu.Lock()
			logLines++
			logMu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var silent []net.Conn
	defer func() {
		for _, c := range silent {
			c.Close()
		}
	}()
	for range 4 * maxUnauthenticatedConns {
		c, err := net.Dial("tcp", s.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		silent = append(silent, c)
	}
	open := func() (conns, handshaking int) {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.conns), len(s.handshaking)
	}
	// Within the handshake timeout (5 s) none of them was closed for
	// silence yet, so a listener that accepts without bound holds them all.
	// A connection closed to make room leaves the set once its goroutine
	// sees the close (a moment later on a busy machine): the set must come
	// down to the bound, the ones in handshake never exceed theirs.
	settled := false
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		n, h := open()
		if h > maxHandshaking {
			t.Fatalf("%d connections in handshake (bound %d)", h, maxHandshaking)
		}
		settled = settled || n <= maxUnauthenticatedConns
	}
	if n, _ := open(); !settled || n > maxUnauthenticatedConns {
		t.Fatalf("the listener holds %d connections that never sent a handshake (bound %d)", n, maxUnauthenticatedConns)
	}
	// Refusals are logged a line a second at most, not one per connection.
	logMu.Lock()
	lines := logLines
	logMu.Unlock()
	if lines > 10 {
		t.Errorf("%d log lines for %d connections that never sent a handshake", lines, len(silent))
	}
	// A peer holding the secret still gets in past them.
	newMirror(t, testSecret, time.Minute, true, s.Addr().String())
}

// TestLastRefusalsOfAFloodAreLogged: refusals past one line a second are
// counted by the next line, and when the flood stops, by a line of their
// own: the lines count every refused handshake (main left the count a
// flood ended with unlogged until the next refusal, if one ever came).
func TestLastRefusalsOfAFloodAreLogged(t *testing.T) {
	s, logged := loggingServer(t, nil)
	const flood = 50
	for range flood {
		c, err := net.Dial("tcp", s.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		c.Close() // the handshake fails at its first read
	}
	counted := func() (n int, all []string) {
		all = logged()
		for _, line := range all {
			var more int
			switch {
			case strings.Contains(line, "more handshakes since the last such line, the last"):
				fmt.Sscanf(line, "rowsync: refused %d more", &more)
				n += more
			case strings.Contains(line, "(and "):
				fmt.Sscanf(line[strings.Index(line, "(and "):], "(and %d more", &more)
				n += 1 + more
			case strings.HasPrefix(line, "rowsync: refused "):
				n++
			}
		}
		return n, all
	}
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if n, _ := counted(); s.AuthFailures() == flood && n == flood {
			return
		}
	}
	n, all := counted()
	t.Fatalf("%d handshakes refused, the log counts %d:\n%s", s.AuthFailures(), n, strings.Join(all, "\n"))
}

// floodSources is how many loopback addresses (127.0.0.2 on) the flood of
// TestHandshakeFloodDoesNotKeepAPeerOut comes from, each keeping
// floodConnsPerSource silent connections open and renewing them.
const (
	floodSources        = 32
	floodConnsPerSource = 8
)

// floodListener opens silent connections to addr from floodSources loopback
// addresses until the test ends, each source renewing its oldest as fast as
// it can dial; it returns the count of connections opened so far.
func floodListener(t *testing.T, addr string) *atomic.Int64 {
	t.Helper()
	var dials atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	t.Cleanup(func() { close(stop); wg.Wait() })
	for i := range floodSources {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+i))}}
		wg.Go(func() {
			var open []net.Conn
			defer func() {
				for _, c := range open {
					c.Close()
				}
			}()
			for {
				select {
				case <-stop:
					return
				default:
				}
				c, err := d.Dial("tcp", addr)
				if err != nil {
					time.Sleep(10 * time.Millisecond)
					continue
				}
				dials.Add(1)
				if open = append(open, c); len(open) > floodConnsPerSource {
					open[0].Close()
					open = open[1:]
				}
			}
		})
	}
	return &dials
}

// TestHandshakeFloodDoesNotKeepAPeerOut: anyone on the network between the
// nodes opens connections to --listen faster than a listed peer's handshake
// takes and never speaks. The listener closed the oldest connection in
// handshake past its bound, the peer's among them, and the peer took the
// close for a refusal of its secret ("a wrong shared secret", counted in
// auth_failures). The flood must neither keep the peer out nor read as a
// wrong secret, and the listener's log and count must name it: whether the
// peer list names the peer's IP (its handshakes go last) or not (a Hello
// sealed under the secret does, and the sources with the most first).
func TestHandshakeFloodDoesNotKeepAPeerOut(t *testing.T) {
	for _, listed := range []bool{true, false} {
		t.Run(fmt.Sprintf("listed=%v", listed), func(t *testing.T) {
			var peers []string
			if listed {
				peers = []string{"127.0.0.1:7470"} // the peer below dials from 127.0.0.1
			}
			floodPeer(t, peers)
		})
	}
}

func floodPeer(t *testing.T, peers []string) {
	s, logged := loggingServer(t, peers)
	dials := floodListener(t, s.Addr().String())
	waitFor(t, "the flood", func() bool { return dials.Load() >= 4*maxHandshaking })

	m, err := NewMirror(MirrorConfig{Peers: []string{s.Addr().String()}, Secret: testSecret, Logf: discard})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	// Every lane comes up while the flood goes on; none of the peer's
	// handshakes the listener closed counts as a wrong secret.
	up := false
	for end := time.Now().Add(20 * time.Second); !up && time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		up = m.Healthy()
	}
	before := dials.Load()
	waitFor(t, "the flood to go on", func() bool { return dials.Load() >= before+4*maxHandshaking })
	stats := m.Stats()
	if !up || m.AuthFailures() != 0 || !m.Healthy() {
		t.Fatalf("during a flood of %d connections the peer was up %v (now %v), with %d authentication failures: %+v",
			dials.Load(), up, m.Healthy(), m.AuthFailures(), stats)
	}
	if s.HandshakesEvicted() == 0 {
		t.Error("the listener counted no handshake closed to make room")
	}
	t.Logf("%d connections of the flood, %d handshakes closed to make room, %d of the peer's", dials.Load(), s.HandshakesEvicted(), m.HandshakesEvicted())
	if lines := logged(); !slices.ContainsFunc(lines, func(l string) bool { return strings.Contains(l, "flood") }) {
		t.Errorf("the listener's log does not name the flood:\n%s", strings.Join(lines, "\n"))
	}
}

// loggingServer starts a listener on loopback with the peer list peers,
// closed when the test ends, and returns it with a copy of its log so far.
func loggingServer(t *testing.T, peers []string) (*Server, func() []string) {
	t.Helper()
	region := shmRegion(t, 2, testRowBytes)
	var mu sync.Mutex
	var lines []string
	s, err := StartServer(ServerConfig{
		Listen:   "127.0.0.1:0",
		Secret:   testSecret,
		Peers:    peers,
		Region:   func(int) (*Region, error) { return region, nil },
		RowBytes: region.RowBytes(),
		Logf: func(format string, args ...any) {
			mu.Lock()
			lines = append(lines, fmt.Sprintf(format, args...))
			mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(lines)
	}
}

// TestEvictionOrder: past the bound, an unlisted source's handshake goes
// before a listed one's, one not proven before a proven one (a replayed
// Hello is proven too), the source with the most before others, the oldest
// first.
func TestEvictionOrder(t *testing.T) {
	a, b, peer := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.9")
	pending := []*pendingConn{
		{source: peer, listed: true},               // 0
		{source: a, proven: true},                  // 1: a replayed Hello, say
		{source: b},                                // 2
		{source: a},                                // 3
		{source: a},                                // 4
		{source: peer, listed: true},               // 5
		{source: peer, listed: true},               // 6
		{source: peer, listed: true},               // 7
		{source: b, proven: true},                  // 8
		{source: peer, listed: true, proven: true}, // 9
	}
	var s Server
	s.handshaking = slices.Clone(pending)
	var order []int
	for len(s.handshaking) > 0 {
		order = append(order, slices.Index(pending, s.evictLocked()))
	}
	// a has three (3, 4 and the proven 1), b two (2 and the proven 8):
	// a's 3 goes first, then b's 2 (as many left, and older), a's 4; then
	// the unlisted proven, a's and b's one each, the oldest first; then the
	// listed peer's not proven (0, 5, 6, 7); its proven one last.
	if want := []int{3, 2, 4, 1, 8, 0, 5, 6, 7, 9}; !slices.Equal(order, want) {
		t.Errorf("evicted %v, want %v", order, want)
	}
}

// TestReplayedHelloFloodDoesNotKeepAListedPeerOut: whoever once saw a
// peer's Hello on the network between the nodes (which the threat model
// does not trust) can send it again on as many connections as it likes.
// Each is proven under the secret (a replay decrypts as the original did)
// and then waits for a Ready that never comes, until handshakeTimeout. An
// eviction that kept proven handshakes over a listed peer's not yet proven
// one closed every handshake the peer began while such replays held the
// slots: a flood from sources the peer list does not name kept a listed
// peer out. A listed source's handshake must outrank them.
func TestReplayedHelloFloodDoesNotKeepAListedPeerOut(t *testing.T) {
	region := shmRegion(t, 2, testRowBytes)
	s, err := StartServer(ServerConfig{
		Listen:   "127.0.0.1:0",
		Secret:   testSecret,
		Peers:    []string{"127.0.0.1:7470"}, // the Mirror below dials from 127.0.0.1
		Region:   func(int) (*Region, error) { return region, nil },
		RowBytes: region.RowBytes(),
		Logf:     discard,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	addr := s.Addr().String()
	// The Hello a peer's Mirror sent this listener, as seen on the wire.
	hs, err := handshakeState(true, presharedKey(testSecret), nil)
	if err != nil {
		t.Fatal(err)
	}
	msg, _, _, err := hs.WriteMessage(nil, Encode(&Hello{Session: 1, Node: newNodeID(), To: addr}))
	if err != nil {
		t.Fatal(err)
	}
	sniffed := append(binary.BigEndian.AppendUint16(nil, uint16(len(msg))), msg...)

	// More replayers than slots, each sending the Hello on a connection and
	// dialing again once the listener closed it (to make room, or at its
	// handshake timeout), from 32 loopback addresses the list does not name.
	var mu sync.Mutex
	open := map[net.Conn]bool{} // nil once the test ends
	var wg sync.WaitGroup
	defer func() {
		mu.Lock()
		for c := range open {
			c.Close()
		}
		open = nil
		mu.Unlock()
		wg.Wait()
	}()
	for i := range maxHandshaking + 8 {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+i%32))}}
		wg.Go(func() {
			for {
				c, err := d.Dial("tcp", addr)
				if err != nil {
					time.Sleep(10 * time.Millisecond)
					continue
				}
				mu.Lock()
				ended := open == nil
				if !ended {
					open[c] = true
				}
				mu.Unlock()
				if ended {
					c.Close()
					return
				}
				if _, err := c.Write(sniffed); err == nil {
					io.Copy(io.Discard, c) // until the listener closes it
				}
				mu.Lock()
				delete(open, c)
				mu.Unlock()
				c.Close()
			}
		})
	}
	waitFor(t, "every slot held by a replayed Hello", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.handshaking) == maxHandshaking && !slices.ContainsFunc(s.handshaking, func(p *pendingConn) bool { return !p.proven })
	})

	m, err := NewMirror(MirrorConfig{Peers: []string{addr}, Secret: testSecret, Logf: discard})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	waitFor(t, "the listed peer's lanes", m.Healthy)
	if n := m.HandshakesEvicted(); n != 0 || m.AuthFailures() != 0 {
		t.Fatalf("the listener closed %d of the listed peer's handshakes to make room for replayed Hellos (%d authentication failures)", n, m.AuthFailures())
	}
}

// evictAtSecondWrite is a client's end of a connection whose listener
// closes its handshake to make room (evictLocked) just as the client sends
// its Ready, the second message it writes: the Ready is already on its way,
// and a read after CloseRead still returns what had arrived.
type evictAtSecondWrite struct {
	net.Conn
	s      *Server
	writes int
}

func (c *evictAtSecondWrite) Write(b []byte) (int, error) {
	if c.writes++; c.writes == 2 {
		c.s.mu.Lock()
		c.s.evictLocked()
		c.s.mu.Unlock()
	}
	return c.Conn.Write(b)
}

// TestHandshakeEvictedWithItsReadyInTakesNoSession: a handshake closed to
// make room whose Ready had already arrived finished its handshake, took
// its session over from the connection serving it and served requests on
// a connection whose reads were shut, uncounted as a handshake closed to
// make room. It must end there and count as one.
func TestHandshakeEvictedWithItsReadyInTakesNoSession(t *testing.T) {
	region := shmRegion(t, 2, testRowBytes)
	s, err := StartServer(ServerConfig{
		Listen:   "127.0.0.1:0",
		Secret:   testSecret,
		Region:   func(int) (*Region, error) { return region, nil },
		RowBytes: region.RowBytes(),
		Logf:     discard,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	client, server := net.Pipe()
	defer client.Close()
	p := &pendingConn{conn: server}
	s.mu.Lock()
	s.handshaking = append(s.handshaking, p)
	s.mu.Unlock()
	served := make(chan struct{})
	go func() {
		defer close(served)
		defer server.Close()
		s.serve(server, p)
	}()
	if _, _, err := clientHandshake(&evictAtSecondWrite{Conn: client, s: s}, presharedKey(testSecret), newNodeID(), 7); err != nil {
		t.Fatal(err)
	}
	select {
	case <-served:
	case <-time.After(20 * time.Second):
		client.Close()
		<-served
		t.Fatal("the Server served a connection it had closed to make room")
	}
	s.mu.Lock()
	sessions := len(s.sessions)
	s.mu.Unlock()
	if n := s.HandshakesEvicted(); n != 1 || sessions != 0 {
		t.Fatalf("%d handshakes counted as closed to make room, %d sessions taken", n, sessions)
	}
}
