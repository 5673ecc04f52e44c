package rowsync

import (
	"net"
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
// files" every 100 ms. A listener must hold a bounded number of them.
func TestUnauthenticatedConnectionsAreBounded(t *testing.T) {
	s := startServer(t, "127.0.0.1:0", testSecret, shmRegion(t, 2, testRowBytes))
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
	open := func() int {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.conns)
	}
	// Within the handshake timeout (5 s) none of them was closed for
	// silence yet, so a listener that accepts without bound holds them all.
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if n := open(); n > maxUnauthenticatedConns {
			t.Fatalf("the listener holds %d connections that never sent a handshake (bound %d)", n, maxUnauthenticatedConns)
		}
	}
}
