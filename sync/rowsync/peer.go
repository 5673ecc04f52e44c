package rowsync

import (
	"context"
	"errors"
	"fmt"
	"log"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// DefaultDeadline is how long a peer may take to acknowledge a row when
// MirrorConfig.Deadline is zero.
const DefaultDeadline = 2 * time.Second

// Reconnection backoff: it doubles from minBackoff up to maxBackoff after
// each failed attempt, and restarts from minBackoff after a connection that
// stayed up for maxBackoff or longer.
const (
	minBackoff = 20 * time.Millisecond
	maxBackoff = time.Second
)

// Peer states as stat shows them.
const (
	StateConnecting = "connecting" // not connected yet since start
	StateUp         = "up"         // authenticated connection, no failure since
	StateDown       = "down"       // the last connection or attempt failed; retrying
)

// ErrPeerDown is wrapped by the errors of requests to a peer that has no
// authenticated connection right now.
var ErrPeerDown = errors.New("rowsync: peer down")

// MirrorConfig configures a Mirror.
type MirrorConfig struct {
	Peers    []string                         // host:port of every peer's Server; may include this node's own (self.go)
	Listen   net.Addr                         // this node's Server, to recognise its own entry; nil: none
	Secret   []byte                           // shared secret, at least MinSecretBytes
	Node     NodeID                           // this node, as its Server knows it; zero: a random one
	Deadline time.Duration                    // per row and peer; 0: DefaultDeadline
	Logf     func(format string, args ...any) // nil: log.Printf
	// Dial connects to a peer's address; nil: TCP with keepalive. The
	// connection's RemoteAddr must be the address it reached (see auth.go).
	Dial func(ctx context.Context, addr string) (net.Conn, error)
	// Lanes is how many connections each peer gets; 0: DefaultLanes.
	Lanes int
}

// DefaultLanes is MirrorConfig.Lanes's default. Rows to one peer are spread
// over its lanes, so that sealing, opening and copying rows run on several
// cores at each end instead of one connection's pair of goroutines.
const DefaultLanes = 4

// Mirror is the sending side: it keeps Lanes authenticated connections to
// each peer, reconnecting each with backoff, and copies every row to all
// peers, each over one of its lanes.
type Mirror struct {
	peers    []*peerLanes
	peerList PeerListDigest // of cfg.Peers
	deadline time.Duration
	cancel   context.CancelFunc // stops the connection loops
	wg       sync.WaitGroup     // the peers' connection loops
}

// PeerStats describes one peer for stat. RowsSent and Bytes count rows (and
// their non-zero bytes) written to the peer, Verified the rows it
// acknowledged with the right CRC32C; RowsReceived counts rows this node's
// Server received from the peer's address (Node fills it in).
type PeerStats struct {
	Addr         string
	State        string
	RowsSent     uint64
	RowsReceived uint64
	Bytes        uint64
	LastError    string
	Verified     uint64
}

// Serving reports whether the entry keeps nothing from being mirrored: a
// peer that is up, one that only sends rows here, or this node itself.
func (s PeerStats) Serving() bool {
	return s.State == StateUp || s.State == StateInbound || s.State == StateSelf
}

// NewMirror starts connecting to every peer in the background.
func NewMirror(cfg MirrorConfig) (*Mirror, error) {
	if err := checkSecret(cfg.Secret); err != nil {
		return nil, err
	}
	if cfg.Deadline <= 0 {
		cfg.Deadline = DefaultDeadline
	}
	if err := checkDeadline(cfg.Deadline); err != nil {
		return nil, err
	}
	if cfg.Logf == nil {
		cfg.Logf = log.Printf
	}
	if cfg.Node == (NodeID{}) {
		cfg.Node = newNodeID()
	}
	if cfg.Dial == nil {
		cfg.Dial = dialTCP
	}
	if cfg.Lanes <= 0 {
		cfg.Lanes = DefaultLanes
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &Mirror{deadline: cfg.Deadline, cancel: cancel, peerList: peerListDigest(cfg.Peers)}
	psk := presharedKey(cfg.Secret)
	listen, _ := cfg.Listen.(*net.TCPAddr)
	localIPs := interfaceIPs()
	for _, addr := range cfg.Peers {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			cancel()
			return nil, fmt.Errorf("rowsync: peer %q: %w", addr, err)
		}
		pl := &peerLanes{addr: addr, literalSelf: listensAt(addr, listen, localIPs), logf: cfg.Logf}
		m.peers = append(m.peers, pl)
		if pl.literalSelf {
			cfg.Logf("rowsync: peer %s is this node's own address: skipped", addr)
			continue
		}
		for range cfg.Lanes {
			// Each lane is a session of its own (see Hello), so the peer's
			// Server keeps them side by side.
			pl.lanes = append(pl.lanes, &peer{addr: addr, psk: psk, node: cfg.Node, session: rand.Uint64(), dial: cfg.Dial, changed: pl.logChange, state: StateConnecting})
		}
	}
	// Lanes start once every list is built: a lane's state change reads
	// its peer's lanes (logChange), and the self check the other peers.
	for _, pl := range m.peers {
		for _, p := range pl.lanes {
			m.wg.Go(func() { p.run(ctx) })
		}
	}
	return m, nil
}

// peerLanes is one entry of the peer list and the connections (lanes) to it;
// an entry that is this node's own address has none.
type peerLanes struct {
	addr        string
	literalSelf bool // names this node's own listening address (self.go)
	lanes       []*peer
	next        atomic.Uint32
	logf        func(format string, args ...any)

	mu     sync.Mutex // guards logged
	logged string     // the state last logged
}

// logChange logs the peer going up or down, or reaching this node itself,
// once for all its lanes (the peer is up when every lane is) and once per
// change of state: stat shows its latest error.
func (pl *peerLanes) logChange() {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	s := pl.snapshot()
	if s.State == pl.logged {
		return
	}
	switch s.State {
	case StateUp:
		pl.logf("rowsync: peer %s up", s.Addr)
	case StateDown:
		pl.logf("rowsync: peer %s down: %s", s.Addr, s.LastError)
	case StateSelf:
		pl.logf("rowsync: peer %s reaches this node itself", s.Addr)
	}
	pl.logged = s.State
}

// reachedSelf reports whether every lane's last handshake reached this node.
func (pl *peerLanes) reachedSelf() bool {
	for _, p := range pl.lanes {
		if p.snapshot().State != StateSelf {
			return false
		}
	}
	return len(pl.lanes) > 0
}

// peerList returns the peer-list digest the peer's Server answered on every
// lane; ok is false unless every lane is up and all answered the same.
func (pl *peerLanes) peerList() (d PeerListDigest, ok bool) {
	for i, p := range pl.lanes {
		l, err := p.current()
		if err != nil || (i > 0 && l.peerList != d) {
			return PeerListDigest{}, false
		}
		d = l.peerList
	}
	return d, len(pl.lanes) > 0
}

// pick returns the lane for the next request, round robin, or the
// ErrPeerDown error of a lane that is down: the peer is up only while every
// lane is (Healthy), so a request fails as soon as any lane has failed.
func (pl *peerLanes) pick() (*peer, error) {
	for _, p := range pl.lanes {
		if _, err := p.current(); err != nil {
			return nil, err
		}
	}
	return pl.lanes[int(pl.next.Add(1))%len(pl.lanes)], nil
}

// snapshot sums the lanes' counters; the peer is up only while every lane
// is, and otherwise shows the first lane that is down, else the first that
// is still connecting.
func (pl *peerLanes) snapshot() PeerStats {
	var sum PeerStats
	rank := map[string]int{StateUp: 0, StateConnecting: 1, StateDown: 2}
	for i, p := range pl.lanes {
		s := p.snapshot()
		if i == 0 || rank[s.State] > rank[sum.State] {
			sum.Addr, sum.State, sum.LastError = s.Addr, s.State, s.LastError
		}
		sum.RowsSent += s.RowsSent
		sum.Bytes += s.Bytes
		sum.Verified += s.Verified
	}
	return sum
}

// ip returns the IP of the peer's last successful connection.
func (pl *peerLanes) ip() string {
	for _, p := range pl.lanes {
		if ip := p.ip(); ip != "" {
			return ip
		}
	}
	return ""
}

// Close drops every connection and stops reconnecting.
func (m *Mirror) Close() error {
	m.cancel()
	for _, pl := range m.peers {
		for _, p := range pl.lanes {
			p.closeLink()
		}
	}
	m.wg.Wait()
	return nil
}

// Healthy reports whether every peer but this node itself is up. While it
// is false, a node must answer lookups "absent": a load now could not be
// mirrored.
func (m *Mirror) Healthy() bool {
	targets, err := m.selfEntries()
	if err != nil {
		return false
	}
	for _, pl := range targets {
		if pl.snapshot().State != StateUp {
			return false
		}
	}
	return true
}

// Remote reports whether some entry of the peer list is not this node's own
// address, i.e. whether there may be a rank to mirror to.
func (m *Mirror) Remote() bool {
	for _, pl := range m.peers {
		if !pl.literalSelf {
			return true
		}
	}
	return false
}

// AuthFailures returns how many handshakes and acknowledgements from peers
// failed authentication.
func (m *Mirror) AuthFailures() uint64 {
	return m.sumLanes(func(p *peer) uint64 { return p.authFailures.Load() })
}

// HandshakesEvicted returns how many of this node's handshakes peers closed
// to make room for others at their flooded listeners (ErrFlooded).
func (m *Mirror) HandshakesEvicted() uint64 {
	return m.sumLanes(func(p *peer) uint64 { return p.flooded.Load() })
}

// sumLanes sums a count over every lane of every peer.
func (m *Mirror) sumLanes(count func(*peer) uint64) uint64 {
	var n uint64
	for _, pl := range m.peers {
		for _, p := range pl.lanes {
			n += count(p)
		}
	}
	return n
}

// Stats returns one entry per peer, in configuration order.
func (m *Mirror) Stats() []PeerStats {
	_, selfErr := m.selfEntries()
	stats := make([]PeerStats, len(m.peers))
	for i, pl := range m.peers {
		stats[i] = m.entryStats(pl, selfErr)
	}
	return stats
}

// entryStats is pl's entry for stat: this node's own entry is "self" while
// it is skipped, and down with selfErr while it may not be.
func (m *Mirror) entryStats(pl *peerLanes, selfErr error) PeerStats {
	switch {
	case pl.literalSelf:
		return PeerStats{Addr: pl.addr, State: StateSelf}
	case !pl.reachedSelf():
		return pl.snapshot()
	case selfErr != nil:
		s := pl.snapshot()
		s.State, s.LastError = StateDown, selfErr.Error()
		return s
	}
	return pl.snapshot()
}

// MirrorRow makes row of every peer's region hold data, which is row of
// region here. It sends the non-zero pages to all peers in parallel and
// returns nil only when each acknowledged, within the deadline, a CRC32C of
// its row equal to that of data. Otherwise the error names every failed peer,
// and each of them is marked down and reconnected. data must not change
// until MirrorRow returns.
func (m *Mirror) MirrorRow(ctx context.Context, region *Region, row int, data []byte) error {
	// The checksum is computed while the row travels; peers wait for it
	// only to check their acknowledgements.
	var crc uint32
	crcReady := make(chan struct{})
	return m.mirror(ctx, region, row, data, nonZeroExtents(data), func() uint32 { <-crcReady; return crc }, func() {
		crc = block.CRC32C(data)
		close(crcReady)
	})
}

// mirror sends data, whose non-zero pages extents cover, as row to every
// peer and waits for their acknowledgements, which must equal want();
// meanwhile runs alongside the sends.
func (m *Mirror) mirror(ctx context.Context, region *Region, row int, data []byte, extents []Extent, want func() uint32, meanwhile func()) error {
	if row < 0 || row >= region.Rows() || len(data) != region.RowBytes() {
		return fmt.Errorf("rowsync: mirror row %d of %d bytes into a region of %d rows of %d bytes", row, len(data), region.Rows(), region.RowBytes())
	}
	if uint64(len(extents)) > maxExtents(uint64(len(data))) {
		return fmt.Errorf("rowsync: mirror row %d as %d extents, more than the %d a %d-byte row may have (one per 4 KiB)", row, len(extents), maxExtents(uint64(len(data))), len(data))
	}
	var payload uint64
	for _, e := range extents {
		payload += uint64(len(e.Data))
	}
	targets, err := m.selfEntries()
	if err != nil || len(targets) == 0 {
		return err
	}
	// The bulk is sealed once, under a key of its own, and the same
	// records go to every peer (channel.go).
	key, err := newBulkKey()
	if err != nil {
		return err
	}
	bulk, err := sealBulk(key, extents, sealWorkers, len(targets))
	if err != nil {
		return err
	}
	msg := RowWrite{Row: uint32(row), Rows: uint32(region.Rows()), RowBytes: uint64(len(data))} // Key and Extents: bulk's
	errs := make([]error, len(targets))
	var wg sync.WaitGroup
	for i, pl := range targets {
		wg.Go(func() {
			p, err := pl.pick()
			if err != nil {
				bulk.written()
				errs[i] = err
				return
			}
			errs[i] = p.writeRow(ctx, m.deadline, msg, bulk, payload, want)
		})
	}
	meanwhile()
	wg.Wait()
	return errors.Join(errs...)
}

// SampleStore asks every peer for the CRC32C of its row holding the block key
// just stored from row of region here, whose CRC32C is crc, and notes each
// answer in g. Errors only mean that some samples were not taken.
func (m *Mirror) SampleStore(ctx context.Context, g *Gate, region *Region, row int, key string, crc uint32) error {
	if row < 0 || row >= region.Rows() {
		return fmt.Errorf("rowsync: sample row %d of a %d-row region", row, region.Rows())
	}
	msg := StoreSample{Row: uint32(row), Rows: uint32(region.Rows()), RowBytes: uint64(region.RowBytes()), CRC: crc, Key: key}
	targets, err := m.selfEntries()
	if err != nil {
		return err
	}
	errs := make([]error, len(targets))
	var wg sync.WaitGroup
	for i, pl := range targets {
		wg.Go(func() {
			p, err := pl.pick()
			if err != nil {
				errs[i] = err
				return
			}
			theirs, err := p.sample(ctx, m.deadline, msg)
			if err == nil {
				g.NoteSample(key, crc, theirs, p.addr)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// peer is one remote Server and the connection to it.
type peer struct {
	addr    string
	psk     []byte
	node    NodeID
	session uint64
	dial    func(ctx context.Context, addr string) (net.Conn, error)
	// changed is called, without mu held, after the state changed.
	changed func()

	rowsSent, bytesSent, verified, authFailures atomic.Uint64
	clockProbes                                 atomic.Uint64 // probes that refreshed a stale reading of the peer's clock (refreshClock)
	flooded                                     atomic.Uint64 // handshakes the peer closed to make room (ErrFlooded)

	mu       sync.Mutex // guards the fields below; taken before link.mu
	link     *link      // nil while not connected
	state    string
	lastErr  string
	remoteIP string // IP of the last successful connection
}

// snapshot returns the peer's stats (RowsReceived left zero). A link that
// failed is reported down at once, before run has noticed.
func (p *peer) snapshot() PeerStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := PeerStats{
		Addr:      p.addr,
		State:     p.state,
		RowsSent:  p.rowsSent.Load(),
		Bytes:     p.bytesSent.Load(),
		LastError: p.lastErr,
		Verified:  p.verified.Load(),
	}
	if p.link != nil {
		if err := p.link.failure(); err != nil {
			s.State, s.LastError = StateDown, err.Error()
		}
	}
	return s
}

// ip returns the IP of the peer's last successful connection.
func (p *peer) ip() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.remoteIP
}

// run connects, serves the connection until it fails, and repeats with
// backoff until ctx is canceled.
func (p *peer) run(ctx context.Context) {
	backoff := minBackoff
	for {
		l, err := p.connect(ctx)
		if errors.Is(err, errSelf) {
			p.setSelf()
			backoff = maxBackoff // it stays itself; a slow retry notices a change of route
		} else if err == nil {
			up := time.Now()
			p.setLink(ctx, l)
			err = l.readAcks()
			l.fail(err)
			p.dropLink(l)
			if time.Since(up) >= maxBackoff {
				backoff = minBackoff
			}
		} else if ctx.Err() == nil {
			p.setDown(err)
		}
		if errors.Is(err, ErrAuth) {
			p.authFailures.Add(1)
		}
		if errors.Is(err, ErrFlooded) {
			p.flooded.Add(1)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// Keepalive of a peer connection: a peer that goes silent while no row is
// in flight (host down, link cut: no FIN or RST arrives) is found down after
// about keepAliveIdle + keepAliveCount × keepAliveInterval, so lookups are
// withheld before a load would have to fail at its deadline.
const (
	keepAliveIdle     = time.Second
	keepAliveInterval = time.Second
	keepAliveCount    = 3
)

// dialTCP is the default MirrorConfig.Dial.
func dialTCP(ctx context.Context, addr string) (net.Conn, error) {
	d := net.Dialer{Timeout: handshakeTimeout, KeepAliveConfig: net.KeepAliveConfig{
		Enable: true, Idle: keepAliveIdle, Interval: keepAliveInterval, Count: keepAliveCount}}
	return d.DialContext(ctx, "tcp", addr)
}

// connect dials and authenticates; canceling ctx aborts it.
func (p *peer) connect(ctx context.Context) (*link, error) {
	dialCtx, cancel := context.WithTimeout(ctx, handshakeTimeout)
	conn, err := p.dial(dialCtx, p.addr)
	cancel()
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	l := &link{conn: conn, done: make(chan struct{}), pending: make(map[uint64]chan *Ack)}
	ch, welcome, err := clientHandshake(conn, p.psk, p.node, p.session)
	if err == nil {
		l.ch, l.peerList = ch, welcome.PeerList
		l.clock.note(welcome.Clock, time.Now())
		err = fence(conn, ch, &l.clock)
	}
	if !stop() {
		return nil, ctx.Err()
	}
	if err != nil {
		conn.Close()
		return nil, err
	}
	return l, nil
}

// fence waits, after the handshake, until the peer's Server serves this
// connection: it answers a request only once it has taken the lane's session
// over, which waits for the last commit of the session's previous
// connection (Server.takeSession). Such a commit may be of a row whose load
// already failed at the deadline; were the lane up before it is over, the
// engine's next use of that row, mirrored over another lane, could be
// overwritten by it (DESIGN "Lanes"). The request is a store sample of a
// region of one row of one byte, a geometry no node has (probe): the Server
// answers it with an error and notes it nowhere. Its Ack's Clock is noted in
// clock.
func fence(conn net.Conn, ch *channel, clock *peerClock) error {
	conn.SetDeadline(time.Now().Add(handshakeTimeout))
	defer conn.SetDeadline(time.Time{})
	if err := ch.writeMessage(probe(0)); err != nil {
		return err
	}
	frame, err := ch.readFrame(nil, maxAckFrame)
	received := time.Now()
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("the peer did not start serving this connection within %s: a stopped or hung daemon, or one still writing a row of this lane's previous connection", handshakeTimeout)
	}
	if err != nil {
		return err
	}
	msg, err := Decode(frame)
	if err != nil {
		return err
	}
	ack, ok := msg.(*Ack)
	if !ok || ack.Seq != 0 {
		return fmt.Errorf("%w: the peer answered the connection's first request with message type %d", ErrBadFrame, msg.messageType())
	}
	clock.note(ack.Clock, received)
	return nil
}

// probe is the request of seq that a Server answers with an error Ack and
// notes nowhere, for its Clock: a store sample of a region of one row of one
// byte, a geometry no node has (fence, refreshClock).
func probe(seq uint64) *StoreSample { return &StoreSample{Seq: seq, Rows: 1, RowBytes: 1} }

// refreshClock makes l's reading of the peer's clock fresh, if it is older
// than clockRefresh, with one probe round trip within ctx: the margin of a
// row's CommitBy grows with the reading's age (commitby.go), and a lane idle
// for hours receives no Ack.
func (p *peer) refreshClock(ctx context.Context, l *link) error {
	if !l.clock.stale(time.Now()) {
		return nil
	}
	p.clockProbes.Add(1)
	seq, acked, err := l.send(ctx, func(ch *channel, seq uint64) error { return ch.writeMessage(probe(seq)) })
	if err == nil {
		_, err = l.wait(ctx, seq, acked) // readAcks noted its Clock
	}
	if err != nil {
		return fmt.Errorf("refreshing the reading of its clock: %w", err)
	}
	return nil
}

// setLink makes l the peer's connection, unless the Mirror closed meanwhile.
func (p *peer) setLink(ctx context.Context, l *link) {
	p.mu.Lock()
	if ctx.Err() != nil {
		p.mu.Unlock()
		l.fail(ctx.Err())
		return
	}
	p.link, p.state, p.lastErr = l, StateUp, ""
	if a, ok := l.conn.RemoteAddr().(*net.TCPAddr); ok {
		p.remoteIP = a.IP.String()
	}
	p.mu.Unlock()
	p.changed()
}

// dropLink forgets the failed link l and marks the peer down.
func (p *peer) dropLink(l *link) {
	p.mu.Lock()
	if p.link == l {
		p.link = nil
	}
	// In the same critical section: a peer without a link and still
	// marked up read as up (snapshot, Healthy) while current failed.
	p.state, p.lastErr = StateDown, l.failure().Error()
	p.mu.Unlock()
	p.changed()
}

// setDown records a failure.
func (p *peer) setDown(err error) {
	p.mu.Lock()
	p.state, p.lastErr = StateDown, err.Error()
	p.mu.Unlock()
	p.changed()
}

// setSelf records that the last handshake reached this node's own Server.
func (p *peer) setSelf() {
	p.mu.Lock()
	p.state, p.lastErr = StateSelf, ""
	p.mu.Unlock()
	p.changed()
}

// closeLink fails the current link, for Mirror.Close.
func (p *peer) closeLink() {
	p.mu.Lock()
	l := p.link
	p.mu.Unlock()
	if l != nil {
		l.fail(errors.New("mirror closed"))
	}
}

// current returns the connection, or an ErrPeerDown error.
func (p *peer) current() (*link, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.link == nil {
		return nil, p.errorf("%w (%s)", ErrPeerDown, p.lastErr)
	}
	if err := p.link.failure(); err != nil {
		return nil, p.errorf("%w (%v)", ErrPeerDown, err)
	}
	return p.link, nil
}

func (p *peer) errorf(format string, args ...any) error {
	return fmt.Errorf("rowsync: peer %s: %w", p.addr, fmt.Errorf(format, args...))
}

// writeRow sends msg with bulk, telling bulk once it is written (or not),
// and checks the acknowledgement against the CRC32C that want returns. Any
// failure takes the connection down, so that the peer is unhealthy until it
// is back. The row's CommitBy is the peer's clock at the deadline, less the
// margin (peerClock.commitBy), from a reading refreshed first if stale
// (refreshClock). Once the frame's write began, writeRow returns without an
// acknowledgement no earlier than the deadline, so that the row can no
// longer land when the load fails: a frame cut short on this lane may be
// completed on the path from another peer's lane, which carries the same
// bulk records.
func (p *peer) writeRow(ctx context.Context, deadline time.Duration, msg RowWrite, bulk *sealedBulk, payload uint64, want func() uint32) error {
	ctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	dl, _ := ctx.Deadline()
	failAt := time.Now().Add(time.Until(dl)) // with a monotonic reading, whatever ctx's deadline was built from
	l, err := p.current()
	if err != nil {
		bulk.written()
		return err
	}
	if err := p.refreshClock(ctx, l); err != nil {
		bulk.written()
		return p.errorf("row %d: %w", msg.Row, err)
	}
	started := false
	seq, acked, err := l.send(ctx, func(ch *channel, seq uint64) error {
		started = true
		msg.Seq, msg.CommitBy = seq, l.clock.commitBy(failAt, msg.RowBytes)
		return ch.writeRow(&msg, bulk)
	})
	bulk.written()
	if err != nil {
		if started {
			time.Sleep(time.Until(failAt))
		}
		return p.errorf("row %d: %w", msg.Row, err)
	}
	p.rowsSent.Add(1)
	p.bytesSent.Add(payload)
	ack, err := l.wait(ctx, seq, acked)
	if err != nil {
		// The link failed, or ctx was canceled, before the deadline: the
		// frame may still be committed until CommitBy.
		time.Sleep(time.Until(failAt))
		return p.errorf("row %d: %w", msg.Row, err)
	}
	switch {
	case ack.Err != "":
		err = fmt.Errorf("refused row %d: %s", msg.Row, ack.Err)
	case ack.Row != msg.Row:
		err = fmt.Errorf("acknowledged row %d for row %d", ack.Row, msg.Row)
	case ack.CRC != want():
		err = fmt.Errorf("acknowledged row %d with CRC32C %08x, sent %08x", msg.Row, ack.CRC, want())
	default:
		p.verified.Add(1)
		return nil
	}
	l.fail(err)
	return p.errorf("%w", err)
}

// sample sends msg and returns the peer's CRC32C of its row. A refused sample
// (no region there yet) is an error but leaves the connection up.
func (p *peer) sample(ctx context.Context, deadline time.Duration, msg StoreSample) (uint32, error) {
	ctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	l, err := p.current()
	if err != nil {
		return 0, err
	}
	seq, acked, err := l.send(ctx, func(ch *channel, seq uint64) error { msg.Seq = seq; return ch.writeMessage(&msg) })
	if err != nil {
		return 0, p.errorf("sample %q: %w", msg.Key, err)
	}
	ack, err := l.wait(ctx, seq, acked)
	switch {
	case err != nil:
		return 0, p.errorf("sample %q: %w", msg.Key, err)
	case ack.Err != "":
		return 0, p.errorf("refused sample %q: %s", msg.Key, ack.Err)
	case ack.Row != msg.Row:
		err = fmt.Errorf("acknowledged row %d for sample row %d", ack.Row, msg.Row)
		l.fail(err)
		return 0, p.errorf("%w", err)
	}
	return ack.CRC, nil
}

// link is one authenticated connection to a peer. Requests are pipelined:
// any number may be in flight, each waiting for the Ack with its Seq.
type link struct {
	conn     net.Conn
	ch       *channel       // conn's records
	peerList PeerListDigest // the digest the peer's Welcome named
	clock    peerClock      // the freshest reading of the peer's clock
	writeMu  sync.Mutex     // serializes frames on ch; held for one whole frame
	done     chan struct{}  // closed when the link fails

	mu      sync.Mutex // guards the fields below
	nextSeq uint64
	pending map[uint64]chan *Ack
	err     error // why the link failed; set once, with done
}

// send registers a request and writes it with write, given its Seq. The
// write must finish by ctx's deadline; a failed write fails the link.
func (l *link) send(ctx context.Context, write func(ch *channel, seq uint64) error) (uint64, chan *Ack, error) {
	l.mu.Lock()
	if l.err != nil {
		l.mu.Unlock()
		return 0, nil, l.err
	}
	l.nextSeq++
	seq, acked := l.nextSeq, make(chan *Ack, 1)
	l.pending[seq] = acked
	l.mu.Unlock()

	l.writeMu.Lock()
	deadline, _ := ctx.Deadline()
	l.conn.SetWriteDeadline(deadline)
	err := write(l.ch, seq)
	l.writeMu.Unlock()
	if err != nil {
		l.fail(fmt.Errorf("send: %w", err))
		return 0, nil, l.failure()
	}
	return seq, acked, nil
}

// wait returns the Ack for seq. Running past ctx's deadline fails the link:
// the peer is too slow to be trusted with the next row either.
func (l *link) wait(ctx context.Context, seq uint64, acked chan *Ack) (*Ack, error) {
	select {
	case ack := <-acked:
		return ack, nil
	case <-l.done:
		return nil, l.failure()
	case <-ctx.Done():
		l.mu.Lock()
		delete(l.pending, seq)
		l.mu.Unlock()
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			l.reset(errors.New("no acknowledgement before the deadline"))
			return nil, l.failure()
		}
		return nil, ctx.Err()
	}
}

// readAcks delivers acknowledgements until the connection fails.
func (l *link) readAcks() error {
	var buf []byte
	for {
		frame, err := l.ch.readFrame(buf, maxAckFrame)
		if err != nil {
			return fmt.Errorf("receive: %w", err)
		}
		received := time.Now()
		buf = frame
		msg, err := Decode(frame)
		if err != nil {
			return err
		}
		ack, ok := msg.(*Ack)
		if !ok {
			return fmt.Errorf("%w: expected an ack, got message type %d", ErrBadFrame, msg.messageType())
		}
		l.clock.note(ack.Clock, received)
		l.mu.Lock()
		acked := l.pending[ack.Seq]
		delete(l.pending, ack.Seq)
		l.mu.Unlock()
		if acked != nil {
			acked <- ack
		}
	}
}

// fail records the first failure, wakes every waiter and closes the connection.
func (l *link) fail(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return
	}
	l.err = err
	close(l.done)
	l.conn.Close()
}

// reset fails the link like fail, closing the connection with a reset
// (SO_LINGER 0): the bytes of a row still queued to the peer are dropped,
// not delivered after its load failed.
func (l *link) reset(err error) {
	if tc, ok := l.conn.(interface{ SetLinger(sec int) error }); ok {
		tc.SetLinger(0) // fails only on a connection already closed, which fail would do
	}
	l.fail(err)
}

// failure returns why the link failed.
func (l *link) failure() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}
