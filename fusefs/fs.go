// Package fusefs adapts go-fuse to the block store: a loopback filesystem over
// the store directory whose block files (`<hex>.bin` under `_g<N>`
// directories) are created, published, verified, evicted and counted by
// tiers/disk. Everything else is stored as it comes. Loads are served by the
// daemon from bytes verified before the read that completes them returns,
// and on a multi-node group mirrored to every peer before it returns
// (package core decides; this package translates requests).
package fusefs

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/fusefs/core"
	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
	"github.com/kvtierfs/kvtierfs/fusefs/kvevents"
	"github.com/kvtierfs/kvtierfs/fusefs/prime"
	"github.com/kvtierfs/kvtierfs/internal/descriptors"
	"github.com/kvtierfs/kvtierfs/internal/fusemount"
	"github.com/kvtierfs/kvtierfs/staging"
	"github.com/kvtierfs/kvtierfs/staging/diagnose"
	"github.com/kvtierfs/kvtierfs/staging/lookupbudget"
	"github.com/kvtierfs/kvtierfs/sync/rowsync"
	"github.com/kvtierfs/kvtierfs/tiers/block"
	"github.com/kvtierfs/kvtierfs/tiers/disk"
	"github.com/kvtierfs/kvtierfs/tiers/shm"
	"github.com/kvtierfs/kvtierfs/tiers/tier"
)

// Default kernel cache lifetimes: files other than blocks are answered by
// the kernel within the entry timeout (present blocks: BlockEntryTimeout),
// absent names outside the block layout within the negative one; the daemon
// invalidates entries it removes itself. The entry of a block tmp file is never cached, so the
// block it becomes at rename is looked up through the daemon at least once:
// the daemon sees every key the engine is told is present (lookup
// protection). Absent names of the layout are cached for DirTimeout.
const (
	DefaultEntryTimeout    = time.Second
	DefaultNegativeTimeout = 5 * time.Second
)

// DefaultBlockEntryTimeout is how long the kernel answers a present block's
// lookups itself when nothing needs to see each of them (BlockEntryTimeout).
// A block leaves only through the mount (UNLINK, RENAME over it: the kernel
// applies its own replies) or through the store (eviction, a corrupt or
// vanished file), which tells the kernel (FS.kernelEvent); the store's lookup
// protection is extended by as much (disk.Config.LookupCacheTTL), so a block
// the kernel answered present is still protected when its load comes.
const DefaultBlockEntryTimeout = 5 * time.Minute

// BlockEntryTimeout is the kernel's cache lifetime of present blocks' entries
// for a mount with or without the lookup budget and row mirroring, which both
// decide at every lookup (the budget its batch, mirroring whether every peer
// can take a load now): with either, DefaultEntryTimeout (and 0 under the
// budget, node.blockEntry); without, DefaultBlockEntryTimeout, or the lookup
// protection if shorter, so that caching at most doubles how long a looked-up
// block is kept. Pass it to the store as its disk.Config.LookupCacheTTL: the
// mount uses the store's.
func BlockEntryTimeout(budget, mirrored bool, lookupProtect time.Duration) time.Duration {
	if budget || mirrored {
		return DefaultEntryTimeout
	}
	return min(DefaultBlockEntryTimeout, lookupProtect)
}

// DirTimeout is how long the kernel caches the entries and attributes of
// directories: they change only through the mount, whose replies keep the
// kernel's caches right, so a key's lookup walks its directories without a
// round trip to the daemon.
const DirTimeout = time.Hour

// DefaultMaxRequest is the largest FUSE request the mount asks for. A row
// load served from memory is split into requests of this size that daemon
// threads copy in parallel (a kernel copy through /dev/fuse runs at about
// half a memcpy's speed), and a row store takes a few WRITEs instead of
// one per 128 KiB page run.
const DefaultMaxRequest = 4 << 20

// pageLimitFile caps the pages of a FUSE request (256 by default: 1 MiB).
const pageLimitFile = "/proc/sys/fs/fuse/max_pages_limit"

// Options configures a mount.
type Options struct {
	// Store is the block store behind the mount.
	Store *disk.Store
	// Regions are the engine's shm regions; nil reports none.
	Regions *shm.Set
	// Logger receives the daemon's log; nil discards it.
	Logger *slog.Logger
	// Registerer receives the Prometheus metrics; nil registers none.
	Registerer prometheus.Registerer
	// EntryTimeout and NegativeTimeout override the kernel cache lifetimes.
	EntryTimeout, NegativeTimeout time.Duration
	// LayoutNegativeTimeout is how long the kernel caches an absent name of
	// the block layout (a block or one of its directories); 0 means DirTimeout.
	LayoutNegativeTimeout time.Duration
	// Debug logs every FUSE request.
	Debug bool
	// MaxRequest is the largest READ/WRITE request to negotiate; 0 means
	// DefaultMaxRequest. Run as root, the mount raises the kernel's
	// fs.fuse.max_pages_limit to allow it; otherwise the kernel's cap holds.
	MaxRequest int
	// Sync mirrors loaded rows to the peer ranks; nil on a single node.
	Sync *rowsync.Node
	// SyncRegions maps regions for Sync; required with Sync.
	SyncRegions *rowsync.Regions
	// SyncDeadline bounds how long a mirrored load waits for its own earlier
	// READs to be delivered; 0 means core.DefaultDeadline.
	SyncDeadline time.Duration
	// Stager stages the blocks that follow a load in RAM; nil disables staging.
	Stager *staging.Stager
	// LookupBudget withholds present blocks an engine that promotes on
	// lookup could not promote (--lookup-budget); nil answers every lookup
	// as the store says.
	LookupBudget *lookupbudget.Budget
	// Diagnostics names the field failures in stat; nil means the defaults.
	Diagnostics Diagnoser
	// WarningWindow is how long a warning raised by a counter (checksum
	// failures, refused stores, store I/O errors) stays after the counter
	// last grew; default diagnose.DefaultWindow.
	WarningWindow time.Duration
	// AllowOther lets users other than the one who mounts reach the mount
	// (the allow_other mount option), which an engine running as another
	// user than the daemon needs. Access is still limited to the store
	// owner's uid and root (DESIGN "Threat model").
	AllowOther bool
	// MountpointDir is the mountpoint directory, opened by the caller, which
	// keeps it open until Wait returns. A root daemon mounts onto that
	// directory and unmounts through it (its /proc/self/fd path) instead
	// of resolving the mountpoint's path again, which whoever may write an
	// ancestor could have swapped for a link (DESIGN "Threat model"); nil,
	// or another user than root (fusermount3 takes a path), mounts by path.
	MountpointDir *os.File
	// KVEvents publishes removed blocks to routers; nil when it is off.
	KVEvents *kvevents.Publisher
	// Shared is the shared second level; nil without --shared.
	Shared SharedLevel
	// Primer looks each tier's prefix names up ahead of the engine; nil
	// leaves them to the engine's own lookups. Not used with Shared.
	Primer Primer
	// Descriptors admits the engine's opens while they leave descriptors
	// for the daemon's own work; nil means one counting this process's.
	Descriptors *descriptors.Reserve
}

// FS is a mounted kvtierfs.
type FS struct {
	store      *disk.Store
	regions    *shm.Set
	logger     *slog.Logger
	metrics    *metrics
	mountpoint string
	// target is what mount(2) and umount(2) were given: the mountpoint's
	// path, or the /proc/self/fd path of Options.MountpointDir.
	target string
	// entryTimeout is how long the kernel caches entries the daemon hands out;
	// each node operation sets it explicitly (zero for block tmp files).
	entryTimeout time.Duration
	// blockEntryTimeout is how long it caches a present block's entry and
	// attributes: the store's disk.Store.LookupCacheTTL, which the daemon
	// opens the store with (BlockEntryTimeout).
	blockEntryTimeout time.Duration
	// negativeTimeout and layoutNegativeTimeout are how long the kernel
	// caches absent names outside and inside the block layout; Lookup sets
	// them on each answer (absentTimeout).
	negativeTimeout, layoutNegativeTimeout time.Duration
	// index answers lookups of the layout's names without the store.
	index  *lookupIndex
	root   *node
	server *fuse.Server
	// connection names the mount's FUSE connection in fusectl (Abort).
	connection  string
	control     *fs.Inode
	done        chan struct{}
	sync        *rowsync.Node
	syncRegions *rowsync.Regions
	// sampler samples stores for the replication gate; nil on one node.
	sampler     *rowsync.StoreSampler
	stager      *staging.Stager
	diagnostics Diagnoser
	shared      SharedLevel
	primer      Primer
	// priming decides when a tier is primed (priming.go).
	priming     prime.Schedule
	tiersPrimed atomic.Int64

	// tier tells a block's events and answers its lookups.
	tier *tier.Tier
	// stats assembles stats.json and its warnings.
	stats *tier.Stats
	// loads opens, verifies, serves and mirrors block loads.
	loads *core.Loads
	// matchBuffered is the match request bytes buffered on open descriptors.
	matchBuffered atomic.Int64
	// reserve admits the engine's opens that hold the daemon's descriptors.
	reserve *descriptors.Reserve
}

// regionRefresh is how often the shm regions are looked for again.
const regionRefresh = time.Second

// Diagnoser is what the mount tells the field diagnostics and asks of them
// (staging/diagnose.Diagnostics; DESIGN.md "Staging, matching and diagnostics").
type Diagnoser interface {
	// tier.Diagnostics counts what the tier tells: published blocks,
	// loads, lookups' answers and lookups that ended at a missing directory.
	tier.Diagnostics
	// tier.Warner names the known failures the counts show now.
	tier.Warner
}

// Mount mounts the store at mountpoint and starts serving it.
func Mount(mountpoint string, opts Options) (*FS, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.EntryTimeout == 0 {
		opts.EntryTimeout = DefaultEntryTimeout
	}
	if opts.NegativeTimeout == 0 {
		opts.NegativeTimeout = DefaultNegativeTimeout
	}
	if opts.LayoutNegativeTimeout == 0 {
		opts.LayoutNegativeTimeout = DirTimeout
	}
	f := &FS{store: opts.Store, regions: opts.Regions, logger: opts.Logger, mountpoint: mountpoint,
		entryTimeout: opts.EntryTimeout, blockEntryTimeout: opts.Store.LookupCacheTTL(), negativeTimeout: opts.NegativeTimeout, layoutNegativeTimeout: opts.LayoutNegativeTimeout,
		done: make(chan struct{}), sync: opts.Sync, syncRegions: opts.SyncRegions,
		stager: opts.Stager, diagnostics: opts.Diagnostics, shared: opts.Shared, reserve: opts.Descriptors}
	if f.reserve == nil {
		f.reserve = descriptors.New(nil, opts.Logger)
	}
	if opts.Shared == nil {
		f.primer = opts.Primer
	}
	if f.diagnostics == nil {
		f.diagnostics = diagnose.New(diagnose.Options{})
	}
	if f.sync != nil && (f.regions == nil || f.syncRegions == nil) {
		return nil, fmt.Errorf("row mirroring needs the shm regions")
	}
	if f.sync != nil {
		f.sampler = rowsync.NewStoreSampler(f.sync, opts.Store, f.regions, f.syncRegions)
	}
	f.loads = core.NewLoads(core.Config{Store: opts.Store, Regions: opts.Regions, Deadline: opts.SyncDeadline,
		Logger: opts.Logger, Mirror: f.rowMirror(), Stager: f.loadStager(), Shared: opts.Shared})
	m, err := newMetrics(opts.Registerer, f)
	if err != nil {
		return nil, err
	}
	f.metrics = m
	loopRoot := &fs.LoopbackRoot{Path: opts.Store.Root()}
	f.root = &node{LoopbackNode: &fs.LoopbackNode{RootData: loopRoot}, fsys: f}
	if opts.Regions != nil {
		opts.Store.UseRows(opts.Regions)
	}
	loopRoot.RootNode = f.root
	f.index = newLookupIndex(opts.Store, loopRoot)
	f.index.scan("")
	f.tier = tier.New(f.tierConfig(opts), f.indexEvent, f.kernelEvent)
	f.stats = tier.NewStats(f.statsConfig(opts))

	if opts.MaxRequest == 0 {
		opts.MaxRequest = DefaultMaxRequest
	}
	raisePageLimit(opts.MaxRequest, opts.Logger)
	f.target = mountpoint
	onto := os.Geteuid() == 0 && opts.MountpointDir != nil
	if onto {
		f.target = fmt.Sprintf("/proc/self/fd/%d", opts.MountpointDir.Fd())
	}
	entry := opts.EntryTimeout
	fsOpts := &fs.Options{
		AttrTimeout: &entry,
		OnAdd:       f.addControl,
	}
	mo := fusemount.Options(opts.MaxRequest, f.readRequest(opts.MaxRequest))
	mo.FsName, mo.Name = "kvtierfs:"+opts.Store.Root(), ctlabi.FSName
	mo.DirectMount = os.Geteuid() == 0
	// No fusermount3 after a failed mount onto the directory: it would
	// resolve /proc/self/fd in its own process.
	mo.DirectMountStrict = onto
	mo.AllowOther = opts.AllowOther
	mo.Debug, mo.Logger = opts.Debug, log.New(&slogWriter{opts.Logger}, "", 0)
	fsOpts.MountOptions = mo
	server, err := fusemount.NewServer(absentEntries{newNameOrder(fs.NewNodeFS(f.root, fsOpts))}, f.target, &fsOpts.MountOptions)
	if err != nil {
		return nil, fmt.Errorf("mount %s: %w", mountpoint, err)
	}
	// NewServer returned once mounted; Serve answers INIT, which the kernel
	// awaits before any other request. Not WaitMount: after that wait it
	// opens and polls a file of the mount from this process, so that Go's
	// poller never sends POLL to a server it could starve (go-fuse's
	// "pollHack"). The daemon never does I/O on its own mount, and a daemon
	// killed in the middle of that probe could never exit (its own request
	// waits on itself). A process that both serves and uses a mount (tests)
	// calls FS.ProbePoll first.
	go server.Serve()
	f.server = server
	if f.connection, err = connectionOf(f.mountedAt()); err != nil {
		f.logger.Warn("the mount's FUSE connection cannot be aborted at shutdown", "err", err)
	}
	if f.regions != nil {
		f.tier.SizeBudget()
		go f.watchRegions()
	}
	return f, nil
}

// tierConfig is the mount's tier: its store and everyone who follows the
// store's blocks (tiers/tier.New).
func (f *FS) tierConfig(opts Options) tier.Config {
	cfg := tier.Config{Store: opts.Store, Diagnostics: f.diagnostics, Logger: opts.Logger}
	if opts.Shared != nil {
		cfg.Shared = opts.Shared
	}
	if opts.Stager != nil {
		cfg.Stager = opts.Stager
	}
	if opts.LookupBudget != nil {
		cfg.Budget = opts.LookupBudget
	}
	if opts.Regions != nil {
		cfg.Regions = opts.Regions
	}
	if opts.KVEvents != nil {
		cfg.KVEvents = opts.KVEvents
	}
	if opts.Sync != nil {
		cfg.Gate = opts.Sync
	}
	if f.primer != nil {
		cfg.Primer = f.primer
	}
	return cfg
}

// ProbePoll makes the kernel learn that the mount answers no POLL, by
// opening and polling a file of it from this process: needed before this
// process opens files of its own mount with Go's os package (tests).
func (f *FS) ProbePoll() error { return f.server.WaitMount() }

// Wait blocks until the filesystem is unmounted.
func (f *FS) Wait() {
	f.server.Wait()
	select {
	case <-f.done:
	default:
		close(f.done)
	}
}

// watchRegions maps the engine's regions as they appear, until unmount.
func (f *FS) watchRegions() {
	tick := time.NewTicker(regionRefresh)
	defer tick.Stop()
	for {
		select {
		case <-f.done:
			return
		case <-tick.C:
			if err := f.regions.Refresh(); err != nil {
				f.logger.Debug("shm regions", "err", err)
			}
			f.tier.SizeBudget()
			if f.syncRegions != nil {
				f.syncRegions.Sweep()
			}
		}
	}
}

// Unmount unmounts the filesystem; it fails with EBUSY while files are open.
func (f *FS) Unmount() error { return f.server.Unmount() }

// mountedAt is the mountpoint's path. Where the mount was made onto the
// opened directory it is the kernel's name of that directory (resolved is
// true: no component of it is resolved again), else the path as given.
func (f *FS) mountedAt() (at string, resolved bool) {
	if f.target == f.mountpoint {
		return f.mountpoint, false
	}
	if at, err := os.Readlink(f.target); err == nil {
		return at, true
	}
	return f.mountpoint, false
}

// Detach unmounts the filesystem lazily (MNT_DETACH): it leaves the
// namespace now and ends when the last open file closes.
func (f *FS) Detach() error { return unix.Unmount(f.target, unix.MNT_DETACH) }

// Mountpoint is where the filesystem is mounted.
func (f *FS) Mountpoint() string { return f.mountpoint }

// raisePageLimit lifts the kernel's cap on FUSE request pages to fit
// maxRequest, when it is lower and the daemon may (root). It only raises what
// FUSE servers may ask for; each mount still negotiates its own size.
func raisePageLimit(maxRequest int, logger *slog.Logger) {
	raw, err := os.ReadFile(pageLimitFile)
	if err != nil {
		return // an older kernel: requests stay at its fixed limit
	}
	current, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	want := (maxRequest + os.Getpagesize() - 1) / os.Getpagesize()
	if err != nil || current >= want {
		return
	}
	if err := os.WriteFile(pageLimitFile, []byte(strconv.Itoa(want)), 0); err != nil {
		logger.Warn("FUSE requests stay small: cannot raise fs.fuse.max_pages_limit (run as root, or set it yourself)",
			"limit_pages", current, "wanted_pages", want, "err", err)
		return
	}
	logger.Info("raised fs.fuse.max_pages_limit so that a row travels in one request", "from", current, "to", want)
}

// addControl attaches the virtual control directory to the root.
func (f *FS) addControl(ctx context.Context) {
	root := f.root.EmbeddedInode()
	dir := root.NewPersistentInode(ctx, &controlDir{fsys: f}, fs.StableAttr{Mode: syscall.S_IFDIR, Ino: controlIno})
	dir.AddChild(ctlabi.StatsFile, dir.NewPersistentInode(ctx, &statsFile{fsys: f}, fs.StableAttr{Mode: syscall.S_IFREG, Ino: controlIno + 1}), false)
	dir.AddChild(ctlabi.MatchFile, dir.NewPersistentInode(ctx, &matchFile{fsys: f}, fs.StableAttr{Mode: syscall.S_IFREG, Ino: controlIno + 2}), false)
	f.control = dir
}

// absentTimeout is how long the kernel may answer the layout name rel absent
// without asking the daemon. Such names appear only through the mount, whose
// MKDIR and RENAME replies update the kernel's cache itself, unless a shared
// store holds them: then as long as the mount's negative timeout, which
// --shared bounds (DESIGN "The shared level").
func (f *FS) absentTimeout(rel string) time.Duration {
	if f.shared != nil {
		return f.negativeTimeout
	}
	return f.layoutNegativeTimeout
}

// namespaceChanged keeps the lookup index right after the mount created or
// removed the name rel.
func (f *FS) namespaceChanged(rel string) { f.index.changed(rel) }

// namespaceMoved keeps the lookup index right after the mount renamed a name
// from or to rel: a layout name, or a tier directory that may carry layout
// names with it.
func (f *FS) namespaceMoved(rel string) {
	if block.ParseDir(rel).Level != block.NotLayoutDir || !strings.Contains(rel, "/") {
		f.index.moved(rel)
	}
}

// indexEvent keeps the lookup index right as blocks come and go (a
// tier.Listener): a block leaving or evicted is forgotten, a published one
// indexed, and the directories of an imported one, which the store made
// without the mount, looked at again.
func (f *FS) indexEvent(e tier.Event) {
	switch e.Kind {
	case tier.Leaving, tier.Evicted:
		f.index.forgetBlock(e.Ref.Rel)
	case tier.Published:
		f.index.refreshBlock(e.Ref.Rel)
	case tier.Imported:
		group := path.Dir(e.Ref.Rel)
		f.index.changed(path.Dir(group))
		f.index.changed(group)
	}
}

// kernelEvent drops the kernel's entry of a block the store removed by
// itself (a tier.Listener); the mount's own unlinks and renames the kernel
// applies from their replies.
func (f *FS) kernelEvent(e tier.Event) {
	if e.Kind != tier.Evicted {
		return
	}
	dir, name := path.Split(e.Ref.Rel)
	parent := f.root.EmbeddedInode()
	for _, comp := range strings.Split(strings.Trim(dir, "/"), "/") {
		if comp == "" {
			continue
		}
		if parent = parent.GetChild(comp); parent == nil {
			return
		}
	}
	if errno := parent.NotifyEntry(name); errno != 0 && errno != syscall.ENOENT {
		f.logger.Debug("invalidating kernel entry", "path", e.Ref.Rel, "errno", errno)
	}
}

// absentEntries lets each absent answer carry its own lifetime: go-fuse
// replies to a lookup that failed with ENOENT with the error, which the kernel
// does not cache, or with one negative timeout for the whole mount. A lookup
// that answers ENOENT with an entry timeout set (node.Lookup) is replied to
// as an entry with no inode, which the kernel caches that long.
type absentEntries struct{ fuse.RawFileSystem }

func (r absentEntries) Lookup(cancel <-chan struct{}, header *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	status := r.RawFileSystem.Lookup(cancel, header, name, out)
	if status == fuse.ENOENT && out.EntryTimeout() > 0 {
		out.NodeId = 0
		return fuse.OK
	}
	return status
}

// controlIno is the first inode number of the virtual files, far above real ones.
const controlIno = 1 << 62

// slogWriter forwards go-fuse's log lines to the daemon's logger.
type slogWriter struct{ l *slog.Logger }

func (w *slogWriter) Write(p []byte) (int, error) {
	w.l.Info(strings.TrimRight(string(p), "\n"), "source", "go-fuse")
	return len(p), nil
}

// mirroredReadRequest is the largest READ of a mount that mirrors loads of
// rows of rowBytes (0: unknown): a row must arrive in more than one READ, so
// that the row it lands in can be found from the first ones before the last
// returns (core.Load.Read). That is half a row in whole pages; without a row
// size 128 KiB, so that rows up to 128 KiB cannot be mirrored (their loads
// fail). A fixed 128 KiB once made a row of 8,601,600 bytes cross /dev/fuse
// in 66 READs instead of 3.
func mirroredReadRequest(rowBytes int) int {
	if rowBytes <= 0 {
		return 128 << 10
	}
	page := os.Getpagesize()
	return max(page, rowBytes/2/page*page)
}

// readRequest is the largest READ the mount takes.
func (f *FS) readRequest(maxRequest int) int {
	if f.sync != nil && f.sync.Mirrors() {
		return min(maxRequest, mirroredReadRequest(f.sync.RowBytes()))
	}
	return maxRequest
}

// loadStager is the stager as loads use it; nil when staging is off.
func (f *FS) loadStager() core.Stager {
	if f.stager == nil {
		return nil
	}
	return f.stager
}
