package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// DefaultQueueLen is how many removed blocks may wait for the publisher
// before more are dropped.
const DefaultQueueLen = 1 << 16

const (
	// maxBatchBlocks bounds the blocks of one KVEventBatch.
	maxBatchBlocks = 4096
	// socketHWM is how many batches wait for a subscriber that reads
	// slowly; past it its batches are dropped, as libzmq's PUB does.
	socketHWM = 10000
	// maxPeers bounds the connections of a bound publisher; one beyond it
	// is closed at once.
	maxPeers = 64
	// handshakeTimeout bounds a peer's greeting and READY.
	handshakeTimeout = 10 * time.Second
	// writeTimeout bounds one write to a subscriber; one that takes longer
	// is dropped.
	writeTimeout = 30 * time.Second
	// dialRetry is the wait between attempts to reach a connect endpoint.
	dialRetry = 500 * time.Millisecond
)

// Options configures a Publisher.
type Options struct {
	// Endpoint is the ZMQ address, read as vLLM's ZmqEventPublisher reads
	// its endpoint: one holding "*", "::" or "0.0.0.0", or an ipc://
	// address, is bound (tcp://*:5557: routers connect to the node); any
	// other is connected to (tcp://router:5557), again and again until it
	// answers and after each loss.
	Endpoint string
	// BindAll makes a wildcard bind address (*, ::, 0.0.0.0) every
	// interface; without it the publisher binds the loopback address.
	BindAll bool
	// Topic is the first frame of every message (vLLM's KVEventsConfig.topic,
	// empty by default); SUB sockets filter on its prefix.
	Topic string
	// QueueLen is DefaultQueueLen when 0.
	QueueLen int
	// Logger receives the publisher's log; nil discards it.
	Logger *slog.Logger
}

// Publisher sends a BlockRemoved event for every block handed to BlockGone.
// BlockGone never blocks: blocks wait in a bounded queue for the publishing
// goroutine and are dropped, and counted, when it is full.
type Publisher struct {
	endpoint string
	network  string
	address  string
	bind     bool
	topic    []byte
	queue    chan removal
	logger   *slog.Logger
	stop     chan struct{}
	running  sync.WaitGroup
	stopOnce sync.Once
	// listener is a bound publisher's.
	listener net.Listener

	// mu guards peers, the subscribers connected now.
	mu    sync.Mutex
	peers map[*peer]struct{}

	published atomic.Int64
	dropped   atomic.Int64
	// seq numbers the batches sent; reported is the dropped count the last
	// batch accounted for.
	seq      uint64
	reported int64
}

// removal is a removed block waiting in the queue.
type removal struct {
	group int
	hash  uint64
}

// CheckEndpoint tells whether endpoint is a ZMQ address the publisher takes.
func CheckEndpoint(endpoint string) error {
	_, _, _, err := parseEndpoint(endpoint, false)
	return err
}

// parseEndpoint turns a ZMQ address into what net.Listen or net.Dial takes,
// and tells whether it is bound.
func parseEndpoint(endpoint string, bindAll bool) (network, address string, bind bool, err error) {
	transport, addr, found := strings.Cut(endpoint, "://")
	switch {
	case !found || addr == "":
	case transport == "ipc":
		return "unix", addr, true, nil
	case transport == "inproc":
		return "", "", false, fmt.Errorf("inproc:// reaches only the daemon's own process: use ipc://PATH or tcp://")
	case transport == "tcp":
		host, port, splitErr := net.SplitHostPort(addr)
		if splitErr != nil || port == "" {
			break
		}
		wildcard := host == "*" || host == "::" || host == "0.0.0.0"
		if !wildcard && !strings.Contains(host, "::") && !strings.Contains(host, "*") {
			return "tcp", addr, false, nil
		}
		switch {
		case wildcard && bindAll:
			host = ""
		case host == "::":
			host = "::1"
		case wildcard:
			host = "127.0.0.1"
		case strings.Contains(host, "*"):
			return "", "", false, fmt.Errorf("a bind address is *, ::, 0.0.0.0 or an interface's address")
		}
		return "tcp", net.JoinHostPort(host, port), true, nil
	}
	return "", "", false, fmt.Errorf("want a ZMQ address: tcp://*:5557 to bind, tcp://HOST:PORT to connect, or ipc://PATH")
}

// Start opens the socket and starts publishing.
func Start(opts Options) (*Publisher, error) {
	p, err := open(opts)
	if err != nil {
		return nil, err
	}
	p.running.Go(p.run)
	return p, nil
}

// open binds a publisher or starts dialing; it does not publish yet.
func open(opts Options) (*Publisher, error) {
	network, address, bind, err := parseEndpoint(opts.Endpoint, opts.BindAll)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", opts.Endpoint, err)
	}
	if opts.QueueLen == 0 {
		opts.QueueLen = DefaultQueueLen
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	p := &Publisher{
		endpoint: opts.Endpoint,
		network:  network,
		address:  address,
		bind:     bind,
		topic:    []byte(opts.Topic),
		queue:    make(chan removal, opts.QueueLen),
		logger:   opts.Logger,
		stop:     make(chan struct{}),
		peers:    map[*peer]struct{}{},
	}
	if bind {
		if p.listener, err = net.Listen(network, address); err != nil {
			return nil, err
		}
		p.running.Go(p.accept)
	} else {
		p.running.Go(p.dial)
	}
	return p, nil
}

// Addr is the address a bound publisher listens on; nil for a connecting one.
func (p *Publisher) Addr() net.Addr {
	if p.listener == nil {
		return nil
	}
	return p.listener.Addr()
}

// accept serves the subscribers that connect to a bound publisher, at most
// maxPeers connections at a time, handshakes included, and at most
// maxPeersPerSource of one source.
func (p *Publisher) accept() {
	slots := make(chan struct{}, maxPeers)
	var mu sync.Mutex
	perSource := map[string]int{}
	for {
		conn, err := p.listener.Accept()
		if err != nil {
			select {
			case <-p.stop:
				return
			default:
			}
			p.logger.Warn("KV events: accept failed", "endpoint", p.endpoint, "err", err)
			if !p.sleep(dialRetry) {
				return
			}
			continue
		}
		from, err := source(conn)
		if err != nil {
			p.logger.Debug("KV events: cannot tell which user connected, bounded by its address", "remote", remote(conn), "err", err)
		}
		mu.Lock()
		full := perSource[from] >= maxPeersPerSource
		if !full {
			perSource[from]++
		}
		mu.Unlock()
		if full {
			p.logger.Debug("KV events: too many connections from one source, one closed", "source", from, "remote", remote(conn))
			conn.Close()
			continue
		}
		left := func() {
			mu.Lock()
			if perSource[from]--; perSource[from] == 0 {
				delete(perSource, from)
			}
			mu.Unlock()
		}
		select {
		case slots <- struct{}{}:
		default:
			p.logger.Debug("KV events: too many connections, one closed", "source", from, "remote", remote(conn))
			left()
			conn.Close()
			continue
		}
		p.running.Go(func() {
			defer func() { <-slots }()
			defer left()
			p.serve(conn)
		})
	}
}

// dial keeps a connecting publisher connected to its endpoint: it dials
// until the endpoint answers, serves it until the connection ends, and
// dials again.
func (p *Publisher) dial() {
	dialer := net.Dialer{Timeout: handshakeTimeout}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-p.stop
		cancel()
	}()
	warned := false
	for {
		conn, err := dialer.DialContext(ctx, p.network, p.address)
		if err == nil {
			warned = false
			p.serve(conn)
		} else if !warned && ctx.Err() == nil {
			warned = true
			p.logger.Warn("KV events: cannot connect, trying again", "endpoint", p.endpoint, "err", err)
		}
		if !p.sleep(dialRetry) {
			return
		}
	}
}

// sleep waits for d; false when the publisher closed meanwhile.
func (p *Publisher) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-p.stop:
		return false
	case <-t.C:
		return true
	}
}

// serve runs one subscriber's connection until it ends or the publisher
// closes: handshake, then its subscriptions in, batches out.
func (p *Publisher) serve(conn net.Conn) {
	defer conn.Close()
	stopped := make(chan struct{})
	defer close(stopped)
	go func() {
		select {
		case <-p.stop:
			conn.Close()
		case <-stopped:
		}
	}()
	pr := newPeer(conn)
	if err := pr.handshake(); err != nil {
		p.logger.Debug("KV events: handshake refused", "endpoint", p.endpoint, "remote", remote(conn), "err", err)
		return
	}
	p.mu.Lock()
	p.peers[pr] = struct{}{}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.peers, pr)
		p.mu.Unlock()
	}()
	writing := make(chan struct{})
	go func() {
		defer close(writing)
		pr.write()
	}()
	if err := pr.read(); err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
		p.logger.Debug("KV events: subscriber dropped", "endpoint", p.endpoint, "remote", remote(conn), "err", err)
	}
	pr.close()
	<-writing
}

// remote names a connection's peer for the log.
func remote(conn net.Conn) string {
	if a := conn.RemoteAddr(); a != nil {
		return a.String()
	}
	return ""
}

// subscribed tells whether some subscriber's subscription reached the publisher.
func (p *Publisher) subscribed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for pr := range p.peers {
		if pr.subscribed() {
			return true
		}
	}
	return false
}

// BlockGone queues a BlockRemoved event for the block at the store-relative
// path rel; other paths are ignored.
func (p *Publisher) BlockGone(rel string) {
	kind, name := block.Parse(rel)
	if kind != block.File {
		return
	}
	h, ok := blockHash(name.Hash)
	if !ok {
		return
	}
	select {
	case p.queue <- removal{group: name.Group, hash: h}:
	default:
		p.dropped.Add(1)
	}
}

// Counts returns the blocks published and dropped since Start; zero for a
// nil Publisher (events disabled).
func (p *Publisher) Counts() (published, dropped int64) {
	if p == nil {
		return 0, 0
	}
	return p.published.Load(), p.dropped.Load()
}

// Register adds the publisher's counters to reg.
func (p *Publisher) Register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvtierfs_kv_events_published_total",
			Help: "Removed blocks published as BlockRemoved KV events."},
			func() float64 { return float64(p.published.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvtierfs_kv_events_dropped_total",
			Help: "Removed blocks whose BlockRemoved KV event was dropped because the publisher's queue was full."},
			func() float64 { return float64(p.dropped.Load()) }),
	} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// Close stops publishing and closes the socket and its connections; blocks
// still queued are not sent.
func (p *Publisher) Close() error {
	p.stopOnce.Do(func() {
		close(p.stop)
		if p.listener != nil {
			p.listener.Close()
		}
		p.running.Wait()
	})
	return nil
}

// run publishes queued blocks in batches until Close.
func (p *Publisher) run() {
	batch := make([]removal, 0, maxBatchBlocks)
	for {
		select {
		case <-p.stop:
			return
		case r := <-p.queue:
			batch = append(batch[:0], r)
		}
	drain:
		for len(batch) < maxBatchBlocks {
			select {
			case r := <-p.queue:
				batch = append(batch, r)
			default:
				break drain
			}
		}
		p.send(batch)
	}
}

// send publishes one batch as vLLM's ZmqEventPublisher frames it: topic,
// sequence number (8 bytes, big-endian) and payload, to every subscriber
// whose subscription is a prefix of the topic. Blocks dropped since the last
// batch leave a gap in the sequence numbers, the sign by which vLLM's
// subscribers detect lost batches.
func (p *Publisher) send(batch []removal) {
	if dropped := p.dropped.Load(); dropped != p.reported {
		p.reported = dropped
		p.seq++
	}
	payload := encodeBatch(nil, float64(time.Now().UnixNano())/1e9, groupRemovals(batch))
	msg := encodeMessage(p.topic, binary.BigEndian.AppendUint64(nil, p.seq), payload)
	p.seq++
	p.mu.Lock()
	for pr := range p.peers {
		if pr.wants(p.topic) {
			pr.queue(msg)
		}
	}
	p.mu.Unlock()
	p.published.Add(int64(len(batch)))
}

// groupRemovals splits a batch into one event per KV cache group, groups in
// the order they first appear, as vLLM emits one BlockRemoved per group.
func groupRemovals(batch []removal) []removedBlocks {
	var events []removedBlocks
	index := map[int]int{}
	for _, r := range batch {
		i, ok := index[r.group]
		if !ok {
			i = len(events)
			index[r.group] = i
			events = append(events, removedBlocks{group: r.group})
		}
		events[i].hashes = append(events[i].hashes, r.hash)
	}
	return events
}
