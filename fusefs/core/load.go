package core

import (
	"context"
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
	// MirrorRow writes data, whose CRC32C is crc and whose non-zero pages
	// are the runs nonZero (block.NonZeroRuns), into the row ref on every
	// peer and returns once each acknowledged that checksum.
	MirrorRow(ctx context.Context, ref shm.RowRef, data []byte, crc uint32, nonZero []block.Run) error
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
// (tiers/shared.Level.Fetch); a block it does not hold is ENOENT. It returns
// the bytes it read, which the caller then owns (nil when a concurrent fetch
// of the block read them).
type Fetcher interface {
	Fetch(rel string) ([]byte, error)
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
	// FromStore: the block is read from the store while the load is served.
	FromStore
	// FromShared: the shared level's fetch had just read and verified the
	// block (counted with FromStore: the fetch published it in the store).
	FromShared
)

// Counters count what loads did; read them with Load.
type Counters struct {
	// FromStaging and FromRow count opens by Source; FromStore counts loads
	// read from the store once their bytes matched the digest.
	FromStaging, FromRow, FromStore atomic.Int64
	// Completed counts loads that delivered the whole block without an error.
	Completed atomic.Int64
	// Mirrored counts loads whose row every peer acknowledged before the
	// last read returned; MirrorFailures those whose read failed instead.
	Mirrored, MirrorFailures atomic.Int64
	// Refused counts loads refused: opens that failed (vanished block, no
	// room) and blocks whose bytes failed verification (corrupt).
	Refused atomic.Int64
	// InPlace counts loads served from the block file's pages in a store in
	// memory (disk.Mapped), with no copy; Remapped those of them that found
	// the block mapped and proven by an earlier load or by its store, and
	// ProvenAtStore those of them proven by its store: written through the
	// daemon under a write lease held since, so not even its first load
	// checked it.
	InPlace, Remapped, ProvenAtStore atomic.Int64
}

// Loads opens and serves block loads. The read that completes a load returns
// only once every byte of the block was checked against the block's digest,
// and on a multi-node group once the row it fills reached every peer
// (DESIGN.md "Loads: proven before the read returns").
type Loads struct {
	cfg    Config
	budget *semaphore.Weighted
	// readInto reads a pinned block from the store (disk.Reader.ReadInto).
	readInto func(r *disk.Reader, buf []byte, landed func(prefix int)) error
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
	return &Loads{cfg: cfg, budget: semaphore.NewWeighted(cfg.MaxBytes), readInto: (*disk.Reader).ReadInto}
}

// mirrors reports whether loads must reach peers before they return.
func (c *Loads) mirrors() bool { return c.cfg.Mirror != nil && c.cfg.Mirror.Mirrors() }

// Load is one open of a block for reading: the block is pinned and its bytes
// held until Release.
type Load struct {
	loads  *Loads
	r      *disk.Reader
	digest block.Digest
	buf    []byte
	// mapped is the mapped store file buf is, for a block served in place;
	// nil when buf is a copy.
	mapped *disk.Mapped
	// Source is where the bytes came from.
	Source Source
	// before lists the rows that held the block when it was opened, which a
	// row that holds it later may not be the destination of this load.
	before []shm.RowRef
	// background counts the goroutines that use buf: the store read, the
	// scan of its non-zero pages and the mirror.
	background sync.WaitGroup
	// scanned is closed once nonZero holds the runs of buf's non-zero pages,
	// found by scanLanded as a mirrored load's store read landed them; nil
	// when the load does not scan so (the mirror then finds them itself).
	scanned chan struct{}
	nonZero []block.Run

	mu sync.Mutex
	// landed is how many of the block's first bytes are in buf and matched
	// their chunk CRCs; proven is set once the whole of buf matched the
	// block's digest.
	landed int64
	proven bool
	// served are the ranges Read handed out for replies; delivered those
	// whose reply was sent.
	served, delivered spans
	// changed is closed and replaced whenever landed, proven, delivered or
	// err change.
	changed chan struct{}
	// samplesTried is how many of the digest's samples the delivered prefix
	// held when the destination row was last looked for; found are the
	// destination rows once known.
	samplesTried int
	found        []shm.RowRef
	// mirroring is closed when the mirror of found to the peers ended;
	// nil until it starts. rows are the rows every peer acknowledged.
	mirroring chan struct{}
	rows      []shm.RowRef
	// err is the load's first failure: later reads and flushes repeat it.
	err     error
	flushed bool
}

// Open pins a block and starts getting its bytes: from a row of the engine's
// region that still holds them or from staging (verified before Open
// returns), or by reading the store, which goes on after Open returns while
// Read serves the bytes already read (DESIGN.md "Loads: proven before the
// read returns").
func (c *Loads) Open(ctx context.Context, ref block.Ref) (*Load, error) {
	rel := ref.Rel
	// Present only in the shared store (its lookup said so): fetched,
	// verified and kept locally, then loaded from the bytes fetched.
	var fetched []byte
	r, err := localThenShared(rel, c.cfg.Shared, func(bytes []byte) (*disk.Reader, error) {
		fetched = bytes
		return c.cfg.Store.PinBlock(rel)
	})
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
		if fetched != nil {
			c.cfg.Store.RecycleBlock(fetched)
		}
		c.cfg.Logger.Error("load refused: open loads hold too many bytes; close loaded blocks", "path", rel, "limit_bytes", c.cfg.MaxBytes)
		return nil, fmt.Errorf("load %s: open loads hold more than %d bytes: %w", rel, c.cfg.MaxBytes, syscall.EBUSY)
	}
	if err := r.Accessed(); err != nil {
		c.cfg.Logger.Warn("could not move a loaded block's access time", "path", rel, "err", err)
	}
	l := &Load{loads: c, r: r, changed: make(chan struct{})}
	l.fill(ref, fetched)
	switch l.Source {
	case FromStaging:
		c.Counters.FromStaging.Add(1)
	case FromRow:
		c.Counters.FromRow.Add(1)
	case FromShared:
		// Proven at the open, as a load from the store is once verified.
		c.Counters.FromStore.Add(1)
	}
	return l, nil
}

// fill gets the block's bytes into l.buf: verified at once from the bytes
// a shared fetch just read, a row or staging, or from the store by a read
// that runs on in the background.
func (l *Load) fill(ref block.Ref, fetched []byte) {
	c, r := l.loads, l.r
	d := r.Digest()
	l.digest = d
	canFind := c.cfg.Regions != nil && c.cfg.Regions.Fits(d.Size)
	if canFind && c.mirrors() {
		l.before = c.cfg.Regions.Candidates(d)
	}
	// Bytes a shared fetch just read serve the load once proven against the
	// pinned block's digest: the store may hold another publication of the
	// name by now.
	if fetched != nil && (int64(len(fetched)) != d.Size || block.CRC32C(fetched) != d.CRC) {
		c.cfg.Store.RecycleBlock(fetched)
		fetched = nil
	}
	// A mirrored load reads its bytes itself (the mirror, the row's
	// search), which a mapping cut short under it would crash: it copies.
	inPlace := !c.mirrors()
	if fetched == nil && inPlace {
		// A block a load mapped and proved before, or its store wrote,
		// under a lease held since: no copy and no check.
		if m, ok := r.Mapped(); ok {
			l.buf, l.mapped, l.Source = m.Bytes(), m, FromStore
			l.landed, l.proven = d.Size, true
			c.Counters.InPlace.Add(1)
			c.Counters.Remapped.Add(1)
			if m.ProvenAtStore() {
				c.Counters.ProvenAtStore.Add(1)
			}
			c.Counters.FromStore.Add(1)
			return
		}
	}
	buf := fetched
	if fetched == nil {
		// A row that still holds the block comes first, once the file was
		// checked against the digest (a passthrough store's is the row's,
		// which the engine may have changed before the rename): it costs no
		// disk read, and a load served from it does not set staging
		// fetching the blocks after it, which rows that held this one
		// likely hold too (a reload).
		buf = c.cfg.Store.Buffer(int(d.Size))
		if canFind && r.FileChecked() {
			if _, ok := c.cfg.Regions.CopyHeld(d, buf); ok {
				l.buf, l.Source = buf, FromRow
				l.landed, l.proven = d.Size, true
				return
			}
		}
	}
	if c.cfg.Stager != nil {
		// Take stages the wave after this block, fetched or not.
		if staged, ok := c.cfg.Stager.Take(ref); ok {
			c.cfg.Store.RecycleBlock(buf)
			l.buf, l.Source = staged, FromStaging
			l.landed, l.proven = d.Size, true
			return
		}
		if fetched == nil {
			c.cfg.Stager.StoreLoadStarted()
		}
	}
	if fetched != nil {
		l.buf, l.Source = fetched, FromShared
		l.landed, l.proven = d.Size, true
		return
	}
	l.buf, l.Source = buf, FromStore
	if inPlace {
		if m, ok := r.Map(); ok {
			// A store in memory: its pages are served under the lease,
			// with no copy into a buffer of ours.
			c.cfg.Store.RecycleBlock(buf)
			l.buf, l.mapped = m.Bytes(), m
			c.Counters.InPlace.Add(1)
		}
	}
	if c.mirrors() {
		l.scanned = make(chan struct{})
		l.background.Go(l.scanLanded)
	}
	l.background.Go(l.readStore)
}

// scanLanded finds the non-zero pages of buf behind the store read, each
// stretch soon after it landed and matched its chunk CRCs, so that the
// mirror can send the proven block without first reading the whole row for
// them. It closes scanned when the whole block is scanned or the load failed.
func (l *Load) scanLanded() {
	defer close(l.scanned)
	var runs []block.Run
	scanned := 0
	for scanned < len(l.buf) {
		l.mu.Lock()
		for l.err == nil && !l.proven && int(l.landed)-scanned < block.PageSize {
			changed := l.changed
			l.mu.Unlock()
			<-changed
			l.mu.Lock()
		}
		// A proven block is scanned to its end even if the load fails
		// later: a mirror already started sends what the scan found.
		failed, end := l.err != nil && !l.proven, int(l.landed)
		if !l.proven {
			end -= end % block.PageSize
		}
		l.mu.Unlock()
		if failed {
			return
		}
		runs = block.AppendNonZeroRuns(runs, l.buf, scanned, end)
		scanned = end
	}
	l.nonZero = runs
}

// readStore reads the block from the store into l.buf, letting reads of the
// bytes landed so far through, and proves it or fails the load.
func (l *Load) readStore() {
	c := l.loads
	if c.cfg.Stager != nil {
		defer c.cfg.Stager.StoreLoadDone()
	}
	landed := func(prefix int) {
		// The first prefix bytes matched their chunk CRCs.
		l.mu.Lock()
		defer l.mu.Unlock()
		l.landed = int64(prefix)
		l.changedLocked()
	}
	var err error
	if l.mapped != nil {
		err = l.r.VerifyMapped(l.mapped, landed)
	} else {
		err = c.readInto(l.r, l.buf, landed)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		c.Counters.Refused.Add(1)
		l.failLocked(err)
		return
	}
	l.landed, l.proven = int64(len(l.buf)), true
	c.Counters.FromStore.Add(1) // counted once verified, not at the open
	l.changedLocked()
	if l.found != nil && l.mirroring == nil {
		l.startMirrorLocked()
	}
}

// changedLocked wakes every waiter for a change of the load's state.
func (l *Load) changedLocked() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// failLocked records the load's first failure.
func (l *Load) failLocked(err error) {
	if l.err == nil {
		l.err = err
		l.changedLocked()
	}
}

// Size is the block's size in bytes.
func (l *Load) Size() int64 { return int64(len(l.buf)) }

// Path is the block's store-relative path.
func (l *Load) Path() string { return l.r.Path() }

// Read returns the bytes of [off, off+n) (fewer at the end of the block) for
// the reply to one read request; call Delivered with the same range once the
// reply was sent. It waits until those bytes were read from the store and
// matched their chunk CRCs (a block whose digest has none: until the whole
// block matched), and the read that reaches the end of the block until the
// whole block matched its digest; a mismatch fails the read (EIO) and drops
// the block, so no reply ever carries a byte that was not proven, whatever
// the order and extent of the reads. On a
// multi-node group that read also waits until the row the earlier replies
// filled reached every peer; it fails (EIO) instead of returning when it
// cannot, so no rank counts the load as done while another holds stale bytes.
func (l *Load) Read(ctx context.Context, off int64, n int) ([]byte, error) {
	size := int64(len(l.buf))
	if off >= size || n <= 0 {
		return nil, l.failure()
	}
	end := min(off+int64(n), size)
	if err := l.waitLanded(end); err != nil {
		return nil, err
	}
	if end == size && l.loads.mirrors() {
		if err := l.mirror(off); err != nil {
			return nil, err
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return nil, l.err
	}
	if err := l.stillInPlaceLocked(); err != nil {
		return nil, err
	}
	l.served.add(off, end)
	return l.buf[off:end], nil
}

// stillInPlaceLocked fails a load served in place once someone opened its
// store file for writing (or truncated it): its bytes may no longer be those
// proven. Asked before a reply leaves and again once it was written, it
// tells every reply whose bytes could have changed (the writer waits in the
// kernel for the lease, lease-break-time after the break began).
func (l *Load) stillInPlaceLocked() error {
	if l.mapped == nil || l.err != nil || l.mapped.KeepsWritersOut() {
		return l.err
	}
	l.loads.Counters.Refused.Add(1)
	l.loads.cfg.Logger.Error("load failed: its store file was opened for writing while it was served", "path", l.Path())
	l.failLocked(fmt.Errorf("load %s: the store file was opened for writing while it was served: %w", l.Path(), syscall.EIO))
	return l.err
}

// waitLanded waits until the block's first end bytes are in buf and proven
// chunk by chunk, and the whole block proven when end is its size.
func (l *Load) waitLanded(end int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for {
		switch {
		case l.err != nil:
			return l.err
		case l.proven, end < int64(len(l.buf)) && l.landed >= end:
			return nil
		}
		changed := l.changed
		l.mu.Unlock()
		<-changed
		l.mu.Lock()
	}
}

// failure returns the load's first failure.
func (l *Load) failure() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Delivered records that the bytes of [off, end) reached the reader. On a
// multi-node group, once the delivered bytes from the block's start hold
// another of the digest's samples, it looks for the row they landed in, so
// that the row starts on its way to the peers while the engine's read goes on.
func (l *Load) Delivered(off, end int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.delivered.add(off, end)
	l.changedLocked()
	if !l.flushed {
		// Past the close the engine has its answer; the check is for it.
		l.stillInPlaceLocked()
	}
	if l.found == nil && l.err == nil && l.loads.mirrors() {
		l.findRowLocked(l.delivered.prefix(), false)
	}
}

// findRowLocked looks for the rows that received the block's first prefix
// bytes, unless the last look saw as many samples (or, when final, at all),
// and starts mirroring them once the block is proven. It reports whether the
// rows are known.
func (l *Load) findRowLocked(prefix int64, final bool) bool {
	c := l.loads
	if c.cfg.Regions == nil || prefix <= 0 || prefix >= int64(len(l.buf)) {
		return false
	}
	samples := 0
	for _, s := range l.digest.Samples {
		if int64(s.Off)+8 <= prefix {
			samples++
		}
	}
	if !final && (samples == 0 || samples <= l.samplesTried) {
		return false
	}
	l.samplesTried = samples
	rows := c.cfg.Regions.Destinations(l.digest, l.buf[:prefix], l.before)
	if len(rows) == 0 {
		return false
	}
	l.found = rows
	if l.proven {
		l.startMirrorLocked()
	}
	return true
}

// startMirrorLocked sends the proven block to the found rows on every peer
// in the background; mirroring is closed when every peer acknowledged or one
// failed (which fails the load).
func (l *Load) startMirrorLocked() {
	done := make(chan struct{})
	l.mirroring = done
	rows := l.found
	l.background.Go(func() {
		c := l.loads
		var nonZero []block.Run
		if l.scanned != nil {
			<-l.scanned
			nonZero = l.nonZero
		} else {
			nonZero = block.NonZeroRuns(l.buf, 0)
		}
		var err error
		for _, ref := range rows {
			if err = c.cfg.Mirror.MirrorRow(context.Background(), ref, l.buf, l.digest.CRC, nonZero); err != nil {
				err = fmt.Errorf("row %d of %s: %v", ref.Row, ref.Region, err)
				break
			}
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		if err != nil {
			l.mirrorFailedLocked("%v", err)
		} else {
			l.rows = rows
			c.Counters.Mirrored.Add(1)
		}
		close(done)
	})
}

// mirrorFailedLocked fails the load because its row may not have reached
// every peer.
func (l *Load) mirrorFailedLocked(format string, args ...any) error {
	c := l.loads
	msg := fmt.Sprintf(format, args...)
	c.Counters.MirrorFailures.Add(1)
	c.cfg.Logger.Error("load failed: its row did not reach every peer, so the read fails before other ranks could load stale bytes", "path", l.Path(), "reason", msg)
	l.failLocked(fmt.Errorf("load %s: %s: %w", l.Path(), msg, syscall.EIO))
	return l.err
}

// mirror waits, for the read of [last, size) of a proven block, until the
// block reached its row on every peer. The row was found from the replies
// already delivered, or is found now from those of [0, last), once they are.
func (l *Load) mirror(last int64) error {
	l.mu.Lock()
	if l.mirroring == nil {
		if err := l.findLastLocked(last); err != nil {
			l.mu.Unlock()
			return err
		}
	}
	done := l.mirroring
	l.mu.Unlock()
	<-done
	return l.failure()
}

// findLastLocked finds the destination rows from the delivered bytes of
// [0, last), waiting for them up to the deadline, and starts the mirror.
func (l *Load) findLastLocked(last int64) error {
	c := l.loads
	if l.err != nil {
		return l.err
	}
	if last == 0 {
		return l.mirrorFailedLocked("the row arrived in one read request, so its destination cannot be found before it returns (rows of a mirrored mount must be larger than its read requests)")
	}
	if c.cfg.Regions == nil || len(l.digest.Samples) == 0 {
		return l.mirrorFailedLocked("no digest or region to find its row by")
	}
	until := time.Now().Add(c.cfg.Deadline)
	for !l.delivered.covers(0, last) {
		wait := time.Until(until)
		if wait <= 0 {
			return l.mirrorFailedLocked("the first %d bytes were not delivered within %s", last, c.cfg.Deadline)
		}
		changed := l.changed
		l.mu.Unlock()
		timer := time.NewTimer(wait)
		select {
		case <-changed:
		case <-timer.C:
		}
		timer.Stop()
		l.mu.Lock()
		if l.mirroring != nil || l.err != nil {
			return l.err
		}
	}
	if !l.findRowLocked(last, true) {
		return l.mirrorFailedLocked("no row of the engine's region received its first %d bytes", last)
	}
	return nil
}

// Flush is the engine's close. It repeats a failed read's error, for engines
// that honour close errors, and checks as a second line that every mirrored
// row still agrees with the block's samples: the row's bytes were proven
// before the last read returned (each reply carried proven bytes, every peer
// acknowledged the block's CRC32C), so a second pass over the row would
// delay the engine's next load for a check the engine ignores. A load whose reads were answered for the whole
// block without error counts as completed, once (the kernel may pass the
// reader's close before go-fuse reports the last reply delivered).
func (l *Load) Flush() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.flushed {
		return l.err
	}
	l.flushed = true
	if err := l.stillInPlaceLocked(); err != nil {
		return err
	}
	for _, ref := range l.rows {
		if !l.loads.cfg.Regions.SamplesHeld(ref, l.digest) {
			l.loads.cfg.Logger.Error("mirrored row changed before the load's close", "path", l.Path(), "row", ref.Row, "region", ref.Region)
			l.err = fmt.Errorf("load %s: row %d changed before close: %w", l.Path(), ref.Row, syscall.EIO)
			return l.err
		}
	}
	if l.proven && l.served.covers(0, int64(len(l.buf))) {
		l.loads.Counters.Completed.Add(1)
		l.loads.cfg.Store.CountRead(int64(len(l.buf)))
	}
	return nil
}

// Release waits for the store read and the mirror to end, then unpins the
// block and recycles its bytes: call it once no reply refers to them any
// more (the kernel's RELEASE comes after every READ of the handle was
// answered).
func (l *Load) Release() error {
	l.background.Wait()
	if l.mapped != nil {
		// go-fuse may report a reply delivered after the kernel's RELEASE:
		// nothing asks the lease once the mapping is released.
		l.mu.Lock()
		l.mapped.Release()
		l.mapped = nil
		l.mu.Unlock()
	} else {
		l.loads.cfg.Store.RecycleBlock(l.buf)
	}
	l.loads.budget.Release(int64(len(l.buf)))
	l.buf = nil
	return l.r.Close()
}
