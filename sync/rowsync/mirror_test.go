package rowsync

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

const testRows = 16

var testRowBytes = 16 * block.PageSize

// startServer serves region on addr ("127.0.0.1:0" for any port).
func startServer(t *testing.T, addr string, secret []byte, region *Region) *Server {
	t.Helper()
	s, err := StartServer(ServerConfig{
		Listen:   addr,
		Secret:   secret,
		Region:   func(int) (*Region, error) { return region, nil },
		RowBytes: region.RowBytes(),
		Logf:     discard,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// newMirror starts a Mirror to addrs and waits until it is healthy unless
// told not to.
func newMirror(t *testing.T, secret []byte, deadline time.Duration, wait bool, addrs ...string) *Mirror {
	t.Helper()
	m, err := NewMirror(MirrorConfig{Peers: addrs, Secret: secret, Deadline: deadline, Logf: discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	if wait {
		waitFor(t, "peers up", m.Healthy)
	}
	return m
}

func TestMirrorTwoServers(t *testing.T) {
	src := shmRegion(t, testRows, testRowBytes)
	b, c := shmRegion(t, testRows, testRowBytes), shmRegion(t, testRows, testRowBytes)
	for i := range testRows {
		fillHalf(b.Row(i), 1000+uint64(i)) // stale rows that must be overwritten,
		fillHalf(c.Row(i), 2000+uint64(i)) // zero halves included
		b.Row(i)[testRowBytes-1], c.Row(i)[testRowBytes-1] = 0xff, 0xff
	}
	sb := startServer(t, "127.0.0.1:0", testSecret, b)
	sc := startServer(t, "127.0.0.1:0", testSecret, c)
	m := newMirror(t, testSecret, 0, true, sb.Addr().String(), sc.Addr().String())

	// Promotions land in src's rows only; each is mirrored, up to 8 at a time.
	var wg sync.WaitGroup
	errs := make([]error, testRows)
	for i := range testRows {
		fillHalf(src.Row(i), uint64(i))
		wg.Go(func() { errs[i] = m.MirrorRow(context.Background(), src, i, bytes.Clone(src.Row(i))) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	want := rowHashes(src)
	for name, r := range map[string]*Region{"b": b, "c": c} {
		for i, h := range rowHashes(r) {
			if h != want[i] {
				t.Errorf("row %d of %s differs from the source", i, name)
			}
		}
	}
	extents := nonZeroExtents(src.Row(0))
	var payload uint64
	for _, e := range extents {
		payload += uint64(len(e.Data))
	}
	for _, ps := range m.Stats() {
		if ps.State != StateUp || ps.RowsSent != testRows || ps.Verified != testRows || ps.LastError != "" {
			t.Errorf("peer stats %+v", ps)
		}
		if ps.Bytes != testRows*payload || payload != uint64(testRowBytes/2-block.PageSize) {
			t.Errorf("%d bytes sent, want %d: zero pages must not travel", ps.Bytes, testRows*payload)
		}
	}
}

func TestMirrorPeerRestart(t *testing.T) {
	src := shmRegion(t, testRows, testRowBytes)
	path := shmFile(t, testRows*testRowBytes)
	dst := openRegion(t, path, testRowBytes)
	s := startServer(t, "127.0.0.1:0", testSecret, dst)
	addr := s.Addr().String()
	m := newMirror(t, testSecret, 2*time.Second, true, addr)

	// A storm of promotions: each worker owns some rows and checks, whenever
	// MirrorRow says yes, that the peer's row really is the new one.
	var stop atomic.Bool
	var failures, successes atomic.Int64
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for gen := uint64(0); !stop.Load(); gen++ {
				row := w + 4*int(gen%4)
				data := make([]byte, testRowBytes)
				fillHalf(data, gen<<8|uint64(row))
				copy(src.Row(row), data)
				if err := m.MirrorRow(context.Background(), src, row, data); err != nil {
					failures.Add(1)
					continue
				}
				successes.Add(1)
				if !bytes.Equal(dst.Row(row), data) {
					t.Errorf("row %d acknowledged but stale on the peer", row)
				}
			}
		})
	}
	waitFor(t, "rows mirrored", func() bool { return successes.Load() > 20 })
	s.Close() // the peer dies mid-storm
	waitFor(t, "mirror unhealthy", func() bool { return !m.Healthy() })
	waitFor(t, "a failed promotion", func() bool { return failures.Load() > 0 })
	if err := m.MirrorRow(context.Background(), src, 0, bytes.Clone(src.Row(0))); !errors.Is(err, ErrPeerDown) {
		t.Errorf("MirrorRow to a dead peer = %v, want ErrPeerDown", err)
	}

	startServer(t, addr, testSecret, dst) // back on the same address
	waitFor(t, "mirror healthy again", m.Healthy)
	before := successes.Load()
	waitFor(t, "promotions resumed", func() bool { return successes.Load() > before+20 })
	stop.Store(true)
	wg.Wait()
	if st := m.Stats()[0]; st.State != StateUp || st.Verified != uint64(successes.Load()) {
		t.Errorf("stats %+v, %d successes", st, successes.Load())
	}
}

func TestMirrorWrongSecret(t *testing.T) {
	dst := shmRegion(t, testRows, testRowBytes)
	s := startServer(t, "127.0.0.1:0", testSecret, dst)
	m := newMirror(t, []byte("kvtier-test-not-the-secret"), 0, false, s.Addr().String())
	waitFor(t, "refusal counted", func() bool { return s.AuthFailures() >= 1 })
	waitFor(t, "client-side error", func() bool { return strings.Contains(m.Stats()[0].LastError, "it refused this node") })
	src := shmRegion(t, testRows, testRowBytes)
	fillHalf(src.Row(1), 1)
	if err := m.MirrorRow(context.Background(), src, 1, bytes.Clone(src.Row(1))); !errors.Is(err, ErrPeerDown) {
		t.Errorf("MirrorRow without authentication = %v", err)
	}
	if m.Healthy() || !block.IsZero(dst.Row(1)) {
		t.Error("an unauthenticated mirror got through")
	}
	if m.AuthFailures() == 0 {
		t.Error("the mirror counted no authentication failure")
	}

	// A client that is no peer at all.
	n := s.AuthFailures()
	conn, err := net.Dial("tcp", s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	conn.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
	conn.Close()
	waitFor(t, "garbage counted", func() bool { return s.AuthFailures() > n })
}

// lyingPeer speaks the protocol but acknowledges every row with a wrong CRC32C.
func lyingPeer(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer conn.Close()
				ch, _, err := serverHandshake(conn, presharedKey(testSecret), &Welcome{Node: newNodeID()}, nil)
				if err != nil {
					return
				}
				for {
					msg, err := readMessage(ch, MaxRowBytes)
					if err != nil {
						return
					}
					w, ok := msg.(*RowWrite)
					if !ok { // the connection's fence (connect)
						ch.writeMessage(&Ack{Seq: msg.(*StoreSample).Seq})
						continue
					}
					crc := block.CRC32C(applyExtents(w.RowBytes, w.Extents))
					ch.writeMessage(&Ack{Seq: w.Seq, Row: w.Row, CRC: crc ^ 1})
				}
			})
		}
	})
	return ln.Addr().String()
}

func TestMirrorLyingPeer(t *testing.T) {
	src := shmRegion(t, testRows, testRowBytes)
	fillHalf(src.Row(2), 2)
	m := newMirror(t, testSecret, 0, true, lyingPeer(t))
	err := m.MirrorRow(context.Background(), src, 2, bytes.Clone(src.Row(2)))
	if err == nil || !strings.Contains(err.Error(), "acknowledged row 2 with CRC32C") {
		t.Fatalf("MirrorRow to a lying peer = %v", err)
	}
	if m.Healthy() {
		t.Error("a lying peer is still healthy")
	}
	if st := m.Stats()[0]; st.Verified != 0 || !strings.Contains(st.LastError, "CRC32C") {
		t.Errorf("stats %+v", st)
	}
}

func TestMirrorGeometryMismatch(t *testing.T) {
	src := shmRegion(t, testRows, testRowBytes)
	s := startServer(t, "127.0.0.1:0", testSecret, shmRegion(t, testRows+1, testRowBytes))
	m := newMirror(t, testSecret, 0, true, s.Addr().String())
	err := m.MirrorRow(context.Background(), src, 0, bytes.Clone(src.Row(0)))
	want := fmt.Sprintf("geometry mismatch: sender has %d rows of %d bytes, receiver %d rows of %[2]d bytes", testRows, testRowBytes, testRows+1)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("MirrorRow across geometries = %v", err)
	}
	if err := m.MirrorRow(context.Background(), src, testRows, make([]byte, testRowBytes)); err == nil {
		t.Error("MirrorRow of a row past the region succeeded")
	}
}

func TestMirrorSlowPeer(t *testing.T) {
	// A peer that authenticates, answers its connections' first request
	// (their fence, connect) and then never answers.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	conns := make(chan net.Conn, 4)
	t.Cleanup(func() {
		ln.Close()
		close(conns)
		for c := range conns {
			c.Close()
		}
	})
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			ch, _, err := serverHandshake(conn, presharedKey(testSecret), &Welcome{Node: newNodeID()}, nil)
			if err == nil {
				_, err = ch.readFrame(nil, maxRequestFrame)
			}
			if err == nil {
				err = ch.writeMessage(&Ack{})
			}
			if err == nil {
				conns <- conn
			}
		}
	}()
	src := shmRegion(t, testRows, testRowBytes)
	m := newMirror(t, testSecret, 300*time.Millisecond, true, ln.Addr().String())
	err = m.MirrorRow(context.Background(), src, 0, bytes.Clone(src.Row(0)))
	if err == nil || !strings.Contains(err.Error(), "no acknowledgement before the deadline") {
		t.Errorf("MirrorRow to a silent peer = %v", err)
	}
	if m.Healthy() {
		t.Error("a silent peer is still healthy")
	}
}

// TestPeerUpDownLoggedOnce connects a Mirror of four lanes to a server, then
// stops the server: the peer's coming up and going down are logged once
// each, not once per lane. The counts are read after Close, when every
// lane's goroutine has ended: a lane logs just after its state changes, so
// a count read when the states show the change can miss the line.
func TestPeerUpDownLoggedOnce(t *testing.T) {
	s := startServer(t, "127.0.0.1:0", testSecret, shmRegion(t, testRows, testRowBytes))
	var mu sync.Mutex
	var logged []string
	logf := func(format string, args ...any) {
		mu.Lock()
		logged = append(logged, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	count := func(part string) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, line := range logged {
			if strings.Contains(line, part) {
				n++
			}
		}
		return n
	}
	m, err := NewMirror(MirrorConfig{Peers: []string{s.Addr().String()}, Secret: testSecret, Lanes: 4, Logf: logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	waitFor(t, "peer up", m.Healthy)
	waitFor(t, "the peer's coming up logged", func() bool { return count(" up") > 0 })
	s.Close()
	waitFor(t, "every lane down", func() bool {
		for _, p := range m.peers[0].lanes {
			if p.snapshot().State != StateDown {
				return false
			}
		}
		return true
	})
	m.Close()
	if n := count(" up"); n != 1 {
		t.Errorf("the peer coming up over 4 lanes was logged %d times: %q", n, logged)
	}
	if n := count(" down"); n != 1 {
		t.Errorf("the peer going down over 4 lanes was logged %d times: %q", n, logged)
	}
}

// TestMirrorRefusesMoreExtentsThanPages: a sender given more extents than a
// row may have (one per 4 KiB) says so itself, before anything is sealed,
// instead of every peer refusing the frame.
func TestMirrorRefusesMoreExtentsThanPages(t *testing.T) {
	s := startServer(t, "127.0.0.1:0", testSecret, shmRegion(t, testRows, testRowBytes))
	m, err := NewMirror(MirrorConfig{Peers: []string{s.Addr().String()}, Secret: testSecret, Logf: discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	waitFor(t, "peer up", m.Healthy)
	region := shmRegion(t, testRows, testRowBytes)
	data := region.Row(1)
	var extents []Extent
	for off := 0; off < len(data); off += 2 {
		extents = append(extents, Extent{Off: uint64(off), Data: data[off : off+1]})
	}
	err = m.mirror(context.Background(), region, 1, data, extents, func() uint32 { return 0 }, func() {})
	if err == nil || !strings.Contains(err.Error(), "more than the") {
		t.Fatalf("mirror of %d extents of a %d-byte row: %v, want a refusal naming the bound", len(extents), len(data), err)
	}
	if st := m.Stats(); len(st) != 1 || st[0].RowsSent != 0 {
		t.Errorf("peers' stats after the refusal: %+v, want no row sent", st)
	}
}
