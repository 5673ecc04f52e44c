package rowsync

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// freePort returns a loopback TCP port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startGroup starts one node per port, each listening on 127.0.0.1:port and
// given the same peer list, built by entry from each port.
func startGroup(t *testing.T, ports []int, entry func(port int) string) ([]*Node, []*Region) {
	t.Helper()
	var list []string
	for _, p := range ports {
		list = append(list, entry(p))
	}
	nodes := make([]*Node, len(ports))
	regions := make([]*Region, len(ports))
	for i, p := range ports {
		regions[i] = shmRegion(t, testRows, testRowBytes)
		region := regions[i]
		n, err := Start(Config{Listen: "127.0.0.1:" + strconv.Itoa(p), Peers: list, Secret: testSecret, Replicated: ModeOn,
			Region: func(int) (*Region, error) { return region, nil }, RowBytes: testRowBytes, Logf: discard})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		nodes[i] = n
	}
	return nodes, regions
}

// checkGroup checks that every node of a group sharing one list skips its
// own entry, has every other peer up, and that a row mirrored from each node
// lands at every other one.
func checkGroup(t *testing.T, nodes []*Node, regions []*Region) {
	t.Helper()
	for i, n := range nodes {
		waitFor(t, "every node healthy", func() bool { return n.ServeLoads() })
		peers := n.Snapshot().Peers
		if len(peers) < len(nodes) {
			t.Fatalf("node %d lists %d peers, want %d: %+v", i, len(peers), len(nodes), peers)
		}
		for j, p := range peers[:len(nodes)] {
			if want := map[bool]string{true: StateSelf, false: StateUp}[i == j]; p.State != want {
				t.Errorf("node %d, entry %d (%s): state %q, want %q (%s)", i, j, p.Addr, p.State, want, p.LastError)
			}
		}
		if a := n.Snapshot().AuthFailures; a != 0 {
			t.Errorf("node %d counts %d authentication failures", i, a)
		}
	}
	for i, n := range nodes {
		row := i + 1
		fillHalf(regions[i].Row(row), 77+uint64(i))
		data := bytes.Clone(regions[i].Row(row))
		if err := n.MirrorBlock(context.Background(), regions[i], row, data, block.CRC32C(data), block.NonZeroRuns(data, 0)); err != nil {
			t.Fatalf("node %d: %v", i, err)
		}
		for j := range nodes {
			if !bytes.Equal(regions[j].Row(row), data) {
				t.Errorf("row %d mirrored from node %d differs at node %d", row, i, j)
			}
		}
		if s := n.Snapshot(); s.Peers[i].RowsSent != 0 {
			t.Errorf("node %d sent a row to itself: %+v", i, s.Peers[i])
		}
	}
}

// TestGroupSharesOnePeerList: three daemons given one list of the group's
// literal addresses, as a DaemonSet does (issue 27); each finds its own
// address in it and never dials it.
func TestGroupSharesOnePeerList(t *testing.T) {
	ports := []int{freePort(t), freePort(t), freePort(t)}
	nodes, regions := startGroup(t, ports, func(p int) string { return "127.0.0.1:" + strconv.Itoa(p) })
	checkGroup(t, nodes, regions)
}

// TestGroupSharesOneListOfNames: the same with host names, which are never
// resolved to find this node: each node's own entry is recognised by its
// handshake reaching its own Server, and skipped since the others confirm
// the same list.
func TestGroupSharesOneListOfNames(t *testing.T) {
	ports := []int{freePort(t), freePort(t), freePort(t)}
	nodes, regions := startGroup(t, ports, func(p int) string { return "localhost:" + strconv.Itoa(p) })
	checkGroup(t, nodes, regions)
}

// reflectingMirror starts node a's Mirror over list, whose dialer hands the
// connection meant for reflected to a's own Server, as a relay on the
// network would.
func reflectingMirror(t *testing.T, a *Server, list []string, reflected string) *Mirror {
	t.Helper()
	m, err := NewMirror(MirrorConfig{Peers: list, Listen: a.Addr(), Secret: testSecret, Node: a.cfg.Node, Logf: discard,
		Dial: func(ctx context.Context, addr string) (net.Conn, error) {
			if addr == reflected {
				addr = a.Addr().String()
			}
			return dialTCP(ctx, addr)
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// groupServer starts a Server with the given peer list.
func groupServer(t *testing.T, peers ...string) *Server {
	t.Helper()
	s, err := StartServer(ServerConfig{Listen: "127.0.0.1:0", Secret: testSecret, Peers: peers, RowBytes: testRowBytes, Logf: discard,
		Region: func(int) (*Region, error) { return shmRegion(t, testRows, testRowBytes), nil }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestReflectedPeerNotSkipped: a relay that hands node a's connection to a
// real peer b back to a must not make a skip b (b's rank would go stale
// while loads succeed): with lists configured node by node, c's list differs
// from a's, and with a list that already names a, two entries reach a.
func TestReflectedPeerNotSkipped(t *testing.T) {
	a, b := groupServer(t), groupServer(t)
	aAddr, bAddr := a.Addr().String(), b.Addr().String()
	c := groupServer(t, aAddr, bAddr) // c's own list: the other two
	cAddr := c.Addr().String()
	src := shmRegion(t, testRows, testRowBytes)
	fillHalf(src.Row(2), 2)

	for name, list := range map[string][]string{
		"node by node": {bAddr, cAddr},
		"shared list":  {aAddr, bAddr, cAddr},
	} {
		m := reflectingMirror(t, a, list, bAddr)
		waitFor(t, name+": the reflection noticed", func() bool {
			for _, p := range m.Stats() {
				if p.Addr == bAddr {
					return strings.Contains(p.LastError, "reaches this node itself, and it is not skipped")
				}
			}
			return false
		})
		if m.Healthy() {
			t.Errorf("%s: a reflected peer was skipped: %+v", name, m.Stats())
		}
		if err := m.MirrorRow(context.Background(), src, 2, src.Row(2)); err == nil {
			t.Errorf("%s: a row counted as mirrored while peer b never got it", name)
		}
	}
}

func TestListensAt(t *testing.T) {
	any4 := &net.TCPAddr{IP: net.IPv4zero, Port: 7470}
	one := &net.TCPAddr{IP: net.ParseIP("10.0.0.1"), Port: 7470}
	local := []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1")}
	for _, tc := range []struct {
		peer   string
		listen *net.TCPAddr
		want   bool
	}{
		{"10.0.0.1:7470", any4, true},
		{"127.0.0.1:7470", any4, true},
		{"[fd00::1]:7470", any4, true},
		{"[::ffff:10.0.0.1]:7470", any4, true},
		{"10.0.0.2:7470", any4, false}, // another node
		{"10.0.0.1:7471", any4, false}, // another daemon on this host
		{"node-a:7470", any4, false},   // names are left to the handshake
		{"10.0.0.1:7470", one, true},
		{"127.0.0.1:7470", one, false}, // a listener on one address only
		{"10.0.0.1:7470", nil, false},
	} {
		if got := listensAt(tc.peer, tc.listen, local); got != tc.want {
			t.Errorf("listensAt(%q, %v) = %v, want %v", tc.peer, tc.listen, got, tc.want)
		}
	}
}
