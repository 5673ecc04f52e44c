package rowsync

import (
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
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
	region := shmRegion(t, 2, testRowBytes)
	var logMu sync.Mutex
	var lines []string
	s, err := StartServer(ServerConfig{
		Listen:   "127.0.0.1:0",
		Secret:   testSecret,
		Region:   func(int) (*Region, error) { return region, nil },
		RowBytes: region.RowBytes(),
		Logf: func(format string, args ...any) {
			logMu.Lock()
			lines = append(lines, fmt.Sprintf(format, args...))
			logMu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const flood = 50
	for range flood {
		c, err := net.Dial("tcp", s.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		c.Close() // the handshake fails at its first read
	}
	counted := func() (n int, all []string) {
		logMu.Lock()
		defer logMu.Unlock()
		for _, line := range lines {
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
		return n, slices.Clone(lines)
	}
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if n, _ := counted(); s.AuthFailures() == flood && n == flood {
			return
		}
	}
	n, all := counted()
	t.Fatalf("%d handshakes refused, the log counts %d:\n%s", s.AuthFailures(), n, strings.Join(all, "\n"))
}
