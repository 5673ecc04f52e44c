package rowsync

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// startNode starts a node over region; peers may be empty.
func startNode(t *testing.T, region *Region, mode Mode, peers ...string) *Node {
	t.Helper()
	n, err := Start(Config{
		Listen:     "127.0.0.1:0",
		Peers:      peers,
		Secret:     testSecret,
		Replicated: mode,
		Region:     func(int) (*Region, error) { return region, nil },
		RowBytes:   region.RowBytes(),
		Logf:       discard,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// store has both nodes' workers write the same block (replicated KV) or
// different ones into row, and node a note the store.
func store(t *testing.T, a *Node, ra, rb *Region, row int, replicated bool) error {
	fillHalf(ra.Row(row), uint64(row))
	fillHalf(rb.Row(row), uint64(row))
	if !replicated {
		rb.Row(row)[0] ^= 1
	}
	return a.StoreDone(context.Background(), ra, fmt.Sprintf("%064x_g0", row), bytes.Clone(ra.Row(row)))
}

func TestNodeMirrorsPromotions(t *testing.T) {
	ra, rb := shmRegion(t, testRows, testRowBytes), shmRegion(t, testRows, testRowBytes)
	b := startNode(t, rb, ModeAuto)
	a := startNode(t, ra, ModeAuto, b.Addr().String())
	waitFor(t, "peer up", a.mirror.Healthy)
	if a.ServeLoads() {
		t.Fatal("auto serves loads before any store sample")
	}
	if err := a.LoadDone(context.Background(), ra, bytes.Clone(ra.Row(0))); !errors.Is(err, ErrNotReplicated) {
		t.Fatalf("LoadDone before evidence = %v", err)
	}
	for row := range 4 {
		if err := store(t, a, ra, rb, row, true); err != nil {
			t.Fatal(err)
		}
	}
	if !a.ServeLoads() || !a.Gate().Allowed() || !b.Gate().Allowed() {
		t.Fatalf("identical samples did not enable mirroring: a %+v, b %+v", a.Gate().Snapshot(), b.Gate().Snapshot())
	}

	// Promotions fill rows 4..11 of a's region only; b's hold stale bytes.
	promoted := map[int][]byte{}
	for row := 4; row < 12; row++ {
		fillHalf(rb.Row(row), 500+uint64(row))
		fillHalf(ra.Row(row), 900+uint64(row))
		promoted[row] = bytes.Clone(ra.Row(row))
	}
	single := startNode(t, ra, ModeOn) // no peers: the field's setup
	for row, block := range promoted {
		if err := single.LoadDone(context.Background(), ra, block); err != nil {
			t.Fatal(err)
		}
		if bytes.Equal(rb.Row(row), ra.Row(row)) {
			t.Fatalf("row %d identical without mirroring", row)
		}
	}
	for row, block := range promoted {
		if err := a.LoadDone(context.Background(), ra, block); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(rb.Row(row), ra.Row(row)) {
			t.Errorf("row %d differs after its close returned", row)
		}
	}

	// A stale copy elsewhere makes the row ambiguous; an unknown block has none.
	copy(ra.Row(12), ra.Row(4))
	if err := a.LoadDone(context.Background(), ra, promoted[4]); !errors.Is(err, errNoSingleRow) {
		t.Errorf("LoadDone(block in two rows) = %v", err)
	}
	if err := a.LoadDone(context.Background(), ra, make([]byte, testRowBytes-1)); !errors.Is(err, errNoSingleRow) {
		t.Errorf("LoadDone(short block) = %v", err)
	}

	snap := a.Snapshot()
	if snap.RowsMirrored != 8 || len(snap.Peers) != 1 {
		t.Errorf("snapshot %+v", snap)
	}
	if p := snap.Peers[0]; p.RowsSent != 8 || p.Verified != 8 || p.State != StateUp || p.Addr != b.Addr().String() {
		t.Errorf("peer %+v", p)
	}
	if in := b.Snapshot().Peers; len(in) != 1 || in[0].State != StateInbound || in[0].RowsReceived != 8 {
		t.Errorf("b's peers %+v", in)
	}
}

func TestNodeNotReplicated(t *testing.T) {
	ra, rb := shmRegion(t, testRows, testRowBytes), shmRegion(t, testRows, testRowBytes)
	b := startNode(t, rb, ModeAuto)
	a := startNode(t, ra, ModeAuto, b.Addr().String())
	waitFor(t, "peer up", a.mirror.Healthy)
	store(t, a, ra, rb, 0, true)
	if !a.ServeLoads() {
		t.Fatal("identical sample did not enable mirroring")
	}
	store(t, a, ra, rb, 1, false) // a head-sharded cache: the workers' rows differ
	if a.ServeLoads() || a.Gate().Allowed() || b.Gate().Allowed() {
		t.Fatal("auto still mirrors after a mismatch")
	}
	err := a.LoadDone(context.Background(), ra, bytes.Clone(ra.Row(0)))
	if !errors.Is(err, ErrNotReplicated) || !strings.Contains(err.Error(), "not replicated across ranks") {
		t.Errorf("LoadDone = %v", err)
	}
	if s := a.Snapshot().Replication; s.Mismatches != 1 || s.Samples != 1 || !strings.Contains(s.DecidedBy, fmt.Sprintf("%064x_g0", 1)) {
		t.Errorf("replication %+v", s)
	}
}

func TestNodeWithoutFlags(t *testing.T) {
	n, err := Start(Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	r := shmRegion(t, 2, block.PageSize)
	if n.Enabled() || !n.ServeLoads() || n.Addr() != nil {
		t.Error("a node without flags is not a no-op")
	}
	if n.LoadDone(context.Background(), r, make([]byte, 7)) != nil || n.StoreDone(context.Background(), r, "k", nil) != nil {
		t.Error("a node without flags failed a close")
	}
	if _, err := Start(Config{Peers: []string{"127.0.0.1:1"}, Secret: []byte("short")}); err == nil {
		t.Error("Start accepted a short secret")
	}
	if _, err := Start(Config{Peers: []string{"no-port"}, Secret: testSecret}); err == nil {
		t.Error("Start accepted a peer without a port")
	}
}

func TestServerSessionTakeover(t *testing.T) {
	dst := shmRegion(t, testRows, testRowBytes)
	s := startServer(t, "127.0.0.1:0", testSecret, dst)
	dial := func() *channel {
		conn, err := net.Dial("tcp", s.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		ch, _, err := clientHandshake(conn, presharedKey(testSecret), newNodeID(), 7)
		if err != nil {
			t.Fatal(err)
		}
		return ch
	}
	rowWrite := func(ch *channel, seed uint64) ([]byte, uint32) {
		data := make([]byte, testRowBytes)
		fillHalf(data, seed)
		lane, bulk := sealRow(t, ch, &RowWrite{Seq: seed, Row: 1, Rows: testRows, RowBytes: uint64(testRowBytes), CommitBy: neverLate, Key: freshKey(t), Extents: nonZeroExtents(data)})
		return append(lane, bulk...), block.CRC32C(data)
	}

	// The old connection has a row write half sent when the Mirror gives up
	// on it and reconnects.
	old := dial()
	waitFor(t, "the first connection serving the session", func() bool { s.mu.Lock(); defer s.mu.Unlock(); return s.sessions[7] != nil })
	stale, _ := rowWrite(old, 1)
	if _, err := old.conn.Write(stale[:len(stale)-1]); err != nil {
		t.Fatal(err)
	}
	conn := dial()
	fresh, crc := rowWrite(conn, 2)
	if _, err := conn.conn.Write(fresh); err != nil {
		t.Fatal(err)
	}
	frame, err := conn.readFrame(nil, maxAckFrame)
	if err != nil {
		t.Fatal(err)
	}
	if ack, err := Decode(frame); err != nil || ack.(*Ack).CRC != crc {
		t.Fatalf("ack %+v, %v", ack, err)
	}
	old.conn.Write(stale[len(stale)-1:])
	if _, err := old.readFrame(nil, maxAckFrame); err == nil {
		t.Error("the superseded connection still answers")
	}
	if block.CRC32C(dst.Row(1)) != crc {
		t.Error("a row from the superseded connection landed after its successor's")
	}
}
