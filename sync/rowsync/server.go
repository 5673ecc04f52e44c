package rowsync

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvtierfs/kvtierfs/tiers/block"
	"golang.org/x/sys/unix"
)

// acceptRetry is the pause after a failed accept.
const acceptRetry = 100 * time.Millisecond

// RegionFunc returns this node's region of rows of rowBytes bytes, the row
// size the Server accepts (see rowGeometry). The region must stay mapped
// while the Server may use it.
type RegionFunc func(rowBytes int) (*Region, error)

// ServerConfig configures a Server.
type ServerConfig struct {
	Listen string     // host:port to listen on; port 0 picks one
	Secret []byte     // shared secret, at least MinSecretBytes
	Node   NodeID     // this node, as its Mirror knows it; zero: a random one
	Peers  []string   // this node's peer list, whose digest its Welcome names (self.go)
	Region RegionFunc // the local region rows are written into
	// RowBytes is this node's row size until its own loads or stores name
	// one (see rowGeometry); 0: unknown, every row refused until then.
	RowBytes int
	Gate     *Gate                            // notes the store samples peers send; nil: not noted
	Logf     func(format string, args ...any) // nil: log.Printf
}

// Server is the receiving side: it accepts authenticated connections from
// peers' Mirrors, receives each row they send into a buffer, writes it into
// the same row of the local region once the whole row has arrived, and
// acknowledges it with the CRC32C of the row it wrote.
type Server struct {
	cfg          ServerConfig
	psk          []byte
	welcome      Welcome // this node's answer to every Hello
	ln           net.Listener
	start        uint64 // the origin of clock, a bootClock reading
	authFailures atomic.Uint64
	rowsLate     atomic.Uint64       // rows that arrived past their CommitBy, not written
	evictions    atomic.Uint64       // handshakes closed to make room (evictLocked)
	listed       map[netip.Addr]bool // the IPs the peer list names (ServerConfig.Peers)
	geometry     rowGeometry
	wg           sync.WaitGroup // accept loop and connections

	mu    sync.Mutex // guards the fields below
	conns map[net.Conn]struct{}
	// handshaking are the connections that have not finished their
	// handshake, oldest first; at most maxHandshaking.
	handshaking []*pendingConn
	// refused and evictedLog are the lines of refused handshakes and of
	// those closed to make room.
	refused, evictedLog *refusalLines
	sessions            map[uint64]*sessionConn   // the connection serving each session
	inbound             map[string]*atomic.Uint64 // rows received, by remote IP
	closed              bool
}

// rowGeometry is the row size this node accepts rows and samples at: never
// one a request names, but this node's own: the rows its filesystem mirrors
// or samples itself (NoteLocalRowBytes), or before that the size it was
// told (ServerConfig.RowBytes, --row-bytes). A node that knows neither
// refuses every request, and a request of another size is refused, so a
// peer can neither map the region at a size of its choosing and address any
// page of it, nor fix this node's row size before the node knows it (the
// first request did, until issue 24: every real row was refused after it).
type rowGeometry struct {
	mu       sync.Mutex
	rowBytes int // 0: unknown
}

// own returns this node's row size, 0 while it is unknown.
func (g *rowGeometry) own() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.rowBytes
}

// noteLocal makes rowBytes the row size, and reports the size it replaces.
func (g *rowGeometry) noteLocal(rowBytes int) (replaced int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.rowBytes != rowBytes {
		replaced = g.rowBytes
	}
	g.rowBytes = rowBytes
	return replaced
}

// pendingConn is a connection in handshake (Server.handshaking).
type pendingConn struct {
	conn net.Conn
	// source is the address it came from, an IPv6 one's /64: one host
	// has a /64 of its own to pick addresses from.
	source netip.Addr
	listed bool // the peer list names its IP
	// proven: its Hello was sealed under the secret (or is a replay of
	// one). evicted: evictLocked closed it.
	proven, evicted bool
}

// sessionConn is the authenticated connection of a session; done is closed
// once it no longer touches the region.
type sessionConn struct {
	conn net.Conn
	done chan struct{}
}

// StartServer listens on cfg.Listen and serves in the background until Close.
func StartServer(cfg ServerConfig) (*Server, error) {
	if err := checkSecret(cfg.Secret); err != nil {
		return nil, err
	}
	if cfg.Region == nil {
		return nil, errors.New("rowsync: server without a region")
	}
	if cfg.RowBytes < 0 || cfg.RowBytes > MaxRowBytes {
		return nil, fmt.Errorf("rowsync: row size %d bytes, want 1..%d", cfg.RowBytes, MaxRowBytes)
	}
	if cfg.Logf == nil {
		cfg.Logf = log.Printf
	}
	if cfg.Node == (NodeID{}) {
		cfg.Node = newNodeID()
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("rowsync: %w", err)
	}
	s := &Server{
		cfg:        cfg,
		psk:        presharedKey(cfg.Secret),
		welcome:    Welcome{Node: cfg.Node, PeerList: peerListDigest(cfg.Peers)},
		geometry:   rowGeometry{rowBytes: cfg.RowBytes},
		ln:         ln,
		start:      serverEpoch(),
		listed:     listedIPs(cfg.Peers),
		refused:    refusedLines(),
		evictedLog: evictedLines(),
		conns:      make(map[net.Conn]struct{}),
		sessions:   make(map[uint64]*sessionConn),
		inbound:    make(map[string]*atomic.Uint64),
	}
	s.wg.Go(s.accept)
	return s, nil
}

// Addr returns the address the Server listens on.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// AuthFailures returns how many connections failed the handshake or sent a
// record that failed authentication.
func (s *Server) AuthFailures() uint64 { return s.authFailures.Load() }

// RowsLate returns how many rows arrived whole after their CommitBy and
// were not written (Server.receiveRow).
func (s *Server) RowsLate() uint64 { return s.rowsLate.Load() }

// serverEpoch returns the origin of a new Server's clock; tests move it to
// set the clocks of head and peer apart.
var serverEpoch = bootClock

// bootClock reads CLOCK_BOOTTIME in nanoseconds: monotonic, and unlike
// CLOCK_MONOTONIC (Go's) it counts while the machine is suspended, so that
// a row held across a suspend is late by its CommitBy too. It cannot fail
// on Linux with a valid clock id and pointer.
func bootClock() uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		panic(fmt.Sprintf("rowsync: CLOCK_BOOTTIME: %v", err))
	}
	return uint64(ts.Nano())
}

// clock is the Server's clock that Welcome, Ack and RowWrite.CommitBy
// name: nanoseconds since it started, monotonic, counting suspends. The
// subtraction wraps like the clock itself would (tests start it years
// ahead).
func (s *Server) clock() uint64 { return bootClock() - s.start }

// HandshakesEvicted returns how many connections in handshake the Server
// closed to make room for others (evictLocked): a flood.
func (s *Server) HandshakesEvicted() uint64 { return s.evictions.Load() }

// NoteLocalRowBytes tells the Server the row size this node itself uses its
// region at (see rowGeometry).
func (s *Server) NoteLocalRowBytes(rowBytes int) {
	if old := s.geometry.noteLocal(rowBytes); old != 0 {
		s.cfg.Logf("rowsync: this node's rows are %d bytes; requests for rows of %d bytes are refused from now on", rowBytes, old)
	}
}

// Close stops listening, drops every connection and waits for them to end.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	err := s.ln.Close()
	s.wg.Wait()
	s.summarizeRefusals(s.refused, true)
	s.summarizeRefusals(s.evictedLog, true)
	return err
}

// maxHandshaking bounds the connections in handshake: anyone who reaches
// the listener can open connections and never speak, each holding a
// descriptor until handshakeTimeout, and 600 of them once took every
// descriptor of a daemon limited to 512 (the engine's stores and loads
// then failed with EMFILE). Past the bound one is closed (evictLocked).
const maxHandshaking = 64

// evictLocked picks the connection in handshake to close past
// maxHandshaking. Closing the oldest let a flood from anywhere close a
// listed peer's handshake (its round trip is longer than the time 64
// connections of a flood take to arrive), and the peer took the close for
// a refusal of its secret. So the pick goes, in order, to a connection
// from a source the peer list does not name over one it does (an address
// the network between nodes cannot take over without being on the path,
// where it could cut the connection anyway); to one whose Hello was not
// proven over one that was (a flood without the secret sends none); from
// the source with the most connections in handshake (so that one source
// cannot take every slot); the oldest of these. Listed comes before proven:
// a Hello seen once on the network proves nothing when sent again (it
// decrypts as the original did, then waits for a Ready that never comes),
// and replays of one from unlisted sources, ranked over a listed peer's
// handshake not yet proven, closed each one the peer began
// (TestReplayedHelloFloodDoesNotKeepAListedPeerOut). The client is told (answerFlooded), and the
// eviction is counted and logged as such, not as a refusal.
func (s *Server) evictLocked() *pendingConn {
	count := make(map[netip.Addr]int, len(s.handshaking))
	for _, p := range s.handshaking {
		count[p.source]++
	}
	rank := func(p *pendingConn) (int, int) {
		class := 0
		if p.listed {
			class += 2
		}
		if p.proven {
			class++
		}
		return class, -count[p.source]
	}
	at := 0
	for i, p := range s.handshaking[1:] {
		class, most := rank(p)
		bestClass, bestMost := rank(s.handshaking[at])
		if class < bestClass || class == bestClass && most < bestMost {
			at = i + 1
		}
	}
	victim := s.handshaking[at]
	s.handshaking = append(s.handshaking[:at], s.handshaking[at+1:]...)
	victim.evicted = true
	return victim
}

// listedIPs returns the IPs that the peer list's entries name literally
// (host names are not resolved for this, see self.go).
func listedIPs(peers []string) map[netip.Addr]bool {
	ips := make(map[netip.Addr]bool, len(peers))
	for _, p := range peers {
		if ap, err := netip.ParseAddrPort(p); err == nil {
			ips[ap.Addr().Unmap().WithZone("")] = true
		}
	}
	return ips
}

// sourceOf returns the source of a connection from addr for evictLocked,
// and whether the peer list names its IP.
func (s *Server) sourceOf(addr net.Addr) (source netip.Addr, listed bool) {
	a, ok := addr.(*net.TCPAddr)
	if !ok {
		return netip.Addr{}, false
	}
	ip := a.AddrPort().Addr().Unmap().WithZone("")
	source = ip
	if ip.Is6() {
		if p, err := ip.Prefix(64); err == nil {
			source = p.Addr()
		}
	}
	return source, s.listed[ip]
}

// refusalLines are the lines of one kind of refused handshake (refused,
// or closed to make room), at most one a second: anyone who reaches the
// listener causes one per connection (15,545 lines in 25 s of a flood). The
// next line counts those left out; when none comes within the second, a
// line of their own does (summarizeRefusals), so the count a flood ends
// with is logged too. Guarded by Server.mu.
type refusalLines struct {
	// one is a line for one handshake (more: those left out before it),
	// summary one for n left out, the last of them last.
	one     func(what string, more int) string
	summary func(n int, last string) string

	logged   time.Time   // when the last line was logged
	unlogged int         // handshakes since, without a line
	last     string      // the last of them
	timer    *time.Timer // logs their count at the end of the second
}

// refusedLines are the lines of refused handshakes, evictedLines of those
// evictLocked closed.
func refusedLines() *refusalLines {
	return &refusalLines{
		one: func(what string, more int) string {
			if more > 0 {
				return fmt.Sprintf("rowsync: refused %s (and %d more handshakes since the last such line)", what, more)
			}
			return "rowsync: refused " + what
		},
		summary: func(n int, last string) string {
			return fmt.Sprintf("rowsync: refused %d more handshakes since the last such line, the last %s", n, last)
		},
	}
}

func evictedLines() *refusalLines {
	const why = "the connections in handshake were at their bound of %d: a flood of connections that never finish one (those of the sources with the most go first; listed peers' last)"
	return &refusalLines{
		one: func(what string, more int) string {
			if more > 0 {
				what = fmt.Sprintf("%s (and %d more since the last such line)", what, more)
			}
			return fmt.Sprintf("rowsync: closed the handshake of %s to make room for others: "+why, what, maxHandshaking)
		},
		summary: func(n int, last string) string {
			return fmt.Sprintf("rowsync: closed %d more handshakes to make room for others since the last such line, the last of %s: "+why, n, last, maxHandshaking)
		},
	}
}

// logRefusal logs a handshake refused (err) or closed to make room for
// others (errEvicted) in their lines.
func (s *Server) logRefusal(from net.Addr, err error) {
	s.mu.Lock()
	l, what := s.refused, fmt.Sprintf("%s: %v", from, err)
	if errors.Is(err, errEvicted) {
		l, what = s.evictedLog, from.String()
	}
	now := time.Now()
	if since := now.Sub(l.logged); since < time.Second {
		l.unlogged++
		l.last = what
		if l.timer == nil && !s.closed {
			l.timer = time.AfterFunc(time.Second-since, func() { s.summarizeRefusals(l, false) })
		}
		s.mu.Unlock()
		return
	}
	unlogged := l.unlogged
	l.logged, l.unlogged = now, 0
	s.mu.Unlock()
	s.cfg.Logf("%s", l.one(what, unlogged))
}

// summarizeRefusals logs the count of l's handshakes that no line counted
// yet: at the end of their second, or at Close (final). It logs under mu, so
// that no line comes after Close.
func (s *Server) summarizeRefusals(l *refusalLines, final bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed && !final {
		return
	}
	if l.unlogged > 0 {
		s.cfg.Logf("%s", l.summary(l.unlogged, l.last))
	}
	l.logged, l.unlogged, l.timer = time.Now(), 0, nil
}

// handshakeDone forgets p among the connections in handshake and returns
// whether evictLocked closed it, which it can no longer do after this.
func (s *Server) handshakeDone(p *pendingConn) (evicted bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if i := slices.Index(s.handshaking, p); i >= 0 {
		s.handshaking = slices.Delete(s.handshaking, i, i+1)
	}
	return p.evicted
}

// evicted is serverHandshake's question for p: whether evictLocked closed
// it; proven notes that its Hello was proven, unless it was.
func (s *Server) evicted(p *pendingConn, proven bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if proven && !p.evicted {
		p.proven = true
	}
	return p.evicted
}

// accept serves every connection in its own goroutine until the listener
// closes; other accept errors (out of descriptors) are retried. At most
// maxHandshaking of them are in handshake at a time.
func (s *Server) accept() {
	for {
		conn, err := s.ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			s.cfg.Logf("rowsync: accept: %v", err)
			time.Sleep(acceptRetry)
			continue
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			conn.Close()
			return
		}
		s.conns[conn] = struct{}{}
		p := &pendingConn{conn: conn}
		p.source, p.listed = s.sourceOf(conn.RemoteAddr())
		var victim *pendingConn
		if s.handshaking = append(s.handshaking, p); len(s.handshaking) > maxHandshaking {
			victim = s.evictLocked()
		}
		s.mu.Unlock()
		if victim != nil {
			// Its reads end, its serve answers answerFlooded and closes it.
			if tc, ok := victim.conn.(*net.TCPConn); !ok || tc.CloseRead() != nil {
				victim.conn.Close()
			}
		}
		s.wg.Go(func() {
			s.serve(conn, p)
			s.mu.Lock()
			delete(s.conns, conn)
			s.mu.Unlock()
			conn.Close()
		})
	}
}

// serve authenticates conn, p among the connections in handshake, takes
// over its session, then answers its requests in order until it fails.
func (s *Server) serve(conn net.Conn, p *pendingConn) {
	welcome := s.welcome
	welcome.Clock = s.clock()
	ch, hello, err := serverHandshake(conn, s.psk, &welcome, func(proven bool) bool { return s.evicted(p, proven) })
	evicted := s.handshakeDone(p)
	if errors.Is(err, errSelf) {
		return // this node's own Mirror, told so
	}
	if err == nil && evicted {
		// Closed as its handshake ended, or with its Ready already
		// received (a read after CloseRead returns what had arrived):
		// its reads end, so it takes no session over.
		err = errEvicted
	}
	if err != nil && evicted {
		// After its Welcome too: its Ready read ended.
		s.evictions.Add(1)
		s.logRefusal(conn.RemoteAddr(), errEvicted)
		return
	}
	if err != nil {
		s.authFailures.Add(1)
		s.logRefusal(conn.RemoteAddr(), err)
		return
	}
	defer s.takeSession(hello.Session, conn)()
	received := s.inboundFor(conn.RemoteAddr())
	var rowBuf, frameBuf []byte
	for {
		var head [5]byte // length and type of a frame
		if _, err = io.ReadFull(ch, head[:]); err != nil {
			break
		}
		var ack *Ack
		switch n := binary.BigEndian.Uint32(head[:4]); {
		case n == 0 || n > MaxFrameBytes:
			err = fmt.Errorf("%w: length %d, limit %d", ErrBadFrame, n, MaxFrameBytes)
		case head[4] == typeRowWrite:
			ack, err = s.receiveRow(ch, n-1, &rowBuf)
			if err == nil && ack.Err == "" {
				received.Add(1)
			}
		default:
			frameBuf, err = ReadFrame(io.MultiReader(bytes.NewReader(head[:]), ch), frameBuf, maxRequestFrame)
			if err == nil {
				err = ch.endFrame()
			}
			if err == nil {
				ack, err = s.request(frameBuf, conn.RemoteAddr().String())
			}
		}
		if err != nil {
			break
		}
		ack.Clock = s.clock()
		if err = ch.writeMessage(ack); err != nil {
			break
		}
	}
	switch {
	case errors.Is(err, ErrAuth):
		s.authFailures.Add(1)
		s.cfg.Logf("rowsync: dropping %s: %v", conn.RemoteAddr(), err)
	case errors.Is(err, ErrBadFrame):
		s.cfg.Logf("rowsync: dropping %s: %v", conn.RemoteAddr(), err)
	}
}

// commitRow writes a received row into the region (rowCommit.commit); tests
// replace it to hold a commit.
var commitRow = (*rowCommit).commit

// receiveRow reads a RowWrite of bodyLen bytes from ch into *buf (grown to
// the row size when too small) and, once the whole frame has arrived, writes
// the row, unless this Server's clock reached the row's CommitBy: its sender
// may have failed the load already (commitby.go). The acknowledgement carries
// the CRC32C of the bytes written, summed as they arrived. A refused or late
// row is acknowledged with its error and leaves the region as it was, and so
// does a frame that fails to arrive whole.
func (s *Server) receiveRow(ch *channel, bodyLen uint32, buf *[]byte) (*Ack, error) {
	var dest *rowCommit
	w, crc, refused, err := receiveRow(ch, bodyLen, func(w *RowWrite) ([]byte, error) {
		r, err := s.region(w.Rows, w.RowBytes)
		if err != nil {
			return nil, err
		}
		dest = newRowCommit(r.Row(int(w.Row)))
		if cap(*buf) < r.RowBytes() {
			*buf = make([]byte, r.RowBytes())
		}
		return (*buf)[:r.RowBytes()], nil
	}, func(from, to uint64) { dest.gap(from, to) }, ch.bulk)
	if err != nil {
		if dest != nil {
			dest.wait()
		}
		return nil, err
	}
	ack := &Ack{Seq: w.Seq, Row: w.Row}
	if refused != nil {
		ack.Err = refused.Error()
		return ack, nil
	}
	dest.wait()
	if now := s.clock(); now >= w.CommitBy {
		s.rowsLate.Add(1)
		s.cfg.Logf("rowsync: row %d from %s arrived %s after its deadline: not written", w.Row, ch.conn.RemoteAddr(), time.Duration(now-w.CommitBy))
		ack.Err = "arrived after its deadline: not committed"
		return ack, nil
	}
	commitRow(dest, w.Extents)
	ack.CRC = crc ^ ackCRCFlip
	return ack, nil
}

// takeSession makes conn the connection of session: it closes the previous
// one and waits until that one's last write to the region is over. It
// returns the function that releases the session when conn is done.
func (s *Server) takeSession(session uint64, conn net.Conn) (release func()) {
	cur := &sessionConn{conn: conn, done: make(chan struct{})}
	s.mu.Lock()
	prev := s.sessions[session]
	s.sessions[session] = cur
	s.mu.Unlock()
	if prev != nil {
		prev.conn.Close()
		<-prev.done
	}
	return func() {
		s.mu.Lock()
		if s.sessions[session] == cur {
			delete(s.sessions, session)
		}
		s.mu.Unlock()
		close(cur.done)
	}
}

// request answers a frame other than a RowWrite: only a StoreSample is valid.
func (s *Server) request(frame []byte, from string) (*Ack, error) {
	msg, err := Decode(frame)
	if err != nil {
		return nil, err
	}
	m, ok := msg.(*StoreSample)
	if !ok {
		return nil, fmt.Errorf("%w: unexpected message type %d", ErrBadFrame, msg.messageType())
	}
	return s.sample(m, from), nil
}

// sample answers with the CRC32C of the local row and notes the pair.
func (s *Server) sample(m *StoreSample, from string) *Ack {
	ack := &Ack{Seq: m.Seq, Row: m.Row}
	region, err := s.region(m.Rows, m.RowBytes)
	if err != nil {
		ack.Err = err.Error()
		return ack
	}
	ack.CRC = block.CRC32C(region.Row(int(m.Row)))
	if s.cfg.Gate != nil {
		s.cfg.Gate.NoteSample(m.Key, ack.CRC, m.CRC, from)
	}
	return ack
}

// region returns the local region at this node's own row size (see
// rowGeometry), refusing a sender whose geometry differs.
func (s *Server) region(rows uint32, rowBytes uint64) (*Region, error) {
	own := s.geometry.own()
	if own == 0 {
		return nil, errors.New("this node does not know its row size yet: give its daemon --row-bytes (the size of one block file of the tier), or let it load or store a block first")
	}
	if own != int(rowBytes) {
		return nil, fmt.Errorf("geometry mismatch: sender has rows of %d bytes, receiver rows of %d bytes", rowBytes, own)
	}
	r, err := s.cfg.Region(own)
	if err != nil {
		return nil, fmt.Errorf("no local region: %v", err)
	}
	if r.Rows() != int(rows) || r.RowBytes() != own {
		return nil, fmt.Errorf("geometry mismatch: sender has %d rows of %d bytes, receiver %d rows of %d bytes", rows, rowBytes, r.Rows(), r.RowBytes())
	}
	return r, nil
}

// inboundFor returns the received-rows counter of addr's IP.
func (s *Server) inboundFor(addr net.Addr) *atomic.Uint64 {
	ip := addr.String()
	if a, ok := addr.(*net.TCPAddr); ok {
		ip = a.IP.String()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.inbound[ip]
	if n == nil {
		n = new(atomic.Uint64)
		s.inbound[ip] = n
	}
	return n
}

// received returns the rows received per remote IP.
func (s *Server) received() map[string]uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	rows := make(map[string]uint64, len(s.inbound))
	for ip, n := range s.inbound {
		rows[ip] = n.Load()
	}
	return rows
}
