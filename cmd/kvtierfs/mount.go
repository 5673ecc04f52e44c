package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvtierfs/kvtierfs/fusefs"
	"github.com/kvtierfs/kvtierfs/fusefs/core"
	"github.com/kvtierfs/kvtierfs/fusefs/kvevents"
	"github.com/kvtierfs/kvtierfs/fusefs/prime"
	"github.com/kvtierfs/kvtierfs/staging"
	"github.com/kvtierfs/kvtierfs/staging/diagnose"
	"github.com/kvtierfs/kvtierfs/staging/lookupbudget"
	"github.com/kvtierfs/kvtierfs/sync/rowsync"
	"github.com/kvtierfs/kvtierfs/tiers/disk"
	"github.com/kvtierfs/kvtierfs/tiers/shared"
	"github.com/kvtierfs/kvtierfs/tiers/shm"
)

// defaultStore is $XDG_STATE_HOME/kvtierfs/store, else ~/.local/state/kvtierfs/store.
func defaultStore() string {
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "kvtierfs", "store")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		home = "/var/lib"
	}
	return filepath.Join(home, ".local", "state", "kvtierfs", "store")
}

// mountConfig is the parsed command line of `kvtierfs mount`.
type mountConfig struct {
	mountpoint    string
	store         string
	capacity      int64
	shmGlob       string
	metricsAddr   string
	metricsToken  string
	lookupProtect time.Duration
	debug         bool
	debugFUSE     bool
	logFormat     *logFormat
	listen        string
	peers         []string
	secretFile    string
	replicated    rowsync.Mode
	syncDeadline  time.Duration
	rowBytes      int64
	stagingBytes  int64
	stagingDepth  int
	diagWindow    time.Duration
	diagMinBytes  int64
	maxRequest    int64
	// passthroughMinRow is the smallest row the kernel writes to the store
	// without the daemon.
	passthroughMinRow int64
	allowOther        bool
	nonempty          bool
	primeLookups      bool
	lookupBudget      bool
	engineUID         int
	// kvEventsEndpoint and kvEventsTopic publish removed blocks to routers.
	kvEventsEndpoint string
	kvEventsTopic    string
	kvEventsBindAll  bool
	// shared configures the shared second level (--shared).
	shared shared.Config
	// sharedKernelNegative is the kernel's negative entry lifetime with --shared.
	sharedKernelNegative time.Duration
}

func parseMountFlags(args []string) (mountConfig, error) {
	var c mountConfig
	var capacity string
	fl := newFlagSet("mount")
	fl.StringVar(&c.store, "store", defaultStore(), "store directory holding the blocks (created if it is the default)")
	fl.StringVar(&capacity, "capacity", "", "bytes the store may hold, e.g. 400GiB, 10G, 500MB (default 90% of the store filesystem)")
	fl.StringVar(&c.shmGlob, "shm-glob", shm.DefaultGlob, "glob of the engine's shared offload regions")
	fl.StringVar(&c.metricsAddr, "metrics-addr", "127.0.0.1:9477", "address of the Prometheus /metrics endpoint; empty disables it")
	fl.StringVar(&c.metricsToken, "metrics-token-file", "", "file holding a token (at least 16 bytes, mode 0600 or 0400) that /metrics and /debug/pprof require as a bearer credential, keeping them the node operator's; /healthz stays open (default: no token, any local user may scrape)")
	fl.DurationVar(&c.lookupProtect, "lookup-protect", disk.DefaultLookupProtect, "keep blocks that answered a lookup this long from eviction")
	fl.StringVar(&c.listen, "listen", "", "address where peers send mirrored rows, e.g. 0.0.0.0:7470 (multi-node)")
	fl.StringArrayVar(&c.peers, "peer", nil, "address of a peer daemon to mirror loaded rows to; repeat for each (multi-node)")
	fl.StringVar(&c.secretFile, "secret-file", "", "file holding the secret shared by all peers (at least 16 bytes); required with --listen or --peer")
	c.replicated = rowsync.ModeAuto
	fl.Var(&c.replicated, "replicated-kv", "mirror rows only when KV is replicated across ranks (MLA): auto decides from store-time samples")
	fl.DurationVar(&c.syncDeadline, "sync-deadline", rowsync.DefaultDeadline, "how long a peer may take to acknowledge a mirrored row before the load fails")
	rowBytes := fl.String("row-bytes", "", "this node's row size, the size of one block file of the tier, e.g. 8601600: with --listen, rows peers send are accepted at this size only, until this node's own loads or stores name its size (default: refuse rows until then)")
	stagingBytes := fl.String("staging-bytes", "", fmt.Sprintf("RAM for wave staging, e.g. 1GiB; 0 disables staging (default 10%% of RAM, at most %dGiB)", staging.MaxDefaultBudget>>30))
	fl.IntVar(&c.stagingDepth, "staging-depth", staging.DefaultQueueDepth, "store reads in flight that staging fills: its fetches plus the engine's loads that read the store")
	fl.DurationVar(&c.diagWindow, "diagnostics-window", diagnose.DefaultWindow, fmt.Sprintf("window over which stat's field diagnostics judge a workload (a present key unread for a quarter of it, at most %s, counts as waiting); a warning on checksum failures, blocks changed outside the daemon, refused stores, refused opens or store I/O errors clears after a window without one", diagnose.MaxReadGrace))
	diagMinBytes := fl.String("diagnostics-min-bytes", fmt.Sprintf("%dGiB", diagnose.DefaultMinStoredBytes>>30), "bytes a group or the tier must have stored in the window before stat calls it write-only")
	passthroughMinRow := fl.String("passthrough-min-row", fmt.Sprintf("%dMiB", disk.DefaultPassthroughMinRow>>20), "smallest row (block) size whose stores the kernel writes straight to the store file (FUSE passthrough); smaller rows are written through the daemon, which checksums them as they arrive, so their rename reads nothing back from the disk; 0 passes every row through")
	maxRequest := fl.String("max-request", "4MiB", "largest FUSE read/write request, at least 16KiB (as root the mount raises fs.fuse.max_pages_limit to allow it; a mount with --peer reads in requests of at most half of --row-bytes, or 128KiB without it, so that a mirrored row arrives in two or more)")
	lookupBudget := fl.String("lookup-budget", "auto", "auto: answer present, within one request's lookup, for no more keys than the engine's primary tier (its shm region's rows) can promote at once, so an engine whose lookup promotes every key it confirms (stock vLLM) gets the longest hit it can load instead of none; off: answer every lookup as the store says")
	fl.BoolVar(&c.primeLookups, "prime-lookups", true, "when the kernel looks a tier up afresh (first, or after dropping its caches), look its 4,096 prefix names up from a helper process so that an engine's first lookups of new keys stay in the kernel's cache (not with --shared)")
	fl.BoolVar(&c.nonempty, "nonempty", false, "mount over a mountpoint that holds files (the mount hides them; by default a non-empty mountpoint is refused)")
	fl.BoolVar(&c.allowOther, "allow-other", false, "let users other than the one mounting reach the mount (needed when --engine-uid is another user; as non-root, user_allow_other in /etc/fuse.conf)")
	fl.IntVar(&c.engineUID, "engine-uid", os.Getuid(), "uid of the engine: the store, its blocks and the control files belong to it and root only, and its shm regions are mapped (default: the user running kvtierfs mount)")
	fl.StringVar(&c.kvEventsEndpoint, "kv-events-endpoint", "", "ZMQ address where blocks the store evicts, drops or has unlinked are published as vLLM BlockRemoved KV events for routers: tcp://*:5557 binds (loopback unless --kv-events-bind-all), tcp://HOST:PORT connects; empty disables")
	fl.StringVar(&c.kvEventsTopic, "kv-events-topic", "", "topic frame of the KV events, as vLLM's kv-events-config topic")
	fl.BoolVar(&c.kvEventsBindAll, "kv-events-bind-all", false, "bind a wildcard --kv-events-endpoint (*, ::, 0.0.0.0) on every interface instead of loopback")
	fl.BoolVar(&c.debug, "debug", false, "log debug events and serve /debug/pprof on --metrics-addr")
	fl.BoolVar(&c.debugFUSE, "debug-fuse", false, "log every FUSE request (very verbose)")
	sharedFlags := addSharedFlags(fl)
	c.logFormat = addLogFormatFlag(fl)
	mnt, err := parseArgs(fl, args)
	if err != nil {
		return c, err
	}
	c.mountpoint = mnt
	if capacity != "" {
		if c.capacity, err = parseSize("capacity", capacity); err != nil {
			return c, usageError{err}
		}
	}
	if c.lookupProtect <= 0 {
		return c, usageError{fmt.Errorf("--lookup-protect %s: want a positive duration such as 600s or 10m", c.lookupProtect)}
	}
	c.stagingBytes = staging.DefaultBudget()
	if *stagingBytes == "0" {
		c.stagingBytes = 0
	} else if *stagingBytes != "" {
		if c.stagingBytes, err = parseSize("staging-bytes", *stagingBytes); err != nil {
			return c, usageError{err}
		}
	}
	switch *lookupBudget {
	case "auto", "off":
		c.lookupBudget = *lookupBudget == "auto"
	default:
		return c, usageError{fmt.Errorf("--lookup-budget %q: want auto or off", *lookupBudget)}
	}
	if c.diagMinBytes, err = parseSize("diagnostics-min-bytes", *diagMinBytes); err != nil {
		return c, usageError{err}
	}
	if strings.TrimSpace(*passthroughMinRow) != "0" {
		if c.passthroughMinRow, err = parseSize("passthrough-min-row", *passthroughMinRow); err != nil {
			return c, usageError{fmt.Errorf("%w, or 0", err)}
		}
	}
	if c.maxRequest, err = parseSize("max-request", *maxRequest); err != nil {
		return c, usageError{err}
	}
	if c.maxRequest < 16<<10 || c.maxRequest > 1<<30 {
		return c, usageError{fmt.Errorf("--max-request %s: want 16KiB to 1GiB", *maxRequest)}
	}
	if c.stagingDepth <= 0 {
		return c, usageError{fmt.Errorf("--staging-depth %d: want at least 1", c.stagingDepth)}
	}
	if c.diagWindow <= 0 {
		return c, usageError{fmt.Errorf("--diagnostics-window %s: want a positive duration such as 10m", c.diagWindow)}
	}
	if *rowBytes != "" {
		if c.rowBytes, err = parseSize("row-bytes", *rowBytes); err != nil {
			return c, usageError{err}
		}
		if c.rowBytes <= 0 || c.rowBytes > rowsync.MaxRowBytes || c.rowBytes%int64(os.Getpagesize()) != 0 {
			return c, usageError{fmt.Errorf("--row-bytes %s: want a multiple of the page size (%d bytes) up to %d bytes", *rowBytes, os.Getpagesize(), rowsync.MaxRowBytes)}
		}
	}
	if c.syncDeadline <= 0 {
		return c, usageError{fmt.Errorf("--sync-deadline %s: want a positive duration such as 2s", c.syncDeadline)}
	}
	if err := checkEngineUID(c.engineUID, c.allowOther); err != nil {
		return c, usageError{err}
	}
	if c.kvEventsEndpoint != "" {
		if err := kvevents.CheckEndpoint(c.kvEventsEndpoint); err != nil {
			return c, usageError{fmt.Errorf("--kv-events-endpoint %s: %w", c.kvEventsEndpoint, err)}
		}
	}
	if c.shared, c.sharedKernelNegative, err = sharedFlags.config(); err != nil {
		return c, usageError{err}
	}
	if (c.listen != "" || len(c.peers) > 0) && c.secretFile == "" {
		return c, usageError{fmt.Errorf("--listen and --peer need --secret-file: peers authenticate each other with a shared secret")}
	}
	if c.store == defaultStore() {
		if err := os.MkdirAll(c.store, 0o755); err != nil {
			return c, fmt.Errorf("creating default store directory: %w", err)
		}
	}
	return c, nil
}

func runMount(args []string) error {
	c, err := parseMountFlags(args)
	if err != nil {
		return err
	}
	level := slog.LevelInfo
	if c.debug || c.debugFUSE {
		level = slog.LevelDebug
	}
	logger := newLogger(os.Stderr, *c.logFormat, level)
	if limit := limitMemory(c.stagingBytes); limit > 0 {
		logger.Debug("Go memory limit set from --staging-bytes", "limit", formatBytes(limit))
	}

	if err := checkDisjoint(c.mountpoint, c.store); err != nil {
		return usageError{err}
	}
	if err := checkSharedDisjoint(c.shared.Dir, c.mountpoint, c.store); err != nil {
		return usageError{err}
	}
	var metricsToken []byte
	if c.metricsToken != "" {
		if metricsToken, err = rowsync.ReadSecretFile(c.metricsToken); err != nil {
			return fmt.Errorf("--metrics-token-file: %w", err)
		}
	}
	// Bound before the store is indexed, which may take minutes: a port
	// someone holds fails the start at once.
	var metricsListener net.Listener
	if c.metricsAddr != "" {
		if metricsListener, err = listenMetrics(c.metricsAddr); err != nil {
			return err
		}
		defer metricsListener.Close()
	}
	if c.listen != "" {
		// Tried before the store is indexed too: a port someone holds
		// fails the start at once. Row mirroring binds it after.
		if err := probeListen(c.listen); err != nil {
			return err
		}
	}
	mnt, err := prepareMountpoint(c.mountpoint, c.nonempty)
	if err != nil {
		return err
	}
	defer mnt.close()
	store, err := disk.Open(disk.Config{Dir: c.store, Capacity: c.capacity, LookupProtect: c.lookupProtect,
		LookupCacheTTL: fusefs.BlockEntryTimeout(c.lookupBudget, c.listen != "" || len(c.peers) > 0, c.lookupProtect), Logger: logger, Owner: engineOwner(c.engineUID),
		PassthroughMinRow: c.passthroughMinRow})
	if err != nil {
		return fmt.Errorf("--store: %w", err)
	}
	defer store.Close()
	regionOwner := uint32(c.engineUID)
	regions, err := shm.NewSetWith(c.shmGlob, shm.Options{EngineUID: &regionOwner})
	if err != nil {
		return usageError{fmt.Errorf("--shm-glob: %w", err)}
	}
	defer regions.Close()
	if err := regions.Refresh(); err != nil {
		logger.Warn("shm regions", "err", err)
	}

	syncRegions := rowsync.NewRegions(regions)
	defer syncRegions.Close()
	node, err := startSync(c, syncRegions, store, logger)
	if err != nil {
		return err
	}
	if node != nil {
		defer node.Close()
	}

	reg := prometheus.NewRegistry()
	// The daemon's own health beside the tier's: goroutines, memory, open
	// descriptors (go_* and process_* metrics).
	build := thisBuild()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildInfoMetric(build))
	events, err := startKVEvents(c, reg, logger)
	if err != nil {
		return fmt.Errorf("--kv-events-endpoint %w", err)
	}
	if events != nil {
		defer events.Close()
	}
	sharedLevel, err := startShared(c.shared, store, logger)
	if err != nil {
		return err
	}
	if sharedLevel != nil {
		defer sharedLevel.Close()
	}
	var stager *staging.Stager
	if c.stagingBytes > 0 {
		fetch := core.StagingFetch(store, nil)
		if sharedLevel != nil {
			fetch = core.StagingFetch(store, sharedLevel)
		}
		if stager, err = staging.NewStager(fetch,
			staging.Options{Budget: c.stagingBytes, QueueDepth: c.stagingDepth}); err != nil {
			return err
		}
		defer stager.Close()
	}
	diagnostics := diagnose.New(diagnose.Options{Window: c.diagWindow, MinStoredBytes: c.diagMinBytes})
	// Caught from before the mount on (a stop request as soon as the mount
	// is visible still unmounts); until then a signal ends the process.
	opts := fusefs.Options{Store: store, Regions: regions, Logger: logger, Registerer: reg,
		Debug: c.debugFUSE, Sync: node, SyncRegions: syncRegions, SyncDeadline: c.syncDeadline, Stager: stager, Diagnostics: diagnostics, WarningWindow: c.diagWindow,
		MaxRequest: int(c.maxRequest), AllowOther: c.allowOther, KVEvents: events}
	if c.lookupBudget {
		opts.LookupBudget = lookupbudget.New(lookupbudget.Options{})
	}
	if sharedLevel != nil {
		opts.Shared = sharedLevel
		opts.NegativeTimeout = c.sharedKernelNegative
	}
	var helper *prime.Helper
	if sharedLevel == nil && c.primeLookups {
		// The daemon's own binary, even if the file was replaced since.
		if helper, err = prime.Start("/proc/self/exe", c.mountpoint, logger); err != nil {
			return err
		}
		defer helper.Close()
		opts.Primer = helper
	}
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	if err := mnt.guard(logger); err != nil {
		return err
	}
	fsys, err := mnt.mount(opts, "kvtierfs:"+store.Root())
	if err != nil {
		return err
	}
	var serving atomic.Bool
	serving.Store(true)
	if err := mnt.seal(); err != nil {
		logger.Warn("the mountpoint stays writable by its owner while no daemon serves it", "err", err)
	}
	if metricsListener != nil {
		mux := http.NewServeMux()
		mux.Handle("/metrics", requireToken(metricsToken, promhttp.HandlerFor(reg, promhttp.HandlerOpts{})))
		mux.Handle("/healthz", newHealth(serving.Load, store.Check))
		if c.debug {
			mux.Handle("/debug/pprof/", requireToken(metricsToken, http.HandlerFunc(pprof.Index)))
			mux.Handle("/debug/pprof/profile", requireToken(metricsToken, http.HandlerFunc(pprof.Profile)))
		}
		defer serveMetrics(metricsListener, mux).Close()
	}
	st := store.Stats()
	metricsAt := "disabled"
	if metricsListener != nil {
		metricsAt = "http://" + metricsListener.Addr().String() + "/metrics"
	}
	logger.Info("mounted", "mountpoint", c.mountpoint, "store", store.Root(), "blocks", st.Blocks,
		"capacity", formatBytes(st.CapacityBytes), "metrics", metricsAt, "version", build.version, "commit", build.revision)
	stopEventLog := startEventLog(fsys.Stats, logger)
	defer stopEventLog()
	if err := sdNotify("READY=1\nSTATUS=serving " + c.mountpoint); err != nil {
		logger.Warn("service manager", "err", err)
	}

	go func() {
		sig := <-signals
		serving.Store(false)
		logger.Info("unmounting", "signal", sig.String())
		sdNotify("STOPPING=1")
		if helper != nil {
			helper.Close() // its lookups would keep the mount busy
		}
		go abortAfterGrace(fsys, logger)
		unmountOnSignal(fsys, logger)
	}()
	fsys.Wait()
	logger.Info("unmounted", "mountpoint", c.mountpoint)
	return nil
}

// unmountOnSignal unmounts, retrying while files are open, then detaches lazily.
func unmountOnSignal(fsys *fusefs.FS, logger *slog.Logger) {
	for range 10 {
		if err := fsys.Unmount(); err == nil {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	logger.Warn("mount busy: detaching lazily; it disappears when the last open file closes", "mountpoint", fsys.Mountpoint())
	if err := fsys.Detach(); err != nil {
		logger.Error("lazy unmount failed", "err", err)
	}
}

// abortGrace is how long the daemon keeps serving after SIGTERM while its
// mount is still held: files still open may close meanwhile (the unmount
// retries, then detaches lazily).
const abortGrace = 10 * time.Second

// abortAfterGrace ends the FUSE connection once the grace has passed with
// the mount still held: by files still open, or by a copy of it in another
// mount namespace, which no unmount of the daemon's reaches (and which keeps
// a successful unmount waiting for the serve loop).
func abortAfterGrace(fsys *fusefs.FS, logger *slog.Logger) {
	select {
	case <-fsys.Done():
		return
	case <-time.After(abortGrace):
	}
	logger.Warn("the mount is still held (open files, or a copy in another mount namespace): aborting its FUSE connection",
		"grace", abortGrace)
	if err := fsys.Abort(); err != nil {
		// Exiting closes the daemon's /dev/fuse descriptor, which ends
		// the connection too, without the orderly shutdown.
		logger.Error("cannot abort the FUSE connection: exiting, which ends it", "err", err)
		os.Exit(1)
	}
}

// startSync starts row mirroring when peers are configured; nil on a single node.
func startSync(c mountConfig, regions *rowsync.Regions, notes rowsync.Notes, logger *slog.Logger) (*rowsync.Node, error) {
	if c.listen == "" && len(c.peers) == 0 {
		return nil, nil
	}
	secret, err := rowsync.ReadSecretFile(c.secretFile)
	if err != nil {
		return nil, fmt.Errorf("--secret-file: %w", err)
	}
	node, err := rowsync.Start(rowsync.Config{Listen: c.listen, Peers: c.peers, Secret: secret,
		Replicated: c.replicated, Deadline: c.syncDeadline, Region: regions.Local, Notes: notes, RowBytes: int(c.rowBytes),
		Logf: func(format string, args ...any) { logger.Info(fmt.Sprintf(format, args...), "source", "sync") }})
	if errors.Is(err, syscall.EADDRINUSE) {
		return nil, explainListen("--listen", c.listen, err, listenHarm, listenRemedy)
	}
	if err != nil {
		return nil, fmt.Errorf("starting row mirroring: %w", err)
	}
	logger.Info("row mirroring", "listen", node.Addr(), "peers", c.peers, "replicated_kv", c.replicated.String())
	return node, nil
}

// What a --listen port another user holds does, and what to do instead.
const (
	listenHarm   = "it keeps this node from receiving its peers' rows (their connections to that address would reach that process instead)"
	listenRemedy = "choose another --listen port (and give it to the peers' --peer)"
)

// probeListen binds --listen and lets it go.
func probeListen(addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return explainListen("--listen", addr, err, listenHarm, listenRemedy)
	}
	return l.Close()
}

// checkDisjoint refuses a mountpoint inside the store or a store inside the
// mountpoint: the store's files would then be served through themselves.
func checkDisjoint(mountpoint, store string) error {
	m, err := filepath.Abs(mountpoint)
	if err != nil {
		return err
	}
	st, err := filepath.Abs(store)
	if err != nil {
		return err
	}
	within := func(dir, base string) bool {
		return dir == base || strings.HasPrefix(dir, base+string(filepath.Separator))
	}
	if within(m, st) || within(st, m) {
		return fmt.Errorf("mountpoint %s and --store %s must not contain each other", m, st)
	}
	return nil
}

// checkEngineUID refuses an engine uid the mount could not serve: another
// user than the one mounting needs --allow-other to reach the mount, and
// only root can give the store to another user.
func checkEngineUID(uid int, allowOther bool) error {
	switch {
	case uid < 0:
		return fmt.Errorf("--engine-uid %d: want a uid, 0 or more", uid)
	case uid != os.Getuid() && os.Geteuid() != 0:
		return fmt.Errorf("--engine-uid %d: only root can give the store to another user than itself (uid %d)", uid, os.Getuid())
	case uid != os.Getuid() && !allowOther:
		return fmt.Errorf("--engine-uid %d is not the user mounting (uid %d): add --allow-other so that the engine can reach the mount", uid, os.Getuid())
	}
	return nil
}

// engineOwner is the store's owner for the engine's uid, with its primary
// group when the user database knows it (else the group of the same number).
func engineOwner(uid int) *disk.Owner {
	gid := uid
	if u, err := user.LookupId(strconv.Itoa(uid)); err == nil {
		if g, err := strconv.Atoi(u.Gid); err == nil {
			gid = g
		}
	}
	return &disk.Owner{UID: uid, GID: gid}
}
