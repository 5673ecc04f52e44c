package core

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/kvtierfs/kvtierfs/tiers/block"
	"github.com/kvtierfs/kvtierfs/tiers/disk"
	"github.com/kvtierfs/kvtierfs/tiers/shm"
)

// Stager is the wave stager as loads use it (staging.Stager).
type Stager interface {
	// Take hands over a staged block's verified bytes, or reports none.
	Take(key block.Ref) ([]byte, bool)
	// StoreLoadStarted and StoreLoadDone bracket a load's own store read.
	StoreLoadStarted()
	StoreLoadDone()
}

// Mirror copies the row a load fills to the peer ranks.
type Mirror interface {
	// Mirrors reports whether loads must reach the peers before they return.
	Mirrors() bool
	// MirrorRow writes block, whose CRC32C is crc, into the row ref on every
	// peer and returns once each acknowledged that checksum.
	MirrorRow(ctx context.Context, ref shm.RowRef, block []byte, crc uint32) error
}

// Config is what Loads works with.
type Config struct {
	// Store holds the blocks.
	Store *disk.Store
	// Regions are the engine's shm regions; nil when none are watched.
	Regions *shm.Set
	// Stager serves staged blocks; nil when staging is off.
	Stager Stager
	// Mirror reaches the peer ranks; nil on a single node.
	Mirror Mirror
	// Deadline bounds how long a load's last read waits for the replies to
	// its earlier reads, before the row is identified; 0 means DefaultDeadline.
	Deadline time.Duration
	// MaxBytes bounds the bytes that open loads hold; 0 means DefaultMaxBytes.
	MaxBytes int64
	// OpenWait is how long an open waits for open loads to release bytes
	// beyond MaxBytes before it fails with EBUSY; 0 means DefaultOpenWait.
	OpenWait time.Duration
	// Logger receives load failures; nil discards them.
	Logger *slog.Logger
	// Shared fetches a block missing locally from the shared level; nil without one.
	Shared Fetcher
}

// Fetcher brings a block from the shared level into the store, verified
// (tiers/shared.Level.Fetch); a block it does not hold is ENOENT.
type Fetcher interface {
	Fetch(rel string) error
}

// DefaultDeadline is Config.Deadline's default.
const DefaultDeadline = 2 * time.Second

// DefaultMaxBytes is Config.MaxBytes's default: room for 16 loader threads
// with rows of up to 64 MiB.
const DefaultMaxBytes = 1 << 30

// DefaultOpenWait is Config.OpenWait's default.
const DefaultOpenWait = 10 * time.Second

// Source is where a load's bytes came from.
type Source uint8

const (
	// FromStaging: the stager had read and verified the block ahead.
	FromStaging Source = iota
	// FromRow: a row of the engine's region still held the block.
	FromRow
	// FromStore: the block was read from the store at open.
	FromStore
)

// Counters count what loads did; read them with Load.
type Counters struct {
	// FromStaging, FromRow and FromStore count opens by Source.
	FromStaging, FromRow, FromStore atomic.Int64
	// Completed counts loads that delivered the whole block without an error.
	Completed atomic.Int64
	// Mirrored counts loads whose row every peer acknowledged before the
	// last read returned; MirrorFailures those whose read failed instead.
	Mirrored, MirrorFailures atomic.Int64
	// Refused counts opens that failed (corrupt or vanished block, no room).
	Refused atomic.Int64
}

// Loads opens and serves block loads. Every byte a load delivers was checked
// against the block's digest before the open returned, and on a multi-node
// group the row it fills reaches every peer before the read that completes it
// returns (DESIGN.md "Loads: proven before the read returns").
type Loads struct {
	cfg      Config
	budget   *semaphore.Weighted
	Counters Counters
}

// NewLoads returns Loads over cfg.
func NewLoads(cfg Config) *Loads {
	if cfg.Deadline == 0 {
		cfg.Deadline = DefaultDeadline
	}
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	if cfg.OpenWait == 0 {
		cfg.OpenWait = DefaultOpenWait
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Loads{cfg: cfg, budget: semaphore.NewWeighted(cfg.MaxBytes)}
}

// mirrors reports whether loads must reach peers before they return.
func (c *Loads) mirrors() bool { return c.cfg.Mirror != nil && c.cfg.Mirror.Mirrors() }

// Load is one open of a block for reading: the block is pinned and its
// verified bytes held until Release.
type Load struct {
	loads  *Loads
	r      *disk.Reader
	digest block.Digest
	buf    []byte
	// Source is where the bytes came from.
	Source Source
	// before lists the rows that held the block when it was opened, which a
	// row that holds it later may not be the destination of this load.
	before []shm.RowRef

	mu sync.Mutex
	// served are the ranges Read handed out for replies; delivered those
	// whose reply was sent.
	served, delivered spans
	// progress is closed and replaced whenever delivered grows.
	progress chan struct{}
	// mirrorDone is set once the row went to every peer; rows are those rows.
	mirrorDone bool
	rows       []shm.RowRef
	// err is the load's first failure: later reads and flushes repeat it.
	err     error
	flushed bool
}

// Open pins a block and gets its verified bytes: from a row of the engine's
// region that still holds them, from staging, or by reading the store. A block
// whose bytes fail their digest is dropped and the open fails with EIO.
func (c *Loads) Open(ctx context.Context, ref block.Ref) (*Load, error) {
	rel := ref.Rel
	r, err := c.cfg.Store.PinBlock(rel)
	if errors.Is(err, syscall.ENOENT) && c.cfg.Shared != nil {
		// Present only in the shared store (its lookup said so): fetched,
		// verified and kept locally, then loaded as any block.
		if err = c.cfg.Shared.Fetch(rel); err == nil {
			r, err = c.cfg.Store.PinBlock(rel)
		}
	}
	if err != nil {
		c.Counters.Refused.Add(1)
		return nil, err
	}
	size := r.Size()
	waitCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.OpenWait)
	defer cancel()
	if err := c.budget.Acquire(waitCtx, size); err != nil {
		r.Close()
		c.Counters.Refused.Add(1)
		c.cfg.Logger.Error("load refused: open loads hold too many bytes; close loaded blocks", "path", rel, "limit_bytes", c.cfg.MaxBytes)
		return nil, fmt.Errorf("load %s: open loads hold more than %d bytes: %w", rel, c.cfg.MaxBytes, syscall.EBUSY)
	}
	l := &Load{loads: c, r: r, progress: make(chan struct{})}
	if err := l.fill(ref); err != nil {
		c.budget.Release(size)
		r.Close()
		c.Counters.Refused.Add(1)
		return nil, err
	}
	switch l.Source {
	case FromStaging:
		c.Counters.FromStaging.Add(1)
	case FromRow:
		c.Counters.FromRow.Add(1)
	case FromStore:
		c.Counters.FromStore.Add(1)
	}
	return l, nil
}

// fill gets the block's verified bytes into l.buf.
func (l *Load) fill(ref block.Ref) error {
	c, r := l.loads, l.r
	d, hasDigest := r.Digest()
	canFind := hasDigest && c.cfg.Regions != nil && c.cfg.Regions.Fits(d.Size)
	if canFind && c.mirrors() {
		l.before = c.cfg.Regions.Candidates(d)
	}
	// A row that still holds the block comes first: it costs no disk read,
	// and a load served from it does not set staging fetching the blocks
	// after it, which rows that held this one likely hold too (a reload).
	if canFind {
		buf := c.cfg.Store.Buffer(int(d.Size))
		if _, ok := c.cfg.Regions.CopyHeld(d, buf); ok {
			l.buf, l.digest, l.Source = buf, d, FromRow
			return nil
		}
		c.cfg.Store.RecycleBlock(buf)
	}
	if c.cfg.Stager != nil {
		if buf, ok := c.cfg.Stager.Take(ref); ok {
			l.buf, l.digest, l.Source = buf, d, FromStaging
			return nil
		}
	}
	if c.cfg.Stager != nil {
		c.cfg.Stager.StoreLoadStarted()
		defer c.cfg.Stager.StoreLoadDone()
	}
	buf, err := r.ReadAll()
	if err != nil {
		return err
	}
	l.buf, l.Source = buf, FromStore
	l.digest, _ = r.Digest()
	return nil
}

// Size is the block's size in bytes.
func (l *Load) Size() int64 { return int64(len(l.buf)) }

// Path is the block's store-relative path.
func (l *Load) Path() string { return l.r.Path() }

// Read returns the bytes of [off, off+n) (fewer at the end of the block) for
// the reply to one read request; call Delivered with the same range once the
// reply was sent. On a multi-node group the read that reaches the end of the
// block first waits until every earlier range was delivered, identifies the
// row they landed in and mirrors it to every peer; it fails (EIO) instead of
// returning when it cannot, so no rank counts the load as done while another
// holds stale bytes.
func (l *Load) Read(ctx context.Context, off int64, n int) ([]byte, error) {
	size := int64(len(l.buf))
	if off >= size || n <= 0 {
		return nil, l.failure()
	}
	end := min(off+int64(n), size)
	if end == size && l.loads.mirrors() {
		if err := l.mirror(context.WithoutCancel(ctx), off); err != nil {
			return nil, err
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return nil, l.err
	}
	l.served.add(off, end)
	return l.buf[off:end], nil
}

// failure returns the load's first failure.
func (l *Load) failure() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Delivered records that the bytes of [off, end) reached the reader.
func (l *Load) Delivered(off, end int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.delivered.add(off, end)
	close(l.progress)
	l.progress = make(chan struct{})
}

// mirror sends the block to the row it is filling on every peer, once: the
// row is found from the bytes of [0, last) already delivered.
func (l *Load) mirror(ctx context.Context, last int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.mirrorDone || l.err != nil {
		return l.err
	}
	c := l.loads
	fail := func(format string, args ...any) error {
		msg := fmt.Sprintf(format, args...)
		c.Counters.MirrorFailures.Add(1)
		c.cfg.Logger.Error("load failed: its row did not reach every peer, so the read fails before other ranks could load stale bytes", "path", l.Path(), "reason", msg)
		l.err = fmt.Errorf("load %s: %s: %w", l.Path(), msg, syscall.EIO)
		return l.err
	}
	if last == 0 {
		return fail("the row arrived in one read request, so its destination cannot be found before it returns (rows of a mirrored mount must be larger than its read requests)")
	}
	if c.cfg.Regions == nil || len(l.digest.Samples) == 0 {
		return fail("no digest or region to find its row by")
	}
	until := time.Now().Add(c.cfg.Deadline)
	for !l.delivered.covers(0, last) {
		wait := time.Until(until)
		if wait <= 0 {
			return fail("the first %d bytes were not delivered within %s", last, c.cfg.Deadline)
		}
		progress := l.progress
		l.mu.Unlock()
		timer := time.NewTimer(wait)
		select {
		case <-progress:
		case <-timer.C:
		}
		timer.Stop()
		l.mu.Lock()
		if l.mirrorDone || l.err != nil {
			return l.err
		}
	}
	rows := c.cfg.Regions.Destinations(l.digest, l.buf[:last], l.before)
	if len(rows) == 0 {
		return fail("no row of the engine's region received its first %d bytes", last)
	}
	for _, ref := range rows {
		if err := c.cfg.Mirror.MirrorRow(ctx, ref, l.buf, l.digest.CRC); err != nil {
			return fail("row %d of %s: %v", ref.Row, ref.Region, err)
		}
	}
	l.mirrorDone, l.rows = true, rows
	c.Counters.Mirrored.Add(1)
	return nil
}

// Flush is the engine's close. It repeats a failed read's error, for engines
// that honour close errors, and checks as a second line that every mirrored
// row still holds the block. A load whose reads were answered for the whole
// block without error counts as completed, once (the kernel may pass the
// reader's close before go-fuse reports the last reply delivered).
func (l *Load) Flush() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.flushed {
		return l.err
	}
	l.flushed = true
	if l.err != nil {
		return l.err
	}
	for _, ref := range l.rows {
		if !l.loads.cfg.Regions.Holds(ref, l.digest) {
			l.loads.cfg.Logger.Error("mirrored row changed before the load's close", "path", l.Path(), "row", ref.Row, "region", ref.Region)
			l.err = fmt.Errorf("load %s: row %d changed before close: %w", l.Path(), ref.Row, syscall.EIO)
			return l.err
		}
	}
	if l.served.covers(0, int64(len(l.buf))) {
		l.loads.Counters.Completed.Add(1)
		l.loads.cfg.Store.CountRead(int64(len(l.buf)))
	}
	return nil
}

// Release unpins the block and recycles its bytes: call it once no reply
// refers to them any more (the kernel's RELEASE comes after every READ of the
// handle was answered).
func (l *Load) Release() error {
	l.loads.cfg.Store.RecycleBlock(l.buf)
	l.loads.budget.Release(int64(len(l.buf)))
	l.buf = nil
	return l.r.Close()
}
