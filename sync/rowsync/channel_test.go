package rowsync

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// The attacks of issue 11 on the peer link, each on loopback: a relay that
// hands a node's handshake back to it or to another node, a man in the
// middle that changes a byte of a row or of an acknowledgement, a connection
// cut in the middle of a row, and a sender naming another row size.

// tamper sees the bytes of one direction of a relayed connection, off being
// the offset of b in that direction; it may change them, and returns how
// many to pass on: fewer than len(b) cuts the connection after them.
type tamper func(off int64, b []byte) (keep int)

// flipAt changes the byte at offset k.
func flipAt(k int64) tamper {
	return func(off int64, b []byte) int {
		if k >= off && k < off+int64(len(b)) {
			b[k-off] ^= 0x01
		}
		return len(b)
	}
}

// cutAt passes on the first k bytes and cuts the connection.
func cutAt(k int64) tamper {
	return func(off int64, b []byte) int { return int(min(max(k-off, 0), int64(len(b)))) }
}

// relay accepts connections and relays each to target(), passing each
// direction through its tamper (nil: untouched). It stops when the test ends.
func relay(t *testing.T, target func() string, toServer, toClient tamper) net.Addr {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", target())
			if err != nil {
				client.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, client, server)
			mu.Unlock()
			wg.Go(func() { pipe(server, client, toServer) })
			wg.Go(func() { pipe(client, server, toClient) })
		}
	})
	return ln.Addr()
}

// pipe copies src to dst through tamper until either fails or tamper cuts.
func pipe(dst, src net.Conn, tamper tamper) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	var off int64
	for {
		n, err := src.Read(buf)
		keep := n
		if tamper != nil && n > 0 {
			keep = tamper(off, buf[:n])
		}
		if _, werr := dst.Write(buf[:keep]); werr != nil || keep < n || err != nil {
			return
		}
		off += int64(n)
	}
}

// throughRelay is a MirrorConfig.Dial for a man in the middle on the path to
// server: it connects to the relay, and the connection looks as if it reached
// server, as it would if the relay sat on the wire.
func throughRelay(relay, server net.Addr) func(context.Context, string) (net.Conn, error) {
	return func(ctx context.Context, _ string) (net.Conn, error) {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", relay.String())
		if err != nil {
			return nil, err
		}
		return onPath{Conn: conn, remote: server}, nil
	}
}

type onPath struct {
	net.Conn
	remote net.Addr
}

func (c onPath) RemoteAddr() net.Addr { return c.remote }

// mirrorVia starts a Mirror to server whose connections pass the relay.
func mirrorVia(t *testing.T, server, relay net.Addr, node NodeID) *Mirror {
	t.Helper()
	m, err := NewMirror(MirrorConfig{Peers: []string{server.String()}, Secret: testSecret, Node: node,
		Deadline: 5 * time.Second, Logf: discard, Dial: throughRelay(relay, server)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// TestNodeRefusesItsOwnHandshake: a relay on the port a node mirrors to hands
// the node's handshake to the node's own Server (at dd8aaaf it was accepted,
// the peer shown up, and the relay could write any row). The node learns it
// reached itself, but with no other entry confirming a shared list it may not
// skip the entry: the peer is down and no row counts as mirrored.
func TestNodeRefusesItsOwnHandshake(t *testing.T) {
	region := shmRegion(t, testRows, testRowBytes)
	var node *Node
	var ready sync.WaitGroup
	ready.Add(1)
	addr := relay(t, func() string { ready.Wait(); return node.Addr().String() }, nil, nil)
	node = startNode(t, region, ModeOn, addr.String())
	ready.Done()
	waitFor(t, "the entry found to reach the node itself", func() bool {
		return strings.Contains(node.Snapshot().Peers[0].LastError, "reaches this node itself, and it is not skipped")
	})
	if p := node.Snapshot().Peers[0]; p.State != StateDown {
		t.Errorf("a node that reached itself through a relay shows %+v", p)
	}
	if node.ServeLoads() {
		t.Error("lookups are served while the only peer may be the relay's reflection")
	}
	fillHalf(region.Row(3), 3)
	if err := node.MirrorBlock(context.Background(), region, 3, region.Row(3), block.CRC32C(region.Row(3)), block.NonZeroRuns(region.Row(3), 0)); err == nil {
		t.Error("a row mirrored to the node itself counted as mirrored")
	}
}

// TestReflectedHandshake: a man in the middle that hands a node's handshake
// back to the same node's Server, invisibly (the address check passes),
// yields no connection: the Mirror sees its own node, and without a shared
// list to confirm it keeps the peer down.
func TestReflectedHandshake(t *testing.T) {
	self := newNodeID()
	s, err := StartServer(ServerConfig{Listen: "127.0.0.1:0", Secret: testSecret, Node: self, RowBytes: testRowBytes, Logf: discard,
		Region: func(int) (*Region, error) { return shmRegion(t, testRows, testRowBytes), nil }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	m := mirrorVia(t, s.Addr(), relay(t, func() string { return s.Addr().String() }, nil, nil), self)
	waitFor(t, "the reflection noticed", func() bool { return strings.Contains(m.Stats()[0].LastError, "reaches this node itself") })
	if m.Healthy() {
		t.Error("a reflected handshake made the peer healthy")
	}
	if s.AuthFailures() != 0 || m.AuthFailures() != 0 {
		t.Errorf("a node's own handshake counted as %d+%d authentication failures", s.AuthFailures(), m.AuthFailures())
	}
}

// TestRelayedToAnotherNode: a handshake meant for node B, relayed to node C
// (which holds the same secret) is refused by C: the client dialed B.
func TestRelayedToAnotherNode(t *testing.T) {
	b, c := shmRegion(t, testRows, testRowBytes), shmRegion(t, testRows, testRowBytes)
	sb := startServer(t, "127.0.0.1:0", testSecret, b)
	sc := startServer(t, "127.0.0.1:0", testSecret, c)
	m := mirrorVia(t, sb.Addr(), relay(t, func() string { return sc.Addr().String() }, nil, nil), newNodeID())
	waitFor(t, "the refusal counted and reported", func() bool {
		return sc.AuthFailures() >= 1 && strings.Contains(m.Stats()[0].LastError, "refused this node")
	})
	if m.Healthy() || sb.AuthFailures() != 0 {
		t.Errorf("healthy %v, B's refusals %d", m.Healthy(), sb.AuthFailures())
	}
}

// mitmCase mirrors one row to a fresh server through a relay that tampers
// with the connection, and returns the server, the Mirror, the server's row
// before and after, and the Mirror's error.
func mitmCase(t *testing.T, toServer, toClient tamper) (s *Server, m *Mirror, before, after []byte, err error) {
	t.Helper()
	src, dst := shmRegion(t, testRows, testRowBytes), shmRegion(t, testRows, testRowBytes)
	fillHalf(dst.Row(5), 500)
	before = bytes.Clone(dst.Row(5))
	fillHalf(src.Row(5), 5)
	s = startServer(t, "127.0.0.1:0", testSecret, dst)
	m = mirrorVia(t, s.Addr(), relay(t, func() string { return s.Addr().String() }, toServer, toClient), newNodeID())
	waitFor(t, "peer up", m.Healthy)
	err = m.MirrorRow(context.Background(), src, 5, bytes.Clone(src.Row(5)))
	// Once the server has let go of every connection, it will not touch
	// the row any more.
	m.Close()
	waitFor(t, "the server idle", func() bool { s.mu.Lock(); defer s.mu.Unlock(); return len(s.conns) == 0 })
	return s, m, before, bytes.Clone(dst.Row(5)), err
}

// The first bytes of each direction are the handshake; these offsets land
// well inside the first row (the client's direction) and inside the first
// row's acknowledgement's record (the server's: past its handshake message,
// an ephemeral key and the sealed Welcome, the record answering the
// connection's fence (connect), and the record's length).
var (
	rowByteOffset int64 = 20000
	fenceAck            = Encode(&Ack{Err: fmt.Sprintf("geometry mismatch: sender has rows of 1 bytes, receiver rows of %d bytes", testRowBytes)})
	ackByteOffset       = int64(2+32+len(Encode(&Welcome{}))+tagBytes) + int64(2+len(fenceAck)+tagBytes) + 2 + 10
)

func TestManInTheMiddleChangesRow(t *testing.T) {
	s, _, before, after, err := mitmCase(t, flipAt(rowByteOffset), nil)
	if err == nil {
		t.Fatal("a row changed on the way was acknowledged")
	}
	if !bytes.Equal(before, after) {
		t.Error("the receiver's row changed")
	}
	waitFor(t, "the record counted as an authentication failure", func() bool { return s.AuthFailures() >= 1 })
}

func TestManInTheMiddleChangesAck(t *testing.T) {
	_, m, _, _, err := mitmCase(t, nil, flipAt(ackByteOffset))
	if err == nil {
		t.Fatal("a changed acknowledgement verified the row")
	}
	waitFor(t, "the record counted as an authentication failure", func() bool { return m.AuthFailures() >= 1 })
}

func TestTornRowWrite(t *testing.T) {
	_, _, before, after, err := mitmCase(t, cutAt(rowByteOffset), nil)
	if err == nil {
		t.Fatal("a row cut on the way was acknowledged")
	}
	if !bytes.Equal(before, after) {
		t.Error("the receiver's row is half overwritten")
	}
}

// TestServerKeepsItsGeometry: the region is mapped at whatever row size the
// server asks for (as the filesystem's RegionFunc does), so a sender naming
// half the row size would address the second half of row 0 as row 1. The
// server keeps this node's own row size instead: the one it was told
// (--row-bytes) or its own loads and stores name. Before it knows one it
// refuses every row, and the first row a peer sends fixes nothing (issue 24
// item 8: it used to fix the size, and every real row was refused after).
func TestServerKeepsItsGeometry(t *testing.T) {
	mem := shmRegion(t, testRows, testRowBytes)
	mapAt := func(rowBytes int) (*Region, error) { return NewRegion(mem.mem, rowBytes) }
	src := shmRegion(t, testRows, testRowBytes)
	half := shmRegion(t, 2*testRows, testRowBytes/2)
	fillHalf(src.Row(0), 1)
	fillHalf(half.Row(1), 2)
	wrongSize := fmt.Sprintf("geometry mismatch: sender has rows of %d bytes, receiver rows of %d bytes", testRowBytes/2, testRowBytes)

	for _, told := range []string{"flag", "own use", "nothing"} {
		s, err := StartServer(ServerConfig{Listen: "127.0.0.1:0", Secret: testSecret, Region: mapAt, Logf: discard,
			RowBytes: map[bool]int{true: testRowBytes}[told == "flag"]})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		m := newMirror(t, testSecret, 0, true, s.Addr().String())
		before := bytes.Clone(mem.Row(0))
		err = m.MirrorRow(context.Background(), half, 1, bytes.Clone(half.Row(1)))
		switch {
		case told == "nothing" && (err == nil || !strings.Contains(err.Error(), "does not know its row size yet: give its daemon --row-bytes")):
			t.Errorf("%s: a row before the node knows its size = %v", told, err)
		case told == "flag" && (err == nil || !strings.Contains(err.Error(), wrongSize)):
			t.Errorf("%s: a row of another size = %v", told, err)
		}
		if !bytes.Equal(before, mem.Row(0)) {
			t.Errorf("%s: a row of another size was written", told)
		}
		m = newMirror(t, testSecret, 0, true, s.Addr().String()) // the refusal took the first one down
		if told == "own use" {
			s.NoteLocalRowBytes(testRowBytes)
		}
		err = m.MirrorRow(context.Background(), src, 0, bytes.Clone(src.Row(0)))
		if told == "nothing" {
			if err == nil {
				t.Errorf("%s: a row was written at a size a peer chose", told)
			}
			continue
		}
		if err != nil || !bytes.Equal(mem.Row(0), src.Row(0)) {
			t.Errorf("%s: a row of this node's size after one of another size: %v", told, err)
		}
		m = newMirror(t, testSecret, 0, true, s.Addr().String())
		if err := m.MirrorRow(context.Background(), half, 1, bytes.Clone(half.Row(1))); err == nil || !strings.Contains(err.Error(), wrongSize) {
			t.Errorf("%s: a row of another size after the node's own = %v", told, err)
		}
	}
}
