// Package disk is the durable, bounded, checksummed block store behind the
// mount: a directory that mirrors the engine's tier namespace, an in-memory
// index of its blocks, CRC32C checksums kept in an xattr beside the data, and
// least-recently-used eviction under a capacity limit.
//
// Lock discipline: Store.mu guards the index (blocks, lru, tmps, prefixes,
// per-tier row sizes, used). It is held across the short metadata syscalls
// that must stay consistent with the index (rename, unlink) but never across
// data I/O or checksumming. Writer.mu serialises the writes of one tmp file.
package disk

import (
	"container/list"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/tiers/batch"
	"github.com/kvtierfs/kvtierfs/tiers/block"
	"github.com/kvtierfs/kvtierfs/tiers/internal/beneath"
)

// DefaultLookupProtect is how long a block that answered a lookup is kept
// from eviction, so that a key the engine was told is present can still be loaded.
const DefaultLookupProtect = 600 * time.Second

// DefaultCapacityFraction is the share of the store filesystem used when no capacity is given.
const DefaultCapacityFraction = 0.9

// DefaultTmpMaxAge is how long a tmp file may wait for its rename once its
// writer closed it. Engines rename right after the close (the two requests
// arrive microseconds apart); a tmp still there after this long belongs to a
// killed or broken writer, so it is removed and its bytes return to the
// capacity.
const DefaultTmpMaxAge = 30 * time.Second

// DefaultMaxOtherFiles bounds the files outside the block layout whose bytes
// the store tracks one by one (other.go). The engine writes a config.json per
// namespace and its probes; the bound leaves room for far more, and keeps
// the table a few MiB however many files the engine's uid makes.
const DefaultMaxOtherFiles = 1 << 16

// Config configures a Store.
type Config struct {
	// Dir is the store directory; it must exist and be writable.
	Dir string
	// Capacity bounds the bytes the store holds; 0 means DefaultCapacityFraction of its filesystem.
	Capacity int64
	// LookupProtect keeps blocks that answered a lookup from eviction for this long; 0 means the default.
	LookupProtect time.Duration
	// LookupCacheTTL is how long the kernel may keep answering a lookup from its
	// cache after the store answered it; protection is extended by as much.
	LookupCacheTTL time.Duration
	// Logger receives warnings (corruption, eviction, rejected input); nil discards them.
	Logger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// TmpMaxAge bounds how long a closed tmp file waits for its rename; 0 means DefaultTmpMaxAge.
	TmpMaxAge time.Duration
	// Owner receives the store root and the block files; nil leaves them to
	// the daemon's user. Either way they are private (owner.go).
	Owner *Owner
	// MaxOtherFiles bounds the files outside the block layout that hold
	// bytes; 0 means DefaultMaxOtherFiles.
	MaxOtherFiles int
	// PassthroughMinRow is the smallest row whose tmp the kernel writes
	// without the daemon (Writer.Passthrough); smaller rows are written
	// through the daemon, whose rename then reads nothing back. 0 lets
	// every row pass through; the mount's default is DefaultPassthroughMinRow.
	PassthroughMinRow int64
}

// entry is one published block in the index.
type entry struct {
	rel      string
	name     block.Name
	size     int64
	physical int64
	// digest is the block's size, CRC32C and samples.
	digest     block.Digest
	lastUse    int64
	lastLookup int64
	readers    int
	lru        *list.Element
	prefix     *prefix
	present    bool
	// unchecked is set while the file's bytes were never checked against
	// the digest: a passthrough store takes its digest from the engine's
	// row, and a record found at mount may have been taken so. A row is
	// not trusted to stand for such a file (Reader.FileChecked).
	unchecked bool
	// times are the file's, as last read or set (times.go).
	times Times
	// seen is the file as the daemon last saw or changed it (changed.go).
	seen fileState
	// changing runs the daemon's own changes to the file one at a time
	// (Reader.ownChange), taken before mu.
	changing sync.Mutex
	// proof is set for a block published through the mount: loads wait for
	// it (publish.go). Set at creation, never changed.
	proof *proof
	// mapped is the block's proven mapping kept between loads (mapped.go).
	mapped *Mapped
	// draining is a mapping kept from the block's store under its write
	// lease that is no longer kept but still served: until its last
	// Release its descriptor is the only way to open the file that does
	// not wait on that lease (Store.openPinned).
	draining *Mapped
}

// prefix is a request's prefix as one engine thread looked it up, in order: eviction
// takes its tail before its head.
type prefix struct {
	members []*entry
}

// tmpFile is a staging file being written through the store. Its mutex guards
// size, crc, sealed and file; allocated, open, closedAt, orphaned and
// untracked are written under both mutexes, so either one may be held to
// read them.
type tmpFile struct {
	mu sync.Mutex
	// file is the tmp's descriptor, kept from its creation until the store
	// stops tracking the tmp and its writer closed it: Publish works on it,
	// never on whatever the tmp's name points to by then.
	file *os.File
	// id is the identity of the file written, which the tmp's name must
	// still have when it is published.
	id fileID
	// closedAt is when the writer closed the tmp (store clock).
	closedAt int64
	sealed   bool
	// refused is set when a write was rejected: the tmp cannot hold a whole row.
	refused bool
	size    int64
	// allocated is what the tmp counts against the capacity: the bytes
	// written, without the zero pages left as holes.
	allocated  int64
	sum        block.Sum
	sequential bool
	open       bool
	orphaned   bool
	// expect is the tier's row size when the tmp was created (0 if unknown);
	// probes holds the digest's probe windows for a block of that size.
	expect int64
	probes map[int64]uint64
	// untracked is set once the store stops tracking the tmp (published,
	// removed, forgotten, expired or replaced); written under Store.mu.
	untracked bool
	// passthrough is set while the kernel writes the file without the
	// daemon (Writer.Passthrough): allocated holds the row's reservation,
	// and released is closed when the writer releases the file.
	passthrough bool
	released    chan struct{}
	// written are the byte ranges the daemon's writes covered, merged;
	// attempted is the end of the furthest write asked for.
	written   [][2]int64
	attempted int64
	// lease, under Store.mu, is a duplicate of file's descriptor holding a
	// lease, in a store in memory: written through the daemon, a write lease
	// held since the tmp's creation (while it reads F_WRLCK no one else has
	// opened or truncated the file); passed through, the read lease its
	// proof summed the file under (sealInMemory), with leaseMap the file
	// mapped under it. A block published from it is kept mapped as proven
	// (keepStoredLocked). nil once refused, broken or given up.
	lease    *os.File
	leaseMap []byte
}

// Store is the block store. All methods are safe for concurrent use.
type Store struct {
	cfg      Config
	root     string
	lockFile *os.File
	// rootFD is the root directory's descriptor (lockFile's), from which every store path is resolved.
	rootFD    int
	capacity  int64
	fsReserve int64
	// fsBlock is the store filesystem's block size: a placed block whose
	// xattrs took none yet counts one more until its proof wrote its
	// record (publish.go).
	fsBlock int64
	// inMemory: the store filesystem keeps its files in memory (tmpfs,
	// ramfs), so even an O_DIRECT read is a copy by the CPU (readPiece).
	inMemory bool
	counters Counters
	phases   phaseTimes
	// rows finds the engine's row a passthrough tmp was written from.
	rows WrittenRows
	// bootID is the kernel's boot id, the value of a pending mark (publish.go).
	bootID []byte
	mu     sync.Mutex
	blocks map[string]*entry
	lru    *list.List
	tmps   map[string]*tmpFile
	// underDirs counts the indexed blocks and tracked tmps beneath each
	// directory (countUnderLocked), so that HasBlocksUnder, asked at every
	// directory rename through the mount, scans nothing: a scan of every
	// block under the lock took 84 ms at a million blocks.
	underDirs map[string]int
	// creating are the tmp names CreateTmp is opening outside the lock.
	creating   map[string]bool
	others     map[fileID]int64 // bytes allocated by files outside the block layout (other.go)
	used       int64
	rowBytes   map[string]int64
	tierBlocks map[string]int
	lookups    *batch.Cursors[uint32, *prefix] // each thread's current prefix
	// totals are the index's sums, kept as blocks come and go so that Stats
	// does not walk the index under the lock.
	totals blockTotals
	// othersUntracked counts the files found past the others' bound: their
	// bytes are counted in used until the next Open.
	othersUntracked int

	buffers blockBuffers
	// mapped are the proven mappings of blocks kept between loads, most
	// recently used first (mapped.go), under mu; at most maxMapped
	// (mappedBound of the descriptor limit at Open).
	mapped     *list.List
	maxMapped  int
	leaseWatch sync.Once
	// lastSweep is when CreateTmp last looked for expired tmp files (store clock).
	lastSweep atomic.Int64

	// listeners hear the store's block events (events.go), in order;
	// the slice is replaced, never changed in place, under listenMu.
	listenMu  sync.Mutex
	listeners []func(Event)
	// pending are the blocks gone from the index whose events the
	// notifier goroutine has not told yet; removed wakes it.
	removed     chan struct{}
	pendingMu   sync.Mutex
	pending     []Event
	stopRemoval chan struct{}
	removalDone chan struct{}
}

// Open opens the store directory, takes its lock, removes leftover tmp files and
// rebuilds the index from the blocks on disk.
func Open(cfg Config) (*Store, error) {
	if cfg.LookupProtect == 0 {
		cfg.LookupProtect = DefaultLookupProtect
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.MaxOtherFiles < 0 {
		return nil, fmt.Errorf("at most %d files outside the block layout: want a positive bound, or 0 for %d", cfg.MaxOtherFiles, DefaultMaxOtherFiles)
	}
	if cfg.MaxOtherFiles == 0 {
		cfg.MaxOtherFiles = DefaultMaxOtherFiles
	}
	if cfg.TmpMaxAge == 0 {
		cfg.TmpMaxAge = DefaultTmpMaxAge
	}
	root, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("store directory %q: %w", cfg.Dir, err)
	}
	st, err := os.Stat(root)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("store directory %s does not exist: create it or choose another", root)
		}
		return nil, fmt.Errorf("store directory %s: %w", root, err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("store directory %s is not a directory", root)
	}
	// Never through a link: whoever can write the directory holding the
	// store (the engine's uid, on its own data disk) could make it lead to
	// a directory of root's, which the store then gives to the engine.
	rootFD, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	// (O_DIRECTORY|O_NOFOLLOW answers a link with ENOTDIR, os.Stat above
	// having found a directory behind it.)
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
		return nil, fmt.Errorf("store directory %s is a symbolic link: give the directory it leads to (a link can be swapped to lead the daemon elsewhere)", root)
	}
	if err != nil {
		return nil, fmt.Errorf("store directory %s: %w", root, err)
	}
	lock := os.NewFile(uintptr(rootFD), root)
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lock.Close()
		return nil, fmt.Errorf("store directory %s is in use by another kvtierfs daemon", root)
	}
	s := &Store{
		cfg:         cfg,
		root:        root,
		lockFile:    lock,
		rootFD:      int(lock.Fd()),
		blocks:      make(map[string]*entry),
		lru:         list.New(),
		mapped:      list.New(),
		maxMapped:   mappedBound(descriptorLimit()),
		tmps:        make(map[string]*tmpFile),
		underDirs:   make(map[string]int),
		creating:    make(map[string]bool),
		others:      make(map[fileID]int64),
		rowBytes:    make(map[string]int64),
		tierBlocks:  make(map[string]int),
		totals:      blockTotals{groups: make(map[int]GroupStats)},
		lookups:     batch.New[uint32, *prefix](0),
		removed:     make(chan struct{}, 1),
		stopRemoval: make(chan struct{}),
		removalDone: make(chan struct{}),
		bootID:      readBootID(),
	}
	if err := s.refuseTakeover(s.rootFD); err != nil {
		lock.Close()
		return nil, err
	}
	if err := s.probeWritable(); err != nil {
		lock.Close()
		return nil, err
	}
	if err := s.MakePrivate(int(lock.Fd()), PrivateDirMode); err != nil {
		lock.Close()
		return nil, fmt.Errorf("store directory %s: %w", root, err)
	}
	if err := s.setCapacity(cfg.Capacity); err != nil {
		lock.Close()
		return nil, err
	}
	if err := s.rebuild(); err != nil {
		lock.Close()
		return nil, err
	}
	go s.notifyRemovals()
	return s, nil
}

// Root is the absolute path of the store directory.
func (s *Store) Root() string { return s.root }

// LookupCacheTTL is how long the kernel may answer a block's lookups from
// its cache after the store answered one (Config.LookupCacheTTL).
func (s *Store) LookupCacheTTL() time.Duration { return s.cfg.LookupCacheTTL }

// Path is the store path of a store-relative path.
func (s *Store) Path(rel string) string { return filepath.Join(s.root, rel) }

// Close stops background work and releases the store lock.
func (s *Store) Close() error {
	close(s.stopRemoval)
	<-s.removalDone
	s.closeMapped()
	return s.lockFile.Close()
}

// probeWritable checks that the store accepts files and user xattrs, which
// hold the checksums. Its file is made and removed beneath the root's
// descriptor: the root's path may lead elsewhere by now (Threat model).
func (s *Store) probeWritable() error {
	var (
		name string
		fd   int
		err  error
	)
	for range 100 {
		name = fmt.Sprintf("%s%d.tmp", probePrefix, rand.Uint32())
		fd, err = unix.Openat(s.rootFD, name, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if !errors.Is(err, unix.EEXIST) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("store directory %s is not writable: %w", s.root, err)
	}
	defer unix.Unlinkat(s.rootFD, name, 0)
	defer unix.Close(fd)
	if err := unix.Fsetxattr(fd, block.RecordXattr, []byte("probe"), 0); err != nil {
		return fmt.Errorf("store directory %s does not support user xattrs, which hold block checksums (%v): use an ext4, xfs, btrfs or tmpfs store", s.root, err)
	}
	return nil
}

// setCapacity fixes the capacity and the reserve kept free on the store filesystem.
func (s *Store) setCapacity(capacity int64) error {
	var st unix.Statfs_t
	if err := unix.Fstatfs(s.rootFD, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", s.root, err)
	}
	s.inMemory = st.Type == unix.TMPFS_MAGIC || st.Type == unix.RAMFS_MAGIC
	total := int64(st.Blocks) * st.Bsize
	if capacity < 0 {
		return fmt.Errorf("capacity of %d bytes: want a positive size, or 0 for %v of the filesystem", capacity, DefaultCapacityFraction)
	}
	if capacity == 0 {
		capacity = int64(float64(total) * DefaultCapacityFraction)
	}
	if capacity > total {
		s.cfg.Logger.Warn("capacity larger than the store filesystem: clamped to the filesystem's size",
			"capacity", capacity, "filesystem_bytes", total, "store", s.root)
		capacity = total
	}
	s.capacity = capacity
	s.fsReserve = min(1<<30, total/20)
	s.fsBlock = st.Bsize
	return nil
}

// probePrefix names the file probeWritable creates at the root.
const probePrefix = ".kvtierfs-probe-"

// probeLeftover matches the probe files a killed process may leave: the
// store's own, and vLLM's O_DIRECT and xattr probes in a tier root.
var probeLeftover = regexp.MustCompile(`^(` + regexp.QuoteMeta(probePrefix) + `[0-9]+|\.o_direct_probe_[0-9]+|\.xattr_probe_[0-9]+)\.tmp$`)

// isProbeLeftover reports whether a file name is a probe leftover.
func isProbeLeftover(name string) bool { return probeLeftover.MatchString(name) }

// rebuild removes leftover tmp files and indexes every block under the root.
// Only the tmp files of the block layout (and the store's own probe) are
// removed: a *.tmp elsewhere is not the store's. A block without a digest
// record bound to its name is not indexed (see readBlockMeta).
func (s *Store) rebuild() error {
	var found []*entry
	var tmpsRemoved, dropped, refused, unreadable int
	rootDir, err := beneath.Open(s.rootFD, "", unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return fmt.Errorf("indexing store %s: %w", s.root, err)
	}
	skip := func(rel string, err error) {
		// The engine's uid owns the tree: a name it made unreadable
		// (one past PATH_MAX, a directory swapped for a link) costs that
		// name, not the mount.
		if unreadable++; unreadable == 1 {
			s.cfg.Logger.Warn("store names not indexed: they cannot be read (their count is in \"store indexed\")", "path", s.Path(rel), "err", err)
		}
	}
	err = walkStore(rootDir, func(rel string, st *unix.Stat_t) error {
		kind, name := block.Parse(rel)
		if kind == block.TmpFile || isProbeLeftover(path.Base(rel)) {
			if err := s.unlink(rel); err != nil {
				// Its name changed under the walk (a directory
				// swapped for a link, the file gone): it costs the name.
				skip(rel, err)
				return nil
			}
			tmpsRemoved++
			return nil
		}
		if kind != block.File || st.Mode&unix.S_IFMT != unix.S_IFREG {
			if st.Mode&unix.S_IFMT == unix.S_IFREG {
				s.mu.Lock()
				s.countOtherLocked(st, true)
				s.mu.Unlock()
			}
			return nil
		}
		p := s.Path(rel)
		b, err := s.readBlockMeta(rel, name)
		var unproven *unprovenError
		switch {
		case errors.As(err, &unproven):
			s.counters.UnprovenBlocks.Add(1)
			s.cfg.Logger.Warn("block not indexed: nothing proves its bytes are this block's", "path", p, "reason", unproven.reason)
			s.countOtherFile(rel)
			refused++
			return nil
		case err != nil:
			s.cfg.Logger.Warn("dropping block whose size disagrees with its checksum record (torn by a crash)", "path", p, "err", err)
			if err := s.unlink(rel); err != nil {
				skip(rel, err)
				return nil
			}
			dropped++
			return nil
		}
		found = append(found, b)
		return nil
	}, skip)
	if err != nil {
		return fmt.Errorf("indexing store %s: %w", s.root, err)
	}
	found, skipped := s.consistentSizes(found)
	sort.Slice(found, func(i, j int) bool { return found[i].lastUse > found[j].lastUse })
	for _, b := range found {
		s.insertLocked(b)
		s.lru.MoveToBack(b.lru)
	}
	evicted := 0
	for s.used > s.limitLocked() {
		victim := s.pickVictimLocked(s.nowNano(), nil)
		if victim == nil {
			break
		}
		s.evictLocked(victim)
		evicted++
	}
	s.cfg.Logger.Info("store indexed", "store", s.root, "blocks", len(found), "bytes", s.used,
		"tmp_files_removed", tmpsRemoved, "torn_blocks_dropped", dropped, "odd_size_files_ignored", skipped,
		"unproven_blocks_ignored", refused, "unreadable_names_ignored", unreadable,
		"other_files", len(s.others), "other_files_untracked", s.othersUntracked,
		"evicted_to_fit_capacity", evicted)
	if s.othersUntracked > 0 {
		s.cfg.Logger.Warn("the store holds more files outside the block layout than it tracks (Config.MaxOtherFiles): the rest count against the capacity until the next start, and writes to a file not tracked are refused with EDQUOT",
			"store", s.root, "tracked", len(s.others), "max_other_files", s.cfg.MaxOtherFiles, "untracked", s.othersUntracked)
	}
	return nil
}

// consistentSizes keeps the blocks whose size is a positive page multiple and
// the most common size of their tier; the others are logged and left
// unindexed (they answer lookups as absent).
func (s *Store) consistentSizes(found []*entry) ([]*entry, int) {
	counts := make(map[string]map[int64]int)
	for _, b := range found {
		if counts[b.name.Tier] == nil {
			counts[b.name.Tier] = make(map[int64]int)
		}
		counts[b.name.Tier][b.size]++
	}
	row := make(map[string]int64)
	for tier, sizes := range counts {
		best := int64(0)
		for size, n := range sizes {
			valid := size > 0 && size%int64(block.PageSize) == 0
			if valid && (best == 0 || n > sizes[best] || n == sizes[best] && size > best) {
				best = size
			}
		}
		row[tier] = best
	}
	kept := found[:0]
	skipped := 0
	for _, b := range found {
		if b.size != row[b.name.Tier] {
			s.cfg.Logger.Warn("ignoring block file whose size is not its tier's row size", "path", s.Path(b.rel),
				"size", b.size, "row_bytes", row[b.name.Tier])
			s.countOtherFile(b.rel)
			skipped++
			continue
		}
		kept = append(kept, b)
	}
	return kept, skipped
}

// unprovenError is a block file whose bytes nothing ties to its name.
type unprovenError struct{ reason string }

func (e *unprovenError) Error() string { return e.reason }

// readBlockMeta builds an index entry from a block file and its digest
// record. A record written before records named their block (v1) is bound to
// the name it is found under. A block without a record (copied or restored
// without xattrs, or written by an engine pointed straight at the store) has
// no proof of its bytes: it is indexed only when vLLM's own CRC32C xattr is
// on it and matches its bytes, and refused (left on disk, unindexed)
// otherwise. A block still pending its proof is proven from its bytes when
// this boot renamed it (pendingDigest), its record, if any, ignored.
func (s *Store) readBlockMeta(rel string, name block.Name) (*entry, error) {
	f, err := s.openForReading(rel)
	if err != nil {
		return nil, &unprovenError{reason: err.Error()}
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, err
	}
	d, pending, err := s.pendingDigest(f, rel, st.Size)
	if err != nil {
		return nil, err
	}
	upgrade := pending
	if !pending {
		if d, upgrade, err = s.recordedDigest(f, name, st.Size); err != nil {
			return nil, err
		}
	}
	if d.Size != st.Size {
		return nil, fmt.Errorf("file has %d bytes, checksum covers %d", st.Size, d.Size)
	}
	if upgrade {
		if err := writeDigest(f, name, d); err != nil {
			return nil, err
		}
		if pending {
			if err := clearPending(f); err != nil {
				return nil, err
			}
		}
		if err := unix.Fstat(int(f.Fd()), &st); err != nil {
			return nil, err
		}
	}
	return &entry{rel: rel, name: name, size: st.Size, physical: st.Blocks * 512,
		lastUse: st.Mtim.Nano(), present: true, digest: d, unchecked: true, times: timesOf(&st), seen: stateOf(&st)}, nil
}

// recordedDigest is a block file's digest from its record, or from vLLM's
// CRC32C xattr when it has no record (adoptVLLM); upgrade is set when the
// record is to be written again, bound to the block's name.
func (s *Store) recordedDigest(f *os.File, name block.Name, size int64) (d block.Digest, upgrade bool, err error) {
	d, ok, upgrade, err := readRecord(f, name)
	if err != nil {
		return d, false, &unprovenError{reason: err.Error()}
	}
	if !ok {
		d, err = s.adoptVLLM(f, size)
		return d, true, err
	}
	if want, present, err := vllmChecksum(f); err != nil {
		// vLLM's loader would drop the block at its first load.
		return d, false, &unprovenError{reason: err.Error()}
	} else if present && want != d.CRC {
		return d, false, &unprovenError{reason: fmt.Sprintf("its %s %08x disagrees with its digest record (crc32c %08x)", block.VLLMChecksumXattr, want, d.CRC)}
	}
	return d, upgrade, nil
}

// adoptVLLM proves a block without a record by vLLM's CRC32C xattr: the
// file's bytes must match it.
func (s *Store) adoptVLLM(f *os.File, size int64) (block.Digest, error) {
	want, present, err := vllmChecksum(f)
	if err != nil {
		return block.Digest{}, &unprovenError{reason: "no digest record, and " + err.Error()}
	}
	if !present {
		return block.Digest{}, &unprovenError{reason: "no digest record (copied or restored without xattrs?)"}
	}
	sum, err := fileSum(f, size)
	if err != nil {
		return block.Digest{}, &unprovenError{reason: err.Error()}
	}
	if crc := sum.CRC(); crc != want {
		return block.Digest{}, &unprovenError{reason: fmt.Sprintf("no digest record, and its bytes (crc32c %08x) do not match %s %08x", crc, block.VLLMChecksumXattr, want)}
	}
	return digestFile(f, sum)
}

// insertLocked adds a block to the index at the front of the LRU list.
func (s *Store) insertLocked(b *entry) {
	b.lru = s.lru.PushFront(b)
	if _, had := s.blocks[b.rel]; !had {
		s.countUnderLocked(b.rel, 1)
	}
	s.blocks[b.rel] = b
	s.used += b.physical
	s.totals.add(b, 1)
	if s.tierBlocks[b.name.Tier] == 0 {
		s.rowBytes[b.name.Tier] = b.size
	}
	s.tierBlocks[b.name.Tier]++
}

// dropLocked removes a block from the index; the caller removes the file.
func (s *Store) dropLocked(b *entry) {
	if !b.present {
		return
	}
	b.present = false
	if b.mapped != nil {
		s.uncacheLocked(b.mapped)
	}
	s.lru.Remove(b.lru)
	if _, had := s.blocks[b.rel]; had {
		s.countUnderLocked(b.rel, -1)
	}
	delete(s.blocks, b.rel)
	s.used -= b.physical
	s.totals.add(b, -1)
	s.tierBlocks[b.name.Tier]--
	if s.tierBlocks[b.name.Tier] == 0 {
		delete(s.tierBlocks, b.name.Tier)
		delete(s.rowBytes, b.name.Tier)
	}
}

// queueRemoval hands a block the store removed by itself to the notifier
// goroutine without blocking.
func (s *Store) queueRemoval(rel string) { s.queue(Event{Kind: Removed, Rel: rel}) }

// queue hands a removal event to the notifier goroutine without blocking.
func (s *Store) queue(e Event) {
	s.listenMu.Lock()
	none := len(s.listeners) == 0
	s.listenMu.Unlock()
	if none {
		return
	}
	s.pendingMu.Lock()
	s.pending = append(s.pending, e)
	s.pendingMu.Unlock()
	select {
	case s.removed <- struct{}{}:
	default:
	}
}

// notifyRemovals tells the listeners of queued removals until Close.
func (s *Store) notifyRemovals() {
	defer close(s.removalDone)
	for {
		select {
		case <-s.stopRemoval:
			return
		case <-s.removed:
		}
		s.pendingMu.Lock()
		batch := s.pending
		s.pending = nil
		s.pendingMu.Unlock()
		for _, e := range batch {
			s.tell(e)
		}
	}
}

// HasBlocksUnder reports whether any indexed block, or any tmp file being
// written or waiting for its rename, lives below the directory relDir: such a
// directory must not be renamed, as the store tracks them by path.
func (s *Store) HasBlocksUnder(relDir string) bool {
	dir := path.Clean(relDir)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.underDirs[dir] > 0
}

// countUnderLocked adds delta to the count of each directory above the
// store-relative rel (underDirs).
func (s *Store) countUnderLocked(rel string, delta int) {
	for dir := path.Dir(rel); dir != "."; dir = path.Dir(dir) {
		s.underDirs[dir] += delta
		if s.underDirs[dir] == 0 {
			delete(s.underDirs, dir)
		}
	}
}

// nowNano is the store clock in nanoseconds.
func (s *Store) nowNano() int64 { return s.cfg.Now().UnixNano() }

// removeFile unlinks a store file, tolerating one that is already gone.
func (s *Store) removeFile(rel string) error {
	if err := s.unlink(rel); err != nil && err != syscall.ENOENT {
		return err
	}
	return nil
}
