package rowsync

import (
	"bytes"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// recordConn remembers everything written to it.
type recordConn struct {
	net.Conn
	mu      sync.Mutex
	written bytes.Buffer
}

func (c *recordConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	c.written.Write(b)
	c.mu.Unlock()
	return c.Conn.Write(b)
}

// handshakeResult is what both ends of handshake saw.
type handshakeResult struct {
	client, server       *channel
	clientErr, serverErr error
	hello                *Hello
	welcomed             NodeID
	wire                 []byte // the bytes both sides sent
}

// handshake runs both sides over a pipe; the client is node clientNode, the
// server node serverNode.
func handshake(t *testing.T, clientSecret, serverSecret []byte, clientNode, serverNode NodeID) handshakeResult {
	t.Helper()
	c, s := net.Pipe()
	t.Cleanup(func() { c.Close(); s.Close() })
	rc, rs := &recordConn{Conn: c}, &recordConn{Conn: s}
	var r handshakeResult
	var wg sync.WaitGroup
	wg.Go(func() {
		r.server, r.hello, r.serverErr = serverHandshake(rs, presharedKey(serverSecret), &Welcome{Node: serverNode}, nil)
		if r.serverErr != nil {
			s.Close()
		}
	})
	var welcome *Welcome
	r.client, welcome, r.clientErr = clientHandshake(rc, presharedKey(clientSecret), clientNode, 7)
	if r.clientErr != nil {
		c.Close()
	} else {
		r.welcomed = welcome.Node
	}
	wg.Wait()
	r.wire = append(rc.written.Bytes(), rs.written.Bytes()...)
	return r
}

func TestHandshake(t *testing.T) {
	a, b := newNodeID(), newNodeID()
	r := handshake(t, testSecret, testSecret, a, b)
	if r.clientErr != nil || r.serverErr != nil {
		t.Fatalf("same secret: client %v, server %v", r.clientErr, r.serverErr)
	}
	if r.hello.Node != a || r.hello.Session != 7 || r.hello.To != "pipe" || r.welcomed != b {
		t.Errorf("hello %+v, welcomed by %s", r.hello, r.welcomed)
	}
	if bytes.Contains(r.wire, testSecret) || bytes.Contains(r.wire, a[:]) || bytes.Contains(r.wire, b[:]) {
		t.Error("the secret or a node's identity went over the wire in the clear")
	}
	// Fresh ephemeral keys: two handshakes never send the same bytes.
	if r2 := handshake(t, testSecret, testSecret, a, b); bytes.Equal(r.wire, r2.wire) {
		t.Error("two handshakes sent identical bytes")
	}

	// Frames flow both ways, the server's reads opening the client's records.
	done := make(chan error, 1)
	go func() { done <- r.client.writeMessage(&Ack{Seq: 1, Row: 2, CRC: 3}) }()
	frame, err := r.server.readFrame(nil, maxAckFrame)
	if err != nil || <-done != nil {
		t.Fatal(err)
	}
	if m, err := Decode(frame); err != nil || *m.(*Ack) != (Ack{Seq: 1, Row: 2, CRC: 3}) {
		t.Errorf("server read %+v, %v", m, err)
	}
}

func TestHandshakeWrongSecret(t *testing.T) {
	r := handshake(t, []byte("kvtier-test-another-secret-xyz"), testSecret, newNodeID(), newNodeID())
	if !errors.Is(r.serverErr, ErrAuth) || !strings.Contains(r.serverErr.Error(), "does not know the shared secret") {
		t.Errorf("server: %v", r.serverErr)
	}
	if !errors.Is(r.clientErr, ErrAuth) {
		t.Errorf("client: %v", r.clientErr)
	}
}

// TestHandshakeReflected: a node's own handshake handed back to it never
// yields a connection; both ends learn that the client reached itself, and
// neither counts it as an authentication failure.
func TestHandshakeReflected(t *testing.T) {
	self := newNodeID()
	r := handshake(t, testSecret, testSecret, self, self)
	if !errors.Is(r.serverErr, errSelf) || errors.Is(r.serverErr, ErrAuth) {
		t.Errorf("server, at its own node's Hello: %v", r.serverErr)
	}
	if !errors.Is(r.clientErr, errSelf) || errors.Is(r.clientErr, ErrAuth) || r.client != nil {
		t.Errorf("client, at its own node's Welcome: %v", r.clientErr)
	}

	// A responder that does not check the Hello: the client still ends the
	// handshake at a Welcome from its own node.
	c, s := net.Pipe()
	defer c.Close()
	go func() {
		defer s.Close()
		hs, _ := handshakeState(false, presharedKey(testSecret), nil)
		msg, err := readHandshake(s)
		if err != nil {
			return
		}
		if _, _, _, err := hs.ReadMessage(nil, msg); err != nil {
			return
		}
		msg, _, _, _ = hs.WriteMessage(nil, Encode(&Welcome{Node: self}))
		writeHandshake(s, msg)
	}()
	if ch, _, err := clientHandshake(c, presharedKey(testSecret), self, 1); !errors.Is(err, errSelf) || ch != nil {
		t.Errorf("client accepted a Welcome from itself: %v", err)
	}
}

func TestCheckDialed(t *testing.T) {
	local := &net.TCPAddr{IP: net.ParseIP("10.0.0.2"), Port: 7470}
	linkLocal := &net.TCPAddr{IP: net.ParseIP("fe80::1"), Port: 7470, Zone: "enp1s0"}
	if err := checkDialed("[fe80::1%eth0]:7470", linkLocal); err != nil {
		t.Errorf("a link-local address under another interface name: %v", err)
	}
	for to, ok := range map[string]bool{
		"10.0.0.2:7470":          true,
		"[::ffff:10.0.0.2]:7470": true,
		"10.0.0.3:7470":          false, // another node
		"[fe80::1%eth0]:7470":    false,
		"10.0.0.2:7471":          false, // another daemon on the same host
		"nodeB:7470":             false,
		"":                       false,
	} {
		if err := checkDialed(to, local); (err == nil) != ok || (err != nil && !errors.Is(err, ErrAuth)) {
			t.Errorf("checkDialed(%q) = %v, want ok %v", to, err, ok)
		}
	}
}

func TestReadSecretFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // past the umask
			t.Fatal(err)
		}
		return p
	}
	good := write("good", "  "+string(testSecret)+"\n", 0o600)
	if s, err := ReadSecretFile(good); err != nil || !bytes.Equal(s, testSecret) {
		t.Errorf("ReadSecretFile(0600) = %q, %v", s, err)
	}
	if _, err := ReadSecretFile(write("readonly", string(testSecret), 0o400)); err != nil {
		t.Errorf("ReadSecretFile(0400) = %v", err)
	}
	for _, tc := range []struct {
		path, want string
	}{
		{write("short", "tooshort\n", 0o600), "shared secret of 8 bytes, want at least 16"},
		{write("world", string(testSecret), 0o644), "has mode 0644: other users could read or change it; chmod 600 it"},
		{write("group", string(testSecret), 0o640), "has mode 0640"},
		{write("exec", string(testSecret), 0o700), "has mode 0700"},
		{dir, "is not a regular file"},
		{filepath.Join(dir, "missing"), "no such file"},
	} {
		if _, err := ReadSecretFile(tc.path); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ReadSecretFile(%s) = %v, want an error containing %q", filepath.Base(tc.path), err, tc.want)
		}
	}
	if os.Geteuid() == 0 {
		other := write("other", string(testSecret), 0o600)
		if err := os.Chown(other, 12345, 12345); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadSecretFile(other); err == nil || !strings.Contains(err.Error(), "is owned by uid 12345: it must belong to root or to the daemon's uid 0") {
			t.Errorf("ReadSecretFile(another user's file) = %v", err)
		}
	}
}

// TestHandshakeWithSilentPeer dials a listener whose process accepts and
// never answers, as a stopped daemon's kernel does: the handshake fails at
// its timeout as a hung peer, not as an authentication failure.
func TestHandshakeWithSilentPeer(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := l.Accept(); err == nil {
			accepted <- c
		}
	}()
	conn, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, _, err = clientHandshake(conn, presharedKey(testSecret), newNodeID(), 7)
	if err == nil || errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), "did not answer the handshake") {
		t.Fatalf("handshake with a silent peer: %v, want a hung peer, not an authentication failure", err)
	}
	(<-accepted).Close()
}

// TestHandshakeClosedToMakeRoom: a listener that closes a handshake to make
// room for others (a flood) tells the client so, which is no authentication
// failure; a refusal of the secret still is one, and a connection cut
// before any answer is neither.
func TestHandshakeClosedToMakeRoom(t *testing.T) {
	for _, at := range []string{"before the Hello", "after the Hello"} {
		c, s := net.Pipe()
		done := make(chan error, 1)
		go func() {
			defer s.Close()
			evicted := at == "before the Hello"
			_, _, err := serverHandshake(s, presharedKey(testSecret), &Welcome{Node: newNodeID()}, func(proven bool) bool {
				evicted = evicted || proven // closed as its Hello was proven
				return evicted
			})
			done <- err
		}()
		_, _, err := clientHandshake(c, presharedKey(testSecret), newNodeID(), 7)
		c.Close()
		if serr := <-done; !errors.Is(serr, errEvicted) {
			t.Errorf("%s: server %v", at, serr)
		}
		if !errors.Is(err, ErrFlooded) || errors.Is(err, ErrAuth) {
			t.Errorf("%s: client %v, want ErrFlooded and no authentication failure", at, err)
		}
	}

	r := handshake(t, []byte("kvtier-test-another-secret-xyz"), testSecret, newNodeID(), newNodeID())
	if !errors.Is(r.clientErr, ErrAuth) || errors.Is(r.clientErr, ErrFlooded) || !strings.Contains(r.clientErr.Error(), "it refused this node") {
		t.Errorf("client with another secret: %v", r.clientErr)
	}

	c, s := net.Pipe()
	go func() {
		readHandshake(s)
		s.Close()
	}()
	if _, _, err := clientHandshake(c, presharedKey(testSecret), newNodeID(), 7); !errors.Is(err, errClosedEarly) || errors.Is(err, ErrAuth) {
		t.Errorf("client of a connection closed without an answer: %v", err)
	}
	c.Close()
}
