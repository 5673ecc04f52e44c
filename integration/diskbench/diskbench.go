// Package diskbench measures the engine's raw disk-tier pattern through a
// kvtierfs mount and, in the same run, straight on a bare directory of the
// same filesystem: stores (16 threads, O_EXCL tmp + one O_DIRECT write +
// rename), loads (16 threads, one O_DIRECT readv of a whole row into a shm
// row) with a cold and a warm page cache, and lookups (faccessat) of present
// and absent keys. Loads run on native threads (vLLM's C batch loader: open,
// one readv, close with its error ignored), into rows that held other
// blocks, and every block's bytes are its own, so no load finds its block
// already in a row except in the reload phase, which measures exactly that.
// Beside the stores and the absent-key lookups it times the same work through
// a trivial FUSE server in the bench process (floor.go), the best a FUSE
// mount can do on the machine. It is `kvtierfs bench --scenario disk`.
package diskbench

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/integration/daemon"
	"github.com/kvtierfs/kvtierfs/integration/engineio"
	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// Config sizes a run.
type Config struct {
	// Binary is the kvtierfs executable that mounts the tier.
	Binary string
	// Dir is a work directory on the disk under test; it is emptied at the end.
	Dir string
	// RowBytes is the size of one block (one shm row).
	RowBytes int
	// Blocks is how many blocks each side stores and loads.
	Blocks int
	// Threads is the engine's I/O thread count.
	Threads int
	// LookupKeys is how many keys the lookup phase checks: the stored blocks
	// (present), then absent keys, half in leaf directories that hold blocks
	// and half in directories that do not exist (see lookupChain).
	LookupKeys int
	// DropCaches empties the page cache before each cold phase (root only).
	DropCaches bool
	// StagingOff mounts with wave staging off (--staging-bytes 0).
	StagingOff bool
	// PassthroughMinRow is the mount's --passthrough-min-row; empty leaves
	// the mount's default.
	PassthroughMinRow string
	// Rounds splits the blocks of the store phase into rounds that alternate
	// the sides (mount, bare, mount, bare …), so that a drift of the disk's
	// speed during the phase weighs on both sides alike. Load phases run in
	// one pass: in rounds, staging would fetch a round's blocks during the
	// round before, and the mount's loads would no longer be cold.
	Rounds int
	// Progress receives one line per phase; nil discards them.
	Progress io.Writer
}

// DefaultConfig is the benchmark: 512 blocks of 8 MiB, 16 threads, 12,434 lookups.
func DefaultConfig() Config {
	return Config{RowBytes: 8 << 20, Blocks: 512, Threads: 16, LookupKeys: 12434, Rounds: 4}
}

// mountArgs are the mount's flags beyond the store, mountpoint and region.
// The lookup budget is off: these benchmarks measure the store and the
// kernel's caches against the bare directory, and look up more present keys
// in one chain than their region has rows, which the budget would withhold
// (its answers and their cost are the engine model's to measure,
// integration/engine). The chain benchmark mounts likewise: it replays an
// engine that loads in waves, which the budget leaves alone only when it
// matches through .kvtier/match.
func (c Config) mountArgs() []string {
	args := []string{"--lookup-budget", "off"}
	if c.StagingOff {
		args = append(args, "--staging-bytes", "0")
	}
	if c.PassthroughMinRow != "" {
		args = append(args, "--passthrough-min-row", c.PassthroughMinRow)
	}
	return args
}

// Validate checks a configuration, naming the offending flag.
func (c Config) Validate() error {
	switch {
	case c.RowBytes <= 0 || c.RowBytes%engineio.PageSize != 0:
		return fmt.Errorf("--row-bytes %d: want a positive multiple of %d", c.RowBytes, engineio.PageSize)
	case c.Blocks <= 0:
		return fmt.Errorf("--blocks %d: want at least 1", c.Blocks)
	case c.Threads <= 0:
		return fmt.Errorf("--threads %d: want at least 1", c.Threads)
	case c.Rounds < 1 || c.Rounds > c.Blocks:
		return fmt.Errorf("--rounds %d: want 1 to --blocks (%d)", c.Rounds, c.Blocks)
	case c.LookupKeys < c.Blocks:
		return fmt.Errorf("--lookups %d: want at least --blocks (%d)", c.LookupKeys, c.Blocks)
	case c.Dir == "" || c.Binary == "":
		return errors.New("diskbench: Dir and Binary are required")
	}
	return nil
}

// Measurement is one phase on both sides.
type Measurement struct {
	Phase  string  `json:"phase"`
	Unit   string  `json:"unit"`
	Mount  float64 `json:"mount"`
	Direct float64 `json:"direct"`
	// Ratio is mount/direct for throughputs (higher is better) and
	// direct/mount for latencies, so above 1 always means the mount is faster.
	Ratio float64 `json:"ratio"`
	// DaemonCPUPerGB is the daemon's CPU seconds (user + system) per GB the
	// mount side moved; 0 for phases that move no bytes.
	DaemonCPUPerGB float64 `json:"daemon_cpu_s_per_gb,omitempty"`
}

// Result is a whole run.
type Result struct {
	Config       Config        `json:"-"`
	RowBytes     int           `json:"row_bytes"`
	Blocks       int           `json:"blocks"`
	Threads      int           `json:"threads"`
	LookupKeys   int           `json:"lookup_keys"`
	ColdCache    bool          `json:"cold_cache"`
	Measurements []Measurement `json:"measurements"`
	// VerifiedLoads counts loads whose bytes were compared in full with what was stored.
	VerifiedLoads int `json:"verified_loads"`
	// FloorVerified counts the store floor's blocks read back from its
	// directory and found equal to their rows.
	FloorVerified int `json:"floor_verified"`
}

// run holds the state of one benchmark run.
type run struct {
	cfg       Config
	daemonPid int
	region    *engineio.Region
	mount     *engineio.Tier
	bare      *engineio.Tier
	store     *engineio.Tier
}

// tierDir is the engine's per-model directory used by the benchmark.
const tierDir = "Bench_000000000000_r0"

// sourceRows is how many distinct rows the stores come from: block i holds
// row i mod sourceRows, so blocks loaded at the same time always differ, as
// the engine's do, without filling a row per block inside the timed phases.
const sourceRows = 64

// benchSpace makes a work directory under dir and an shm region named after
// name with sourceRows rows, filled by fill, plus one row per thread to load
// into. cleanup removes both.
func benchSpace(dir, name string, threads, rowBytes int, fill func(i int, row []byte)) (work string, region *engineio.Region, cleanup func(), err error) {
	if work, err = os.MkdirTemp(dir, name+"-"); err != nil {
		return "", nil, nil, err
	}
	regionPath := fmt.Sprintf("/dev/shm/vllm_offload_%s_%d.mmap", name, os.Getpid())
	if region, err = engineio.CreateRegion(regionPath, sourceRows+threads, rowBytes); err != nil {
		os.RemoveAll(work)
		return "", nil, nil, err
	}
	for i := 0; i < sourceRows; i++ {
		fill(i, region.Row(i))
	}
	return work, region, func() { region.Close(); os.RemoveAll(work) }, nil
}

// Run performs the benchmark. Everything it creates is removed before it returns.
func Run(cfg Config) (Result, error) {
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	res := Result{Config: cfg, RowBytes: cfg.RowBytes, Blocks: cfg.Blocks, Threads: cfg.Threads,
		LookupKeys: cfg.LookupKeys, ColdCache: cfg.DropCaches}
	work, region, cleanup, err := benchSpace(cfg.Dir, "kvtierbench", cfg.Threads, cfg.RowBytes, func(i int, row []byte) {
		engineio.FillPattern(row, uint64(i))
	})
	if err != nil {
		return res, err
	}
	defer cleanup()
	d, err := daemon.Start(daemon.Options{Binary: cfg.Binary, Mountpoint: filepath.Join(work, "mnt"),
		Store: mkdir(work, "store"), ShmGlob: region.Path, Args: cfg.mountArgs()})
	if err != nil {
		return res, err
	}
	defer d.Stop()
	r := &run{cfg: cfg, region: region}
	if r.mount, err = engineio.OpenTier(d.Mountpoint); err != nil {
		return res, err
	}
	if r.bare, err = engineio.OpenTier(mkdir(work, "bare")); err != nil {
		return res, err
	}
	r.store = &engineio.Tier{Root: d.Store, Direct: r.bare.Direct}

	r.daemonPid = d.Pid()
	steps := []func(*Result) error{r.stores, r.coldLoads, r.warmLoads, r.reloads, r.lookups, r.verify}
	for _, step := range steps {
		engineio.OnSignalFreeThread(func() { err = step(&res) })
		if err != nil {
			return res, err
		}
	}
	return res, nil
}

func mkdir(parent, name string) string {
	p := filepath.Join(parent, name)
	os.MkdirAll(p, 0o755)
	return p
}

// key is the chunk hash of block i.
func key(i int) string {
	sum := sha256.Sum256(binary.LittleEndian.AppendUint64(nil, uint64(i)))
	return hex.EncodeToString(sum[:])
}

// sourceRow is the region row block i is stored from, holding block i's
// bytes: the pattern of row i mod sourceRows with windows unique to block i
// at every offset a block digest samples, so that no other block's row
// matches its digest.
func (r *run) sourceRow(i int) []byte {
	row := r.region.Row(i % sourceRows)
	stamp(row, uint64(i), len(row))
	return row
}

// stamp writes windows derived from id at every offset a digest may sample
// below within, so that rows of other blocks never match its digest.
func stamp(row []byte, id uint64, within int) {
	for _, off := range block.ProbeOffsets(int64(len(row))) {
		if int(off)+8 <= within {
			binary.LittleEndian.PutUint64(row[off:], id*0x9E3779B97F4A7C15+uint64(off)|1)
		}
	}
}

// scrambleRows gives every row of the region bytes of no block, as rows the
// engine reused hold.
func (r *run) scrambleRows() {
	for i := range sourceRows + r.cfg.Threads {
		stamp(r.region.Row(i), 1<<62+uint64(i), r.cfg.RowBytes)
	}
}

// loadRow is the row thread loads into.
func (r *run) loadRow(thread int) []byte {
	return r.region.Row(sourceRows + thread)
}

// parallel runs fn(thread, i) for i in [0, n), in order, on threads workers
// (signal-free threads, as the engine's are), and returns the wall time and
// the first error.
func parallel(threads, n int, fn func(thread, i int) error) (time.Duration, error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	var firstErr atomic.Value
	start := time.Now()
	for t := 0; t < threads; t++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			engineio.OwnSignalFreeThread()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := fn(t, i); err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err, ok := firstErr.Load().(error); ok {
		return elapsed, err
	}
	return elapsed, nil
}

func (r *run) report(res *Result, m Measurement) {
	res.Measurements = append(res.Measurements, m)
	fmt.Fprintf(r.cfg.Progress, "%-40s mount %10.3f %s   direct %10.3f %s   ratio %.2f   daemon %.3f CPU s/GB\n",
		m.Phase, m.Mount, m.Unit, m.Direct, m.Unit, m.Ratio, m.DaemonCPUPerGB)
}

// daemonCPU is the CPU time the daemon has used so far (user + system).
func (r *run) daemonCPU() time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", r.daemonPid))
	if err != nil {
		return 0
	}
	// Fields after the command name (which may hold spaces) start after ") ".
	fields := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+1:]))
	if len(fields) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / clockTicks
}

// clockTicks is the kernel's USER_HZ, the unit of /proc/PID/stat CPU times.
const clockTicks = 100

// perGB is cpu per GB of n blocks.
func (r *run) perGB(cpu time.Duration, n int) float64 {
	return cpu.Seconds() / (float64(n) * float64(r.cfg.RowBytes) / 1e9)
}

// sides is one phase run on both sides: the mount, then the bare directory
// (or the store directory read straight), each preceded by prepare, in
// rounds: blocks [lo, hi) of each round on the mount, then on the other side.
type sides struct {
	phase         string
	blocks        int
	rounds        int
	prepare       func() error
	mount, direct func(lo, hi int) (time.Duration, error)
	// noDaemonCPU: the mount side is not the daemon's (the store floor).
	noDaemonCPU bool
}

// compare runs a phase on both sides and reports GB/s of blocks rows each,
// with the daemon's CPU time per GB on the mount side.
func (r *run) compare(res *Result, p sides) error {
	var mount, direct, cpu time.Duration
	rounds := max(1, min(p.rounds, p.blocks))
	for k := range rounds {
		lo, hi := k*p.blocks/rounds, (k+1)*p.blocks/rounds
		if err := p.prepare(); err != nil {
			return err
		}
		before := r.daemonCPU()
		took, err := p.mount(lo, hi)
		cpu += r.daemonCPU() - before
		mount += took
		if err != nil {
			return fmt.Errorf("%s through the mount: %w", p.phase, err)
		}
		if err := p.prepare(); err != nil {
			return err
		}
		took, err = p.direct(lo, hi)
		direct += took
		if err != nil {
			return fmt.Errorf("%s on the bare directory: %w", p.phase, err)
		}
	}
	moved := float64(p.blocks) * float64(r.cfg.RowBytes)
	m, d := moved/mount.Seconds()/1e9, moved/direct.Seconds()/1e9
	perGB := r.perGB(cpu, p.blocks)
	if p.noDaemonCPU {
		perGB = 0
	}
	r.report(res, Measurement{Phase: p.phase, Unit: "GB/s", Mount: m, Direct: d, Ratio: m / d, DaemonCPUPerGB: perGB})
	return nil
}

// stores writes every block to the mount and to the bare directory, each
// side starting with no dirty pages of the other, then to the store floor
// (storeFloor) and a fresh bare directory.
func (r *run) stores(res *Result) error {
	if err := r.compareStores(res, "store (O_DIRECT write)", r.mount, r.bare, true); err != nil {
		return err
	}
	if err := r.reportStorePhases(res); err != nil {
		return err
	}
	return r.storeFloor(res)
}

// compareStores stores every block through mount and into bare, in rounds,
// and reports GB/s (the daemon's CPU per GB when daemonCPU), then what each
// store's open (the tmp's create) and rename cost the engine's thread, at
// the median and the 99th percentile. The phases after the first name theirs
// after it, past its first word.
func (r *run) compareStores(res *Result, phase string, mount, bare *engineio.Tier, daemonCPU bool) error {
	storeAll := func(tier *engineio.Tier) func(lo, hi int) (time.Duration, error) {
		return func(lo, hi int) (time.Duration, error) {
			return parallel(r.cfg.Threads, hi-lo, func(thread, i int) error {
				_, err := tier.Store(tier.BlockPath(tierDir, 0, key(lo+i)), r.sourceRow(lo+i))
				return err
			})
		}
	}
	// One block first, untimed, on each side: the mount learns a tier's row
	// size from its first block, so the timed stores are those of an engine
	// that has been storing for a while (DESIGN.md "The store").
	warmUp := r.loadRow(0)
	stamp(warmUp, 1<<61, len(warmUp))
	for _, tier := range []*engineio.Tier{mount, bare} {
		if _, err := tier.Store(tier.BlockPath(tierDir, 0, key(-1)), warmUp); err != nil {
			return fmt.Errorf("the first store of the tier: %w", err)
		}
	}
	mount.Ops, bare.Ops = &engineio.OpTimes{}, &engineio.OpTimes{}
	defer func() { mount.Ops, bare.Ops = nil, nil }()
	if err := r.compare(res, sides{phase: phase, blocks: r.cfg.Blocks, rounds: r.cfg.Rounds, noDaemonCPU: !daemonCPU,
		prepare: func() error { unix.Sync(); return nil }, mount: storeAll(mount), direct: storeAll(bare)}); err != nil {
		return err
	}
	suffix := ""
	if _, rest, ok := strings.Cut(phase, ":"); ok {
		suffix = ":" + rest
	}
	for _, p := range []float64{50, 99} {
		mountOpen, mountRename := mount.Ops.Percentiles(p)
		bareOpen, bareRename := bare.Ops.Percentiles(p)
		for _, op := range []struct {
			name        string
			mount, bare time.Duration
		}{{"open", mountOpen, bareOpen}, {"rename", mountRename, bareRename}} {
			m, d := float64(op.mount)/1e3, float64(op.bare)/1e3
			r.report(res, Measurement{Phase: fmt.Sprintf("store %s p%g%s", op.name, p, suffix), Unit: "µs", Mount: m, Direct: d, Ratio: d / m})
		}
	}
	return nil
}

// reportStorePhases reports the daemon's own timing of each step of the
// stores' creates and renames (stats.json's disk.store_phases), p50 and p99
// as its histogram gives them (within 19 %); the bare directory has none.
func (r *run) reportStorePhases(res *Result) error {
	st, err := readStats(r.mount.Root)
	if err != nil {
		return fmt.Errorf("reading the mount's store phases: %w", err)
	}
	for _, name := range slices.Sorted(maps.Keys(st.Disk.StorePhases)) {
		ph := st.Disk.StorePhases[name]
		for _, p := range []struct {
			at    string
			value float64
		}{{"p50", ph.P50Micros}, {"p99", ph.P99Micros}} {
			r.report(res, Measurement{Phase: fmt.Sprintf("daemon %s %s", name, p.at), Unit: "µs", Mount: p.value})
		}
	}
	return nil
}

// loadAll returns the loads of blocks [lo, hi) from a tier into the
// region's rows (block lo+j into row j mod rows) on native threads, as vLLM's
// C loader does; the rows hold no block beforehand.
func (r *run) loadAll(tier *engineio.Tier) func(lo, hi int) (time.Duration, error) {
	return func(lo, hi int) (time.Duration, error) {
		r.scrambleRows()
		paths := make([]string, hi-lo)
		for j := range paths {
			paths[j] = tier.BlockPath(tierDir, 0, key(lo+j))
		}
		return nativeLoads(paths, r.region.Bytes(), r.cfg.RowBytes, r.cfg.Threads, tier.Direct)
	}
}

// reloads loads blocks into rows that still hold them (an engine re-promoting
// a block whose row was freed but not reused): the mount copies the row
// instead of reading the disk, the bare directory reads the disk.
func (r *run) reloads(res *Result) error {
	n := min(r.cfg.Blocks, sourceRows)
	reload := func(tier *engineio.Tier) func(lo, hi int) (time.Duration, error) {
		return func(lo, hi int) (time.Duration, error) {
			paths := make([]string, hi-lo)
			for j := range paths { // earlier phases loaded other blocks into these rows
				i := lo + j
				engineio.FillPattern(r.region.Row(i), uint64(i))
				r.sourceRow(i)
				paths[j] = tier.BlockPath(tierDir, 0, key(i))
			}
			rows := r.region.Bytes()[lo*r.cfg.RowBytes : hi*r.cfg.RowBytes]
			return nativeLoads(paths, rows, r.cfg.RowBytes, r.cfg.Threads, tier.Direct)
		}
	}
	return r.compare(res, sides{phase: "reload into its own row", blocks: n, prepare: r.dropCaches,
		mount: reload(r.mount), direct: reload(r.store)})
}

// dropCaches writes back and empties the page cache.
func (r *run) dropCaches() error { return dropCaches(r.cfg.DropCaches) }

// dropCaches writes back and, when enabled, empties the page cache.
func dropCaches(enabled bool) error {
	if !enabled {
		return nil
	}
	unix.Sync()
	return os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0)
}

// coldLoads loads every block once with an empty page cache, through the
// mount and straight from the store directory.
func (r *run) coldLoads(res *Result) error {
	phase := "load, cold cache (O_DIRECT)"
	if !r.cfg.DropCaches {
		phase = "load, first (O_DIRECT)"
	}
	return r.compare(res, sides{phase: phase, blocks: r.cfg.Blocks, prepare: r.dropCaches,
		mount: r.loadAll(r.mount), direct: r.loadAll(r.store)})
}

// warmLoads loads every block again, with O_DIRECT as the engine does (the
// disk serves it whatever the cache holds) and buffered, from a page cache
// filled first, as an engine whose O_DIRECT probe failed does.
func (r *run) warmLoads(res *Result) error {
	for _, direct := range []bool{true, false} {
		mountTier := &engineio.Tier{Root: r.mount.Root, Direct: direct}
		storeTier := &engineio.Tier{Root: r.store.Root, Direct: direct}
		prepare := func() error { return nil }
		phase := "load, warm cache (O_DIRECT)"
		if !direct {
			// O_DIRECT phases leave the page cache empty: fill it first, so
			// that neither side pays the disk for the other.
			phase = "load, warm cache (buffered)"
			prepare = func() error {
				if _, err := r.loadAll(storeTier)(0, r.cfg.Blocks); err != nil {
					return fmt.Errorf("warming the page cache: %w", err)
				}
				return nil
			}
		}
		if err := r.compare(res, sides{phase: phase, blocks: r.cfg.Blocks, prepare: prepare,
			mount: r.loadAll(mountTier), direct: r.loadAll(storeTier)}); err != nil {
			return err
		}
	}
	return nil
}

// Lookup classes, in the order the engine meets them in one batch: the
// stored chain, then the rest of the prompt, whose blocks were never stored.
const (
	lookupPresent      = "present"
	lookupAbsentInDir  = "absent, directory exists"
	lookupAbsentNoDirs = "absent, directory absent"
)

// lookupKey is one key of the lookup phase and the class it measures.
type lookupKey struct {
	hash, class string
}

// lookupChain is the engine's lookup batch (vLLM's C batch lookup: one
// faccessat per key, in prefix order): the stored blocks first, then the
// absent rest of the prompt, half of it in leaf directories that stored
// blocks made and half in directories nothing made. Most of a long prompt's
// absent keys are of the first kind once the store holds many blocks.
func (r *run) lookupChain() []lookupKey {
	chain := make([]lookupKey, 0, r.cfg.LookupKeys)
	leaves := make(map[string]bool, r.cfg.Blocks)
	for i := 0; i < r.cfg.Blocks; i++ {
		h := key(i)
		leaves[h[:5]] = true
		chain = append(chain, lookupKey{h, lookupPresent})
	}
	absent := r.cfg.LookupKeys - r.cfg.Blocks
	for j := 0; j < absent/2; j++ {
		// The leaf of stored block j%Blocks with another name in it.
		chain = append(chain, lookupKey{key(j % r.cfg.Blocks)[:5] + key(-1 - j)[5:], lookupAbsentInDir})
	}
	for i := r.cfg.Blocks; len(chain) < r.cfg.LookupKeys; i++ {
		if h := key(i); !leaves[h[:5]] {
			chain = append(chain, lookupKey{h, lookupAbsentNoDirs})
		}
	}
	return chain
}

// lookups replays the engine's lookup batch on one thread, twice on each
// side: first touch after the kernel dropped its caches, then the repeat.
// Each side drops and repeats before the other side's drop: a drop empties
// every filesystem's dentries, the mount's included, so a repeat after the
// other side's drop would be a first touch again. Each class of key is timed
// apart, since they cost the mount and the bare directory differently.
func (r *run) lookups(res *Result) error {
	chain := r.lookupChain()
	lookupAll := func(tier *engineio.Tier) (map[string]time.Duration, error) {
		took := make(map[string]time.Duration, 3)
		for i, k := range chain {
			start := time.Now()
			got := tier.Exists(tier.BlockPath(tierDir, 0, k.hash))
			took[k.class] += time.Since(start)
			if want := k.class == lookupPresent; got != want {
				return nil, fmt.Errorf("lookup of key %d (%s) on %s: present=%v, want %v", i, k.class, tier.Root, got, want)
			}
		}
		return took, nil
	}
	counts := make(map[string]int, 3)
	for _, k := range chain {
		counts[k.class]++
	}
	passes := []string{"first", "repeat"}
	var took [2][2]map[string]time.Duration // by pass, then side
	// The most of a few looks: a reader between two requests is not in read(2).
	readers := 0
	for range 10 {
		n, err := daemon.FuseReaders(r.daemonPid)
		if err != nil {
			return err
		}
		readers = max(readers, n)
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Fprintf(r.cfg.Progress, "lookups: the daemon has %d idle FUSE readers\n", readers)
	for side, tier := range []*engineio.Tier{r.mount, r.store} {
		if err := r.dropCaches(); err != nil {
			return err
		}
		for pass := range passes {
			t, err := lookupAll(tier)
			if err != nil {
				return err
			}
			took[pass][side] = t
		}
	}
	for pass, name := range passes {
		for _, class := range []string{lookupPresent, lookupAbsentInDir, lookupAbsentNoDirs} {
			if counts[class] == 0 {
				continue
			}
			perKey := func(d time.Duration) float64 { return d.Seconds() * 1e6 / float64(counts[class]) }
			m, d := perKey(took[pass][0][class]), perKey(took[pass][1][class])
			r.report(res, Measurement{Phase: "lookup, " + name + ", " + class, Unit: "µs/key", Mount: m, Direct: d, Ratio: d / m})
		}
	}
	if n := counts[lookupAbsentInDir]; n > 0 {
		return r.lookupFloor(res, n, took[0][1][lookupAbsentInDir].Seconds()*1e6/float64(n))
	}
	return nil
}

// verify loads every block through the mount once more and compares it in full.
func (r *run) verify(res *Result) error {
	for i := 0; i < r.cfg.Blocks; i++ {
		got := r.loadRow(0)
		if err := r.mount.Load(r.mount.BlockPath(tierDir, 0, key(i)), got); err != nil {
			return err
		}
		if !bytes.Equal(got, r.sourceRow(i)) {
			return fmt.Errorf("block %d differs from what was stored", i)
		}
		res.VerifiedLoads++
	}
	return nil
}
