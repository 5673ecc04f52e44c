package kvevents

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// DefaultQueueLen is how many removed blocks may wait for the publisher
// before more are dropped.
const DefaultQueueLen = 1 << 16

const (
	// maxBatchBlocks bounds the blocks of one KVEventBatch.
	maxBatchBlocks = 4096
	// socketHWM is how many batches the socket keeps for a subscriber that
	// reads slowly; past it the socket drops them, as libzmq's PUB does.
	socketHWM = 10000
	// dialRetry is the wait between attempts to reach a connect endpoint.
	dialRetry = 500 * time.Millisecond
	// A connecting publisher whose socket has had no subscription for
	// redialAfter checks redialCheck apart opens a new socket and dials
	// again (the router went away, or never answered as a ZMQ peer).
	redialCheck = time.Second
	redialAfter = 3
)

// Options configures a Publisher.
type Options struct {
	// Endpoint is the ZMQ address, read as vLLM's ZmqEventPublisher reads
	// its endpoint: one holding "*" or "::", or an ipc:// or inproc://
	// address, is bound (tcp://*:5557: routers connect to the node); any
	// other is connected to (tcp://router:5557), again and again until it
	// answers and after each loss.
	Endpoint string
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
	bind     bool
	topic    []byte
	queue    chan removal
	logger   *slog.Logger
	stop     chan struct{}
	running  sync.WaitGroup
	stopOnce sync.Once

	// mu guards the socket, which the publishing goroutine replaces when a
	// connecting publisher dials again.
	mu        sync.Mutex
	sock      zmq4.Socket
	closeSock func()

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
	transport, addr, found := strings.Cut(endpoint, "://")
	if !found || addr == "" || (transport != "tcp" && transport != "ipc" && transport != "inproc") {
		return fmt.Errorf("want a ZMQ address: tcp://*:5557 to bind, tcp://HOST:PORT to connect, or ipc://PATH")
	}
	return nil
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

// open opens the socket of a publisher that does not publish yet.
func open(opts Options) (*Publisher, error) {
	if err := CheckEndpoint(opts.Endpoint); err != nil {
		return nil, fmt.Errorf("%s: %w", opts.Endpoint, err)
	}
	transport, _, _ := strings.Cut(opts.Endpoint, "://")
	if opts.QueueLen == 0 {
		opts.QueueLen = DefaultQueueLen
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	p := &Publisher{
		endpoint: opts.Endpoint,
		bind:     strings.Contains(opts.Endpoint, "*") || strings.Contains(opts.Endpoint, "::") || transport != "tcp",
		topic:    []byte(opts.Topic),
		queue:    make(chan removal, opts.QueueLen),
		logger:   opts.Logger,
		stop:     make(chan struct{}),
	}
	if err := p.connect(); err != nil {
		return nil, err
	}
	return p, nil
}

// connect opens a new socket, binds it or starts dialing, and puts it in
// place of the previous one, which it closes.
//
// zmq4's own automatic reconnection is not used: it dials from inside the
// socket's writer when a send fails, while holding the lock that adding the
// new connection takes, and deadlocks the socket.
func (p *Publisher) connect() error {
	ctx, cancel := context.WithCancel(context.Background())
	opts := []zmq4.Option{zmq4.WithLogger(slog.NewLogLogger(p.logger.Handler(), slog.LevelDebug))}
	if !p.bind {
		opts = append(opts, zmq4.WithDialerRetry(dialRetry), zmq4.WithDialerMaxRetries(-1))
	}
	sock := zmq4.NewPub(ctx, opts...)
	closeSock := func() {
		cancel()
		sock.Close()
	}
	if err := sock.SetOption(zmq4.OptionHWM, socketHWM); err != nil {
		closeSock()
		return err
	}
	if p.bind {
		if err := sock.Listen(p.endpoint); err != nil {
			closeSock()
			return err
		}
	} else {
		go func() {
			err := sock.Dial(p.endpoint)
			if ctx.Err() != nil {
				// Replaced or closed while dialing: a connection made
				// since then is closed with the socket.
				sock.Close()
				return
			}
			if err != nil {
				p.logger.Warn("KV events: cannot connect", "endpoint", p.endpoint, "err", err)
			}
		}()
	}
	p.mu.Lock()
	previous := p.closeSock
	p.sock, p.closeSock = sock, closeSock
	p.mu.Unlock()
	if previous != nil {
		previous()
	}
	return nil
}

// socket is the socket in use.
func (p *Publisher) socket() zmq4.Socket {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sock
}

// subscribed tells whether some subscriber's subscription reached the socket.
func (p *Publisher) subscribed() bool {
	return len(p.socket().(zmq4.Topics).Topics()) > 0
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

// Close stops publishing and closes the socket; blocks still queued are not sent.
func (p *Publisher) Close() error {
	p.stopOnce.Do(func() {
		close(p.stop)
		p.running.Wait()
		p.mu.Lock()
		p.closeSock()
		p.mu.Unlock()
	})
	return nil
}

// run publishes queued blocks in batches until Close; a connecting
// publisher also dials again when its socket stays without a subscription.
func (p *Publisher) run() {
	var redial <-chan time.Time
	if !p.bind {
		tick := time.NewTicker(redialCheck)
		defer tick.Stop()
		redial = tick.C
	}
	unsubscribed := 0
	batch := make([]removal, 0, maxBatchBlocks)
	for {
		select {
		case <-p.stop:
			return
		case <-redial:
			if p.subscribed() {
				unsubscribed = 0
			} else if unsubscribed++; unsubscribed >= redialAfter {
				unsubscribed = 0
				if err := p.connect(); err != nil {
					p.logger.Warn("KV events: cannot open a new socket", "endpoint", p.endpoint, "err", err)
				}
			}
			continue
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
// sequence number (8 bytes, big-endian) and payload. Blocks dropped since the
// last batch leave a gap in the sequence numbers, the sign by which vLLM's
// subscribers detect lost batches. The socket queues the frames and writes
// them later, so each batch has a buffer of its own.
func (p *Publisher) send(batch []removal) {
	if dropped := p.dropped.Load(); dropped != p.reported {
		p.reported = dropped
		p.seq++
	}
	payload := encodeBatch(nil, float64(time.Now().UnixNano())/1e9, groupRemovals(batch))
	seq := binary.BigEndian.AppendUint64(nil, p.seq)
	p.seq++
	if err := p.socket().Send(zmq4.NewMsgFrom(p.topic, seq, payload)); err != nil {
		p.logger.Debug("KV events: send failed", "err", err)
		return
	}
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
