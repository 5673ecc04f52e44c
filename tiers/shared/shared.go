// Package shared is the second level behind the node's store: a directory on
// a distributed filesystem that several nodes share (DESIGN.md "The shared
// level"). Blocks published locally are written behind to it, lookups that
// miss locally read through to it, and one node at a time, holding a lease,
// keeps it within its capacity. Every call to the shared directory runs under
// a time bound, so a filesystem whose server vanished costs lookups nothing
// but a fast "absent".
//
// The shared directory has the local store's layout
// (`<tier>/<h[0:3]>/<h[3:5]>_g<N>/<h>.bin`, written tmp + rename), so it is
// also a valid vLLM fs-tier root. A block's digest record is the local
// store's, in the same xattr, or in a sidecar `<h>.bin.kvdigest` where the
// filesystem keeps no xattrs.
package shared

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// Defaults of Config, also the daemon's flag defaults.
const (
	DefaultRate        = 256 << 20
	DefaultQueueBytes  = 1 << 30
	DefaultNegativeTTL = 2 * time.Second
	DefaultTimeout     = 2 * time.Second
	DefaultLeaseTTL    = 10 * time.Second
	// DefaultPositiveTTL is how long a present answer is trusted: a block
	// evicted meanwhile is a miss at its load, never an error.
	DefaultPositiveTTL = 30 * time.Second
	// DefaultProtect keeps blocks written, fetched or looked up this recently
	// from the shared evictor: a replica that found a block loads it within
	// seconds.
	DefaultProtect = 10 * time.Second
	// scanShare bounds the time the lease holder spends walking the shared
	// layout: a walk that took d waits scanShare×d before the next.
	scanShare = 10
	// DefaultWorkers bounds the calls to the shared directory in flight.
	DefaultWorkers = 8
	// maxCached bounds the lookup answers kept (positive and negative).
	maxCached = 1 << 18
	// maxRecent bounds the recently used keys the evictor protects.
	maxRecent = 1 << 16
	// maxAdmitted bounds the keys remembered as written behind, which the
	// looked-up admission consults.
	maxAdmitted = 1 << 18
)

// Admission chooses which published blocks are written behind.
type Admission int

const (
	// AdmitAll writes every published block behind.
	AdmitAll Admission = iota
	// AdmitLookedUp writes a block behind once it answered a lookup locally.
	AdmitLookedUp
)

// ParseAdmission reads --shared-admit.
func ParseAdmission(s string) (Admission, error) {
	switch s {
	case "all", "":
		return AdmitAll, nil
	case "looked-up":
		return AdmitLookedUp, nil
	}
	return 0, fmt.Errorf("--shared-admit %q: want all or looked-up", s)
}

// Local is the node's own store as the level uses it (disk.Store).
type Local interface {
	// ReadBlock reads a local block whole, verified against its digest.
	ReadBlock(rel string) ([]byte, error)
	RecycleBlock(buf []byte)
	// Import publishes a block's bytes locally through the store's write path.
	Import(rel string, data []byte) error
}

// Clock is the level's time; tests move it by hand.
type Clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Config configures a Level.
type Config struct {
	// Dir is the shared directory (for stats); FS reaches it, NewOSDir(Dir) if nil.
	Dir string
	FS  Dir
	// Key authenticates everything the level reads back from the shared
	// directory (auth.go); every replica holds the same, at least MinKeyBytes.
	Key []byte
	// Local is the node's store.
	Local Local
	// Capacity bounds the bytes of blocks in the shared store; 0 disables eviction.
	Capacity int64
	Admit    Admission
	// Rate is the write-behind byte budget per second; QueueBytes bounds the
	// bytes waiting to be written behind (the oldest are dropped beyond it).
	Rate, QueueBytes int64
	// NegativeTTL and PositiveTTL bound how long absent and present answers are trusted.
	NegativeTTL, PositiveTTL time.Duration
	// Timeout bounds every call to the shared directory.
	Timeout time.Duration
	// LeaseTTL is the eviction lease's lifetime, renewed at a third of it.
	LeaseTTL time.Duration
	// Protect keeps recently used blocks from the evictor; ScanInterval is
	// how often the holder walks the layout at most (LeaseTTL if 0; a walk
	// that took d waits at least scanShare×d).
	Protect, ScanInterval time.Duration
	// Holder names this node in the lease; the host name and pid if empty.
	Holder  string
	Workers int
	Clock   Clock
	Logger  *slog.Logger
}

// Stats is a snapshot of the level (the "shared" section of stats.json,
// fusefs/ctlabi.Shared).
type Stats struct {
	Dir             string
	Reachable       bool
	QueueBlocks     int64
	QueueBytes      int64
	BytesBehind     int64
	WrittenBlocks   int64
	WrittenBytes    int64
	DroppedBlocks   int64
	FetchedBlocks   int64
	FetchedBytes    int64
	FetchSecondsAvg float64
	Lookups         int64
	LookupHits      int64
	NegativeHits    int64
	CorruptDropped  int64
	Timeouts        int64
	LeaseHolder     string
	LeaseHeld       bool
	CapacityBytes   int64
	UsedBytes       int64
	EvictedBlocks   int64
	// JournalNames are the names the journal holds; JournalFallbacks the
	// lookups it could not answer, which went to the listings.
	JournalNames     int64
	JournalFallbacks int64
	// BehindGrowing is set when the bytes waiting to be written behind
	// kept growing over the last half minute: the shared store does not
	// keep up.
	BehindGrowing bool
}

// counters are the level's event counts.
type counters struct {
	written, writtenBytes, dropped     atomic.Int64
	fetched, fetchedBytes, fetchNanos  atomic.Int64
	lookups, lookupHits, negativeHits  atomic.Int64
	corruptDropped, evicted, usedBytes atomic.Int64
	journalFallbacks                   atomic.Int64
}

// Level is the shared level of one node. All methods are safe for concurrent use.
type Level struct {
	cfg   Config
	dir   Dir
	bound *bound
	c     counters

	wb      writeBehind
	reads   readThrough
	journal journal
	lease   lease

	// xattrsRefused is set once the shared filesystem refused an xattr:
	// records go to sidecar files from then on.
	xattrsRefused atomic.Bool

	stop chan struct{}
	wg   sync.WaitGroup
}

// New starts the level: the write-behind worker and the lease keeper.
func New(cfg Config) (*Level, error) {
	if cfg.Local == nil {
		return nil, fmt.Errorf("shared level without a local store")
	}
	if len(cfg.Key) < MinKeyBytes {
		return nil, fmt.Errorf("shared level with a key of %d bytes, want at least %d", len(cfg.Key), MinKeyBytes)
	}
	if cfg.FS == nil {
		cfg.FS = NewOSDir(cfg.Dir)
	}
	setDefaults(&cfg)
	l := &Level{cfg: cfg, dir: cfg.FS, stop: make(chan struct{})}
	l.bound = newBound(cfg.Workers, cfg.Timeout, l.probe)
	// A directory that does not answer now (its servers are down) does not
	// keep the node from serving: the level starts unreachable.
	root, err := call(l.bound, func() (FileInfo, error) { return l.dir.Stat(".") })
	switch {
	case retryable(err):
		cfg.Logger.Warn("the shared store does not answer: starting without it until it does", "dir", cfg.Dir, "err", err)
	case err != nil:
		l.bound.close()
		return nil, fmt.Errorf("--shared %s: %w", cfg.Dir, err)
	case !root.IsDir:
		l.bound.close()
		return nil, fmt.Errorf("--shared %s is not a directory", cfg.Dir)
	}
	l.wb.init()
	l.reads.init()
	l.journal.init()
	l.journal.own = namesDir + "/" + l.logName(cfg.Holder)
	l.wg.Add(2)
	go l.writeLoop()
	go l.leaseLoop()
	return l, nil
}

func setDefaults(cfg *Config) {
	def := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	def(&cfg.NegativeTTL, DefaultNegativeTTL)
	def(&cfg.PositiveTTL, DefaultPositiveTTL)
	def(&cfg.Timeout, DefaultTimeout)
	def(&cfg.LeaseTTL, DefaultLeaseTTL)
	def(&cfg.Protect, DefaultProtect)
	def(&cfg.ScanInterval, cfg.LeaseTTL)
	if cfg.Rate == 0 {
		cfg.Rate = DefaultRate
	}
	if cfg.QueueBytes == 0 {
		cfg.QueueBytes = DefaultQueueBytes
	}
	if cfg.Workers == 0 {
		cfg.Workers = DefaultWorkers
	}
	if cfg.Clock == nil {
		cfg.Clock = realClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Holder == "" {
		host, _ := os.Hostname()
		cfg.Holder = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
}

// Close stops the level's goroutines and gives the lease up if held. Calls
// stuck in the shared filesystem end when it answers.
func (l *Level) Close() {
	close(l.stop)
	l.wg.Wait()
	l.releaseLease()
	l.bound.close()
}

// Reachable reports whether the shared directory answers within the bound:
// no call timed out since the prober last succeeded, and none is still stuck.
func (l *Level) Reachable() bool { return l.bound.reachable() }

// probe is the prober's test: a file written and removed, which reaches
// the filesystem's server (a stat could be answered from the client's cache).
func (l *Level) probe() error {
	if err := l.ensureControlDir(); err != nil {
		return err
	}
	rel := controlDir + "/probe-" + l.unique()
	if err := l.dir.WriteFile(rel, []byte("probe")); err != nil {
		l.dir.Remove(rel)
		return err
	}
	return l.dir.Remove(rel)
}

// controlDir holds the level's own files in the shared directory.
const controlDir = ".kvtierfs"

// ensureControlDir makes controlDir and namesDir directories: a link or a
// file another writer put at either name is removed (the name itself, never
// what it points to) and the directory made.
func (l *Level) ensureControlDir() error {
	for _, dir := range []string{controlDir, namesDir} {
		err := l.dir.MkdirAll(dir)
		if errors.Is(err, syscall.ELOOP) || errors.Is(err, syscall.ENOTDIR) {
			l.cfg.Logger.Warn("not a directory in the shared store: replaced", "path", dir, "err", err)
			if err = l.dir.Remove(dir); err == nil {
				err = l.dir.MkdirAll(dir)
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// Stats takes a snapshot of the level.
func (l *Level) Stats() Stats {
	qBlocks, qBytes, inFlight, growing := l.wb.snapshot()
	fetched := l.c.fetched.Load()
	st := Stats{
		Dir:              l.cfg.Dir,
		Reachable:        l.Reachable(),
		QueueBlocks:      qBlocks,
		QueueBytes:       qBytes,
		BytesBehind:      qBytes + inFlight,
		WrittenBlocks:    l.c.written.Load(),
		WrittenBytes:     l.c.writtenBytes.Load(),
		DroppedBlocks:    l.c.dropped.Load(),
		FetchedBlocks:    fetched,
		FetchedBytes:     l.c.fetchedBytes.Load(),
		Lookups:          l.c.lookups.Load(),
		LookupHits:       l.c.lookupHits.Load(),
		NegativeHits:     l.c.negativeHits.Load(),
		CorruptDropped:   l.c.corruptDropped.Load(),
		Timeouts:         l.bound.timeouts.Load(),
		CapacityBytes:    l.cfg.Capacity,
		UsedBytes:        l.c.usedBytes.Load(),
		EvictedBlocks:    l.c.evicted.Load(),
		JournalFallbacks: l.c.journalFallbacks.Load(),
		BehindGrowing:    growing,
	}
	if fetched > 0 {
		st.FetchSecondsAvg = float64(l.c.fetchNanos.Load()) / float64(fetched) / 1e9
	}
	st.LeaseHolder, st.LeaseHeld = l.leaseState()
	l.journal.mu.Lock()
	st.JournalNames = int64(len(l.journal.names))
	l.journal.mu.Unlock()
	return st
}

// recordXattr is the xattr holding a shared block's sealed record: the
// local store's record (block.RecordXattr's format), its SHA-256 and tag.
const recordXattr = block.ReservedXattrPrefix + "shared"

// sidecarSuffix names the file holding a block's record where xattrs are refused.
const sidecarSuffix = ".kvdigest"
