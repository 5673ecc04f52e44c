package rowsync

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flynn/noise"
	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// Protocol 4's bulk records (channel.go): sealed once per row for every
// peer, under a key of the row's own, and refused when moved, replayed,
// changed or cut.

// sealedLen is the length of the sealed bulk of extents.
func sealedLen(extents []Extent) int {
	n := 0
	for _, e := range extents {
		n += len(e.Data)
	}
	return n + (n+maxRecordPlain-1)/maxRecordPlain*(2+tagBytes)
}

// TestRowSealedOnceForThreePeers mirrors a row twice to three peers, one
// lane each, and records what the Mirror wrote to each: every peer holds
// the row, the bulk each received is the same bytes (sealed once), and the
// second time, though the row is the same, another key made other bytes.
func TestRowSealedOnceForThreePeers(t *testing.T) {
	src := shmRegion(t, testRows, testRowBytes)
	fillHalf(src.Row(6), 6)
	var peers []string
	var dsts []*Region
	for range 3 {
		dst := shmRegion(t, testRows, testRowBytes)
		fillHalf(dst.Row(6), 66)
		dsts = append(dsts, dst)
		peers = append(peers, startServer(t, "127.0.0.1:0", testSecret, dst).Addr().String())
	}
	var mu sync.Mutex
	wire := map[string]*recordConn{}
	m, err := NewMirror(MirrorConfig{Peers: peers, Secret: testSecret, Deadline: 5 * time.Second, Logf: discard, Lanes: 1,
		Dial: func(ctx context.Context, addr string) (net.Conn, error) {
			conn, err := dialTCP(ctx, addr)
			if err != nil {
				return nil, err
			}
			rc := &recordConn{Conn: conn}
			mu.Lock()
			wire[addr] = rc
			mu.Unlock()
			return rc, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	waitFor(t, "peers up", m.Healthy)

	n := sealedLen(nonZeroExtents(src.Row(6)))
	var bulks [2][][]byte
	for round := range bulks {
		if err := m.MirrorRow(context.Background(), src, 6, bytes.Clone(src.Row(6))); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		for i, addr := range peers {
			rc := wire[addr]
			rc.mu.Lock()
			sent := rc.written.Bytes()
			bulks[round] = append(bulks[round], bytes.Clone(sent[len(sent)-n:]))
			if bytes.Contains(sent, src.Row(6)[:64]) {
				t.Errorf("peer %d: the row's bytes went over the wire in the clear", i)
			}
			rc.mu.Unlock()
			if !bytes.Equal(dsts[i].Row(6), src.Row(6)) {
				t.Errorf("round %d: peer %d does not hold the row", round, i)
			}
		}
		mu.Unlock()
		for i := 1; i < len(peers); i++ {
			if !bytes.Equal(bulks[round][i], bulks[round][0]) {
				t.Errorf("round %d: peer %d received other bulk records than peer 0", round, i)
			}
		}
	}
	if bytes.Equal(bulks[0][0], bulks[1][0]) {
		t.Error("the same row mirrored twice was sealed into the same bytes: a key was reused")
	}
}

// TestSealedBulkReleasedAtTheLastWrite checks that a row sealed for three
// lanes keeps its buffer until the third lane's write returned, and not a
// moment longer.
func TestSealedBulkReleasedAtTheLastWrite(t *testing.T) {
	data := make([]byte, bulkRowBytes)
	fillFull(data, 1)
	b, err := sealBulk(freshKey(t), nonZeroExtents(data), sealWorkers, 3)
	if err != nil {
		t.Fatal(err)
	}
	for lane := range 3 {
		if b.out == nil {
			t.Fatalf("the buffer went before lane %d's write returned", lane)
		}
		b.written()
	}
	if b.out != nil {
		t.Error("the buffer is still held after every lane's write returned")
	}
}

// TestSmallSealedBuffersAreNotPooled checks that the sealed buffers of an
// empty row and of a row of one page are not kept for later rows, which
// would take them from the pool and allocate afresh.
func TestSmallSealedBuffersAreNotPooled(t *testing.T) {
	for _, extents := range [][]Extent{nil, {{Off: 0, Data: make([]byte, minPageBytes)}}} {
		b, err := sealBulk(freshKey(t), extents, sealWorkers, 1)
		if err != nil {
			t.Fatal(err)
		}
		b.written()
		for {
			out, _ := sealedBuffers.Get().(*[]byte)
			if out == nil {
				break
			}
			if cap(*out) < pooledBytes {
				t.Errorf("a sealed buffer of %d bytes was pooled", cap(*out))
			}
		}
	}
}

// TestRowsAtOnceToThreePeers mirrors every row of a region from 16
// goroutines at once to three peers, twice with other bytes: rows of
// several bulk records whose extents (every third page zero) split them,
// so that records are gathered from two extents and sealed buffers reused.
func TestRowsAtOnceToThreePeers(t *testing.T) {
	src := shmRegion(t, testRows, bulkRowBytes)
	var peers []string
	var dsts []*Region
	for range 3 {
		dst := shmRegion(t, testRows, bulkRowBytes)
		dsts = append(dsts, dst)
		peers = append(peers, startServer(t, "127.0.0.1:0", testSecret, dst).Addr().String())
	}
	m := newMirror(t, testSecret, 10*time.Second, true, peers...)
	for round := range 2 {
		for i := range testRows {
			row := src.Row(i)
			fillFull(row, uint64(round*testRows+i))
			for p := 2; p*block.PageSize < len(row); p += 3 {
				clear(row[p*block.PageSize : (p+1)*block.PageSize])
			}
		}
		var wg sync.WaitGroup
		for i := range testRows {
			wg.Go(func() {
				if err := m.MirrorRow(context.Background(), src, i, bytes.Clone(src.Row(i))); err != nil {
					t.Errorf("round %d, row %d: %v", round, i, err)
				}
			})
		}
		wg.Wait()
		for p, dst := range dsts {
			for i := range testRows {
				if !bytes.Equal(dst.Row(i), src.Row(i)) {
					t.Errorf("round %d: peer %d's row %d differs", round, p, i)
				}
			}
		}
	}
}

// TestRowWriteDescribesItsBulk checks that a RowWrite written with a bulk
// carries the bulk's key and extents, whatever the caller left in it, and
// reads back as that row, and that writing it allocates only the frame's
// head, sized for its extent headers, and the one-piece list of it.
func TestRowWriteDescribesItsBulk(t *testing.T) {
	row := make([]byte, bulkRowBytes)
	fillHalf(row, 4)
	extents := nonZeroExtents(row)
	b, err := sealBulk(freshKey(t), extents, sealWorkers, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer b.written()
	w := &RowWrite{Seq: 1, Row: 2, Rows: testRows, RowBytes: bulkRowBytes, Key: freshKey(t), Extents: extents[:1]}
	ch := newChannel(scriptConn{Writer: io.Discard}, fixedCipher(), nil)
	var out bytes.Buffer
	ch.conn = scriptConn{Writer: &out}
	if err := ch.writeRow(w, b); err != nil {
		t.Fatal(err)
	}
	got, err := readMessage(newChannel(scriptConn{Reader: &out, Writer: io.Discard}, nil, fixedCipher()), MaxFrameBytes)
	if err != nil {
		t.Fatal(err)
	}
	if g := got.(*RowWrite); g.Key != b.key || !bytes.Equal(applyExtents(bulkRowBytes, g.Extents), row) {
		t.Error("the RowWrite read back is not the bulk's row")
	}
	ch.conn = scriptConn{Writer: io.Discard}
	if n := testing.AllocsPerRun(10, func() { ch.writeRow(w, b) }); n > 2 {
		t.Errorf("%v allocations to write a row of %d extents, want 2", n, len(extents))
	}
}

// cutConn is a connection that, once armed, lets two more writes through
// and then closes and fails every write.
type cutConn struct {
	net.Conn
	armed *atomic.Bool
	n     int // writes since armed
}

func (c *cutConn) Write(b []byte) (int, error) {
	if c.armed.Load() {
		if c.n++; c.n > 2 {
			c.Conn.Close()
			return 0, errors.New("cut")
		}
	}
	return c.Conn.Write(b)
}

// TestLaneCutMidBulkFailsOnlyItsPeer mirrors a row of two bulk chunks to
// two peers, one lane each, and cuts B's lane after the frame up to the
// bulk and the first chunk: the error names B alone, C holds the row, and
// B's row is as it was.
func TestLaneCutMidBulkFailsOnlyItsPeer(t *testing.T) {
	src := shmRegion(t, testRows, bulkRowBytes)
	fillFull(src.Row(3), 77)
	b, c := shmRegion(t, testRows, bulkRowBytes), shmRegion(t, testRows, bulkRowBytes)
	fillFull(b.Row(3), 1)
	stale := bytes.Clone(b.Row(3))
	sb, sc := startServer(t, "127.0.0.1:0", testSecret, b), startServer(t, "127.0.0.1:0", testSecret, c)
	var armed atomic.Bool
	m, err := NewMirror(MirrorConfig{Peers: []string{sb.Addr().String(), sc.Addr().String()}, Secret: testSecret,
		Deadline: 5 * time.Second, Logf: discard, Lanes: 1,
		Dial: func(ctx context.Context, addr string) (net.Conn, error) {
			conn, err := dialTCP(ctx, addr)
			if err != nil || addr != sb.Addr().String() {
				return conn, err
			}
			return &cutConn{Conn: conn, armed: &armed}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	waitFor(t, "peers up", m.Healthy)
	armed.Store(true)
	err = m.MirrorRow(context.Background(), src, 3, bytes.Clone(src.Row(3)))
	if err == nil || !strings.Contains(err.Error(), sb.Addr().String()) || strings.Contains(err.Error(), sc.Addr().String()) {
		t.Fatalf("MirrorRow = %v, want an error naming %s alone", err, sb.Addr())
	}
	if !bytes.Equal(c.Row(3), src.Row(3)) {
		t.Error("C lacks the row")
	}
	if !bytes.Equal(b.Row(3), stale) {
		t.Error("B's row changed")
	}
}

// TestRowKeyNeverInTheClear: the key a row's bulk is sealed under travels
// only inside the lane's records.
func TestRowKeyNeverInTheClear(t *testing.T) {
	row := make([]byte, 4*testRowBytes)
	fillHalf(row, 9)
	w := &RowWrite{Seq: 1, Row: 2, Rows: testRows, RowBytes: uint64(len(row)), Key: freshKey(t), Extents: nonZeroExtents(row)}
	if !bytes.Contains(Encode(w), w.Key[:]) {
		t.Fatal("the scan would not find the key in the frame's plaintext")
	}
	ch := newChannel(scriptConn{Writer: io.Discard}, fixedCipher(), nil)
	lane, bulk := sealRow(t, ch, w)
	if bytes.Contains(lane, w.Key[:]) || bytes.Contains(bulk, w.Key[:]) {
		t.Error("the row's key went over the wire in the clear")
	}
}

// bulkCase is a server on a region of rows of bulkRowBytes, each of them
// stale, and lines it logged.
type bulkCase struct {
	s    *Server
	dst  *Region
	mu   sync.Mutex
	logs []string
}

// bulkRowBytes is a row whose bulk takes five bulk records, the last short.
const bulkRowBytes = 64 * 4096

func newBulkCase(t *testing.T) *bulkCase {
	c := &bulkCase{dst: shmRegion(t, testRows, bulkRowBytes)}
	for i := range testRows {
		fillFull(c.dst.Row(i), uint64(100+i))
	}
	s, err := StartServer(ServerConfig{Listen: "127.0.0.1:0", Secret: testSecret, RowBytes: bulkRowBytes,
		Region: func(int) (*Region, error) { return c.dst, nil },
		Logf: func(format string, args ...any) {
			c.mu.Lock()
			c.logs = append(c.logs, fmt.Sprintf(format, args...))
			c.mu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	c.s = s
	return c
}

// fillFull fills row with pseudo-random bytes from seed, no page zero.
func fillFull(row []byte, seed uint64) {
	rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8)}).Read(row)
	for i := 0; i < len(row); i += block.PageSize {
		row[i] |= 1
	}
}

// dial returns the channel of a new connection (session) to the server.
func (c *bulkCase) dial(t *testing.T) *channel {
	conn, err := net.Dial("tcp", c.s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, _, err := clientHandshake(conn, presharedKey(testSecret), newNodeID(), rand.Uint64())
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// row seals a RowWrite of row of fresh content, under a fresh key, as ch's
// next frame, and returns its lane records and its bulk records one by one.
func (c *bulkCase) row(t *testing.T, ch *channel, row int, seed uint64) (lane []byte, records [][]byte) {
	data := make([]byte, bulkRowBytes)
	fillFull(data, seed)
	lane, bulk := sealRow(t, ch, &RowWrite{Seq: seed, Row: uint32(row), Rows: testRows, RowBytes: bulkRowBytes, CommitBy: neverLate, Key: freshKey(t), Extents: nonZeroExtents(data)})
	for len(bulk) > 0 {
		n := 2 + int(binary.BigEndian.Uint16(bulk))
		records, bulk = append(records, bulk[:n:n]), bulk[n:]
	}
	if len(records) != 5 {
		t.Fatalf("%d bulk records, want 5", len(records))
	}
	return lane, records
}

// send writes the pieces to ch's connection, until a write fails: the
// server ends the connection at the first record that fails.
func send(ch *channel, pieces ...[]byte) {
	for _, p := range pieces {
		if _, err := ch.conn.Write(p); err != nil {
			return
		}
	}
}

// refused checks that the server ended ch's connection without an answer,
// logged why (a line containing why) and left rows as they were (before).
func (c *bulkCase) refused(t *testing.T, what string, ch *channel, before map[int][]byte, why string) {
	t.Helper()
	if m, err := readMessage(ch, maxAckFrame); err == nil {
		t.Errorf("%s: the server answered %+v", what, m)
	}
	c.logged(t, what, why)
	for row, b := range before {
		if !bytes.Equal(c.dst.Row(row), b) {
			t.Errorf("%s: row %d changed", what, row)
		}
	}
}

// logged waits for a line of the server's containing why.
func (c *bulkCase) logged(t *testing.T, what, why string) {
	t.Helper()
	waitFor(t, what+": the failure logged", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, l := range c.logs {
			if strings.Contains(l, why) {
				return true
			}
		}
		return false
	})
}

// counted waits until the server counted n more failed authentications
// than *failures, and adds them to it.
func (c *bulkCase) counted(t *testing.T, failures *uint64, n uint64) {
	t.Helper()
	*failures += n
	waitFor(t, "the failures counted", func() bool { return c.s.AuthFailures() == *failures })
}

func TestBulkRecordsMovedChangedOrCutAreRefused(t *testing.T) {
	c := newBulkCase(t)
	const notOpened = "failed authentication: changed, moved, replayed or not sealed under this row's key"
	snapshot := func(rows ...int) map[int][]byte {
		m := map[int][]byte{}
		for _, r := range rows {
			m[r] = bytes.Clone(c.dst.Row(r))
		}
		return m
	}
	var failures uint64

	t.Run("flipped bit", func(t *testing.T) {
		ch := c.dial(t)
		before := snapshot(1)
		lane, recs := c.row(t, ch, 1, 1)
		recs[2] = bytes.Clone(recs[2])
		recs[2][1000] ^= 0x10
		send(ch, append([][]byte{lane}, recs...)...)
		c.refused(t, "flipped bit", ch, before, "bulk record 2 "+notOpened)
		c.counted(t, &failures, 1)
	})

	t.Run("moved within the row", func(t *testing.T) {
		ch := c.dial(t)
		before := snapshot(1)
		lane, recs := c.row(t, ch, 1, 2)
		recs[0], recs[1] = recs[1], recs[0]
		send(ch, append([][]byte{lane}, recs...)...)
		c.refused(t, "moved", ch, before, "bulk record 0 "+notOpened)
		c.counted(t, &failures, 1)
	})

	t.Run("replayed from an earlier row", func(t *testing.T) {
		ch := c.dial(t)
		lane, earlier := c.row(t, ch, 2, 3)
		send(ch, append([][]byte{lane}, earlier...)...)
		if m, err := readMessage(ch, maxAckFrame); err != nil || m.(*Ack).Err != "" {
			t.Fatalf("the earlier row: %+v, %v", m, err)
		}
		before := snapshot(1, 2)
		lane, recs := c.row(t, ch, 1, 4)
		recs[3] = earlier[3]
		send(ch, append([][]byte{lane}, recs...)...)
		c.refused(t, "replayed", ch, before, "bulk record 3 "+notOpened)
		c.counted(t, &failures, 1)
	})

	t.Run("swapped between two rows' streams", func(t *testing.T) {
		ch1, ch2 := c.dial(t), c.dial(t)
		before := snapshot(3, 4)
		lane1, recs1 := c.row(t, ch1, 3, 5)
		lane2, recs2 := c.row(t, ch2, 4, 6)
		recs1[1], recs2[1] = recs2[1], recs1[1]
		send(ch1, append([][]byte{lane1}, recs1...)...)
		send(ch2, append([][]byte{lane2}, recs2...)...)
		c.refused(t, "swapped, first stream", ch1, before, "bulk record 1 "+notOpened)
		c.refused(t, "swapped, second stream", ch2, before, "bulk record 1 "+notOpened)
		c.counted(t, &failures, 2)
	})

	t.Run("dropped", func(t *testing.T) {
		ch := c.dial(t)
		before := snapshot(1)
		lane, recs := c.row(t, ch, 1, 7)
		send(ch, append([][]byte{lane}, append(recs[:1:1], recs[2:]...)...)...)
		c.refused(t, "dropped", ch, before, "bulk record 1 "+notOpened)
		c.counted(t, &failures, 1)
	})

	for _, tc := range []struct {
		name  string
		delta int
	}{{"truncated", -1}, {"lengthened", +1}} {
		t.Run(tc.name, func(t *testing.T) {
			ch := c.dial(t)
			before := snapshot(1)
			lane, recs := c.row(t, ch, 1, 8)
			last := bytes.Clone(recs[4])
			if tc.delta < 0 {
				last = last[:len(last)-1]
			} else {
				last = append(last, 0)
			}
			binary.BigEndian.PutUint16(last, uint16(len(last)-2))
			recs[4] = last
			// The next frame follows, as it would on a live lane.
			next, err := written(ch, func() error { return ch.writeMessage(&StoreSample{Rows: 1, RowBytes: 1}) })
			if err != nil {
				t.Fatal(err)
			}
			send(ch, append(append([][]byte{lane}, recs...), next)...)
			want := fmt.Sprintf("bulk record 4 holds %d bytes, its place in the bulk %d", len(last)-2-tagBytes, bulkRowBytes-4*maxRecordPlain)
			c.refused(t, tc.name, ch, before, want)
			c.counted(t, &failures, 1)
		})
	}

	t.Run("a record after the bulk", func(t *testing.T) {
		// The row arrived whole and lands; the record after it is read as
		// the lane's next and fails there.
		ch := c.dial(t)
		lane, recs := c.row(t, ch, 5, 9)
		send(ch, append(append([][]byte{lane}, recs...), recs[4])...)
		if m, err := readMessage(ch, maxAckFrame); err != nil || m.(*Ack).Err != "" {
			t.Fatalf("the row before the extra record: %+v, %v", m, err)
		}
		c.refused(t, "a record after the bulk", ch, snapshot(5), "failed authentication: changed, replayed, reordered or not sealed by the peer")
		c.counted(t, &failures, 1)
	})
}

// oldHandshake is a side of protocol 3's handshake: the prologue named
// version 3.
func oldHandshake(t *testing.T, initiator bool) *noise.HandshakeState {
	hs, err := noise.NewHandshakeState(noise.Config{CipherSuite: cipherSuite, Pattern: noise.HandshakeNN, Initiator: initiator,
		Prologue: []byte("kvtierfs rowsync 3"), PresharedKey: presharedKey(testSecret)})
	if err != nil {
		t.Fatal(err)
	}
	return hs
}

// TestProtocol3IsRefused: a daemon of protocol 3 and one of protocol 4
// holding the same secret fail the handshake either way, each told that
// the other speaks another version (or holds another secret).
func TestProtocol3IsRefused(t *testing.T) {
	c := newBulkCase(t)
	conn, err := net.Dial("tcp", c.s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hello, _, _, err := oldHandshake(t, true).WriteMessage(nil, Encode(&Hello{Session: 1, Node: newNodeID(), To: c.s.Addr().String()}))
	if err != nil {
		t.Fatal(err)
	}
	if err := writeHandshake(conn, hello); err != nil {
		t.Fatal(err)
	}
	if _, err := readHandshake(conn); !errors.Is(err, errAnswerRefused) {
		t.Errorf("a protocol 3 client was answered %v", err)
	}
	c.logged(t, "a protocol 3 client", "the client does not know the shared secret (or speaks another protocol version)")
	var failures uint64
	c.counted(t, &failures, 1)

	// A listener of protocol 3 cannot open a protocol 4 Hello, and
	// refuses it, as protocol 3 does.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	opened := make(chan error, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			opened <- err
			return
		}
		defer conn.Close()
		msg, err := readHandshake(conn)
		if err == nil {
			_, _, _, err = oldHandshake(t, false).ReadMessage(nil, msg)
			conn.Write([]byte{0xff, 0xff}) // answerRefused
		}
		opened <- err
		io.Copy(io.Discard, conn)
	}()
	conn, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, _, err := clientHandshake(conn, presharedKey(testSecret), newNodeID(), 2); !errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), "another protocol version") {
		t.Errorf("a protocol 4 client to a protocol 3 listener: %v", err)
	}
	if err := <-opened; err == nil {
		t.Error("a protocol 3 listener opened a protocol 4 Hello")
	}
}
