package diskbench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
	"github.com/kvtierfs/kvtierfs/integration/daemon"
	"github.com/kvtierfs/kvtierfs/integration/engineio"
	"github.com/kvtierfs/kvtierfs/staging"
)

// ChainConfig sizes the wave-staging benchmark (`kvtierfs bench chain`): a
// chain of blocks looked up in prefix order, then loaded in order by the
// engine's threads, with staging off, with staging on, and straight from a
// directory the engine wrote itself.
type ChainConfig struct {
	// Binary is the kvtierfs executable.
	Binary string
	// Dir is a work directory on the disk under test; it is emptied at the end.
	Dir string
	// RowBytes is the size of one block.
	RowBytes int
	// Blocks is the chain's length.
	Blocks int
	// Threads is the engine's load thread count.
	Threads int
	// HalfZero makes the second half of every row zero, as the other
	// node's slot is on a two-node group.
	HalfZero bool
	// StagingBytes is the staging budget of the staging-on mount.
	StagingBytes int64
	// MatchKeys is the key count of the batched-match comparison.
	MatchKeys int
	// DropCaches empties the page cache before each cold phase (root only).
	DropCaches bool
	// Rounds is how many times the three load phases run, each round in a
	// rotated order, so that a disk whose speed drifts during the run
	// weighs on every phase alike.
	Rounds int
	// Progress receives one line per phase; nil discards them.
	Progress io.Writer
}

// DefaultChainConfig is issue 4's benchmark: 222 rows of 8 MiB, 16 threads,
// a 1 GiB budget, 12,434 keys matched.
func DefaultChainConfig() ChainConfig {
	return ChainConfig{RowBytes: 8 << 20, Blocks: 222, Threads: 16, StagingBytes: 1 << 30, MatchKeys: 12434, Rounds: 5}
}

// Validate checks a configuration, naming the offending flag.
func (c ChainConfig) Validate() error {
	d := Config{Binary: c.Binary, Dir: c.Dir, RowBytes: c.RowBytes, Blocks: c.Blocks, Threads: c.Threads, LookupKeys: c.MatchKeys, Rounds: 1}
	if err := d.Validate(); err != nil {
		return err
	}
	if c.Rounds < 1 {
		return fmt.Errorf("--rounds %d: want at least 1", c.Rounds)
	}
	if c.StagingBytes < int64(c.RowBytes) {
		return fmt.Errorf("--staging-bytes %d: want at least one row (%d bytes)", c.StagingBytes, c.RowBytes)
	}
	return nil
}

// ChainResult is a whole chain run. Throughputs are GB/s of rows loaded,
// over all rounds of a phase.
type ChainResult struct {
	RowBytes   int     `json:"row_bytes"`
	Blocks     int     `json:"blocks"`
	Threads    int     `json:"threads"`
	HalfZero   bool    `json:"half_zero"`
	ColdCache  bool    `json:"cold_cache"`
	Rounds     int     `json:"rounds"`
	StagingOff float64 `json:"staging_off_gbps"`
	StagingOn  float64 `json:"staging_on_gbps"`
	Direct     float64 `json:"direct_gbps"`
	// StagingOnRatios is each round's staging-on ÷ direct throughput.
	StagingOnRatios []float64 `json:"staging_on_ratios"`
	// StagingHits counts loads of the staging-on phases served from memory;
	// StagingWastedBytes the bytes they fetched that no load used.
	StagingHits        int64 `json:"staging_hits"`
	StagingWastedBytes int64 `json:"staging_wasted_bytes"`
	// StagedLoadMillis is the median load of a staged block; MemcpyMillis
	// the median copy of a row in memory.
	StagedLoadMillis float64 `json:"staged_load_ms"`
	MemcpyMillis     float64 `json:"memcpy_ms"`
	// MatchMillis is one batched match of MatchKeys keys through .kvtier/match;
	// FaccessatMillis the same keys checked one faccessat at a time.
	MatchKeys       int     `json:"match_keys"`
	MatchMillis     float64 `json:"match_ms"`
	FaccessatMillis float64 `json:"faccessat_ms"`
	VerifiedLoads   int     `json:"verified_loads"`
}

// chainRun holds the state of one chain run.
type chainRun struct {
	cfg    ChainConfig
	region *engineio.Region
	work   string
	store  string
}

// RunChain performs the chain benchmark. Everything it creates is removed before it returns.
func RunChain(cfg ChainConfig) (ChainResult, error) {
	if err := cfg.Validate(); err != nil {
		return ChainResult{}, err
	}
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	res := ChainResult{RowBytes: cfg.RowBytes, Blocks: cfg.Blocks, Threads: cfg.Threads, HalfZero: cfg.HalfZero,
		ColdCache: cfg.DropCaches, Rounds: cfg.Rounds, MatchKeys: cfg.MatchKeys}
	work, region, cleanup, err := benchSpace(cfg.Dir, "kvtierchain", cfg.Threads, cfg.RowBytes, func(i int, row []byte) {
		engineio.FillPattern(row, uint64(i)+1000)
		if cfg.HalfZero {
			clear(row[len(row)/2:])
		}
	})
	if err != nil {
		return res, err
	}
	defer cleanup()
	r := &chainRun{cfg: cfg, region: region, work: work, store: mkdir(work, "store")}

	if err := r.storeChain(); err != nil {
		return res, err
	}
	var elapsed [phaseCount]time.Duration
	for round := 0; round < cfg.Rounds; round++ {
		var took [phaseCount]time.Duration
		for i := range phaseCount {
			p := (round + i) % phaseCount
			var err error
			if took[p], err = r.runPhase(p, round == 0, &res); err != nil {
				return res, err
			}
			elapsed[p] += took[p]
		}
		res.StagingOnRatios = append(res.StagingOnRatios, took[phaseDirect].Seconds()/took[phaseStagingOn].Seconds())
		fmt.Fprintf(cfg.Progress, "round %d: staging off %.3f GB/s, staging on %.3f GB/s, direct %.3f GB/s\n", round+1,
			r.throughput(took[phaseStagingOff]), r.throughput(took[phaseStagingOn]), r.throughput(took[phaseDirect]))
	}
	res.StagingOff = r.throughput(elapsed[phaseStagingOff] / time.Duration(cfg.Rounds))
	res.StagingOn = r.throughput(elapsed[phaseStagingOn] / time.Duration(cfg.Rounds))
	res.Direct = r.throughput(elapsed[phaseDirect] / time.Duration(cfg.Rounds))
	fmt.Fprintf(cfg.Progress, "chain of %d, %d rounds: staging off %.3f GB/s, staging on %.3f GB/s (%d hits), direct %.3f GB/s\n",
		cfg.Blocks, cfg.Rounds, res.StagingOff, res.StagingOn, res.StagingHits, res.Direct)
	return res, nil
}

// The load phases of a round.
const (
	phaseStagingOff = iota
	phaseStagingOn
	phaseDirect
	phaseCount
)

// runPhase runs load phase p once and returns the time its loads took. The
// first staging-on phase also measures staged loads and the batched match.
func (r *chainRun) runPhase(p int, first bool, res *ChainResult) (time.Duration, error) {
	if p == phaseDirect {
		bare := &engineio.Tier{Root: filepath.Join(r.work, "bare"), Direct: true}
		took, err := r.lookupAndLoad(bare)
		if err != nil {
			return 0, fmt.Errorf("direct loads: %w", err)
		}
		return took, nil
	}
	name, budget := "staging off", int64(0)
	if p == phaseStagingOn {
		name, budget = "staging on", r.cfg.StagingBytes
	}
	d, err := daemon.Start(daemon.Options{Binary: r.cfg.Binary, Mountpoint: filepath.Join(r.work, "mnt"), Store: r.store,
		ShmGlob: r.region.Path, Args: []string{"--staging-bytes", fmt.Sprint(budget), "--lookup-budget", "off"}})
	if err != nil {
		return 0, fmt.Errorf("%s: %w", name, err)
	}
	defer d.Stop()
	tier := &engineio.Tier{Root: d.Mountpoint, Direct: true}
	var took time.Duration
	engineio.OnSignalFreeThread(func() {
		if took, err = r.lookupAndLoad(tier); err != nil || p != phaseStagingOn {
			return
		}
		var st ctlabi.Stats
		if st, err = readStats(d.Mountpoint); err != nil {
			return
		}
		res.StagingHits += st.Staging.Hits
		res.StagingWastedBytes += st.Staging.WastedBytes
		if !first {
			return
		}
		if res.StagedLoadMillis, res.MemcpyMillis, err = r.stagedLoadCost(d, tier); err != nil {
			return
		}
		res.MatchMillis, res.FaccessatMillis, err = r.matchCost(d, tier)
	})
	if err == nil {
		err = r.verify(tier, res)
	}
	if err != nil {
		return 0, fmt.Errorf("%s: %w", name, err)
	}
	return took, nil
}

// storeChain writes the chain through a mount into the store and, as the
// engine itself would (dense rows), into a bare directory for the direct
// side. Each block goes to both in the same pass, in alternating order: the
// disk under a virtual machine serves recently written data faster, and
// writing one side after the other measurably favoured the later one.
func (r *chainRun) storeChain() error {
	d, err := daemon.Start(daemon.Options{Binary: r.cfg.Binary, Mountpoint: filepath.Join(r.work, "mnt"), Store: r.store,
		ShmGlob: r.region.Path, Args: []string{"--lookup-budget", "off"}})
	if err != nil {
		return err
	}
	defer d.Stop()
	tiers := [2]*engineio.Tier{{Root: d.Mountpoint, Direct: true}, {Root: mkdir(r.work, "bare"), Direct: true}}
	_, err = parallel(r.cfg.Threads, r.cfg.Blocks, func(thread, i int) error {
		for j := range tiers {
			tier := tiers[(i+j)%2]
			if _, err := tier.Store(tier.BlockPath(tierDir, 0, key(i)), r.sourceRow(i)); err != nil {
				return fmt.Errorf("storing the chain in %s: %w", tier.Root, err)
			}
		}
		return nil
	})
	if err == nil {
		r.scrambleRows()
	}
	return err
}

// sourceRow is the row block i is stored from, holding block i's bytes: the
// pattern of row i mod sourceRows with digest windows unique to block i (in
// the data half of a half-zero row).
func (r *chainRun) sourceRow(i int) []byte {
	row := r.region.Row(i % sourceRows)
	stamp(row, uint64(i), r.dataBytes())
	return row
}

// dataBytes is the part of a row that holds data (half of a half-zero row).
func (r *chainRun) dataBytes() int {
	if r.cfg.HalfZero {
		return r.cfg.RowBytes / 2
	}
	return r.cfg.RowBytes
}

// scrambleRows leaves no block in the region's rows, as rows the engine
// reused hold, so that every load of the chain reads the disk or staging.
func (r *chainRun) scrambleRows() {
	for i := range sourceRows + r.cfg.Threads {
		stamp(r.region.Row(i), 1<<62+uint64(i), r.dataBytes())
	}
}

// lookupAndLoad looks the chain up in prefix order on one thread, then loads
// it in order on the engine's threads, from a cold cache, and returns the
// time the loads took.
func (r *chainRun) lookupAndLoad(tier *engineio.Tier) (time.Duration, error) {
	r.scrambleRows()
	if err := dropCaches(r.cfg.DropCaches); err != nil {
		return 0, err
	}
	for i := 0; i < r.cfg.Blocks; i++ {
		if !tier.Exists(tier.BlockPath(tierDir, 0, key(i))) {
			return 0, fmt.Errorf("chain block %d absent", i)
		}
	}
	return parallel(r.cfg.Threads, r.cfg.Blocks, func(thread, i int) error {
		return tier.Load(tier.BlockPath(tierDir, 0, key(i)), r.region.Row(sourceRows+thread))
	})
}

// throughput is GB/s of loading the chain once in d.
func (r *chainRun) throughput(d time.Duration) float64 {
	return float64(r.cfg.Blocks) * float64(r.cfg.RowBytes) / d.Seconds() / 1e9
}

// stagedLoadCost stages the end of the chain, waits until it is staged,
// and compares single loads of staged blocks with memory copies of a row
// (medians, each copy from a different row).
func (r *chainRun) stagedLoadCost(d *daemon.Daemon, tier *engineio.Tier) (loadMs, memcpyMs float64, err error) {
	// The chain's last blocks: once they are staged nothing else is fetched,
	// so the loads below measure serving from memory alone.
	samples := min(stagedSamples, sourceRows-1, r.cfg.Blocks-1, int(r.cfg.StagingBytes/int64(r.cfg.RowBytes))-1)
	if samples < 1 {
		return 0, 0, fmt.Errorf("a chain of %d blocks and a budget of %d bytes leave no staged block to measure",
			r.cfg.Blocks, r.cfg.StagingBytes)
	}
	first := r.cfg.Blocks - samples - 1
	r.scrambleRows()                    // no row may hold a block measured here: it would be served from the row
	time.Sleep(staging.DefaultBatchGap) // a new lookup batch
	for i := first; i < r.cfg.Blocks; i++ {
		tier.Exists(tier.BlockPath(tierDir, 0, key(i)))
	}
	dst := r.region.Row(sourceRows)
	if err := tier.Load(tier.BlockPath(tierDir, 0, key(first)), dst); err != nil {
		return 0, 0, err
	}
	// Wait until the wave is staged and no fetch is still landing, so that
	// the loads below measure serving from memory, not waiting for the disk.
	last := int64(-1)
	for start := time.Now(); ; time.Sleep(50 * time.Millisecond) {
		st, err := readStats(d.Mountpoint)
		if err != nil {
			return 0, 0, err
		}
		if st.Staging.Bytes >= int64(samples*r.cfg.RowBytes) && st.Staging.Bytes == last {
			break
		}
		last = st.Staging.Bytes
		if time.Since(start) > 30*time.Second {
			return 0, 0, fmt.Errorf("the chain's end was not staged within 30 s: %+v", st.Staging)
		}
	}
	before, err := readStats(d.Mountpoint)
	if err != nil {
		return 0, 0, err
	}
	loads := make([]time.Duration, 0, samples)
	for i := first + 1; i < r.cfg.Blocks; i++ {
		start := time.Now()
		if err := tier.Load(tier.BlockPath(tierDir, 0, key(i)), dst); err != nil {
			return 0, 0, err
		}
		loads = append(loads, time.Since(start))
	}
	after, err := readStats(d.Mountpoint)
	if err != nil {
		return 0, 0, err
	}
	if hits := after.Staging.Hits - before.Staging.Hits; hits != int64(samples) {
		return 0, 0, fmt.Errorf("%d of %d loads of staged blocks were served from staging", hits, samples)
	}
	copies := make([]time.Duration, 0, samples)
	for i := 1; i <= samples; i++ {
		start := time.Now()
		copy(dst, r.region.Row(i))
		copies = append(copies, time.Since(start))
	}
	return medianMillis(loads), medianMillis(copies), nil
}

// stagedSamples is how many loads of staged blocks stagedLoadCost times.
const stagedSamples = 24

// medianMillis is the median of ds in milliseconds.
func medianMillis(ds []time.Duration) float64 {
	slices.Sort(ds)
	return float64(ds[len(ds)/2]) / float64(time.Millisecond)
}

// matchCost times one batched match of MatchKeys keys (the chain, then
// absent keys) against the same keys checked one faccessat at a time.
func (r *chainRun) matchCost(d *daemon.Daemon, tier *engineio.Tier) (matchMs, faccessMs float64, err error) {
	keys := make([]string, r.cfg.MatchKeys)
	for i := range keys {
		keys[i] = key(i)
	}
	start := time.Now()
	for _, k := range keys {
		tier.Exists(tier.BlockPath(tierDir, 0, k))
	}
	faccessMs = float64(time.Since(start).Microseconds()) / 1000
	req, err := ctlabi.EncodeMatchRequest(ctlabi.MatchRequest{Tier: tierDir,
		Groups: []ctlabi.GroupSpec{{Group: 0, Kind: ctlabi.KindFull, Keys: keys}}})
	if err != nil {
		return 0, 0, err
	}
	start = time.Now()
	f, err := os.OpenFile(filepath.Join(d.Mountpoint, ctlabi.Dir, ctlabi.MatchFile), os.O_RDWR, 0)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	if _, err := f.Write(req); err != nil {
		return 0, 0, err
	}
	answer := make([]byte, 4096)
	n, _ := f.ReadAt(answer, 0)
	matchMs = float64(time.Since(start).Microseconds()) / 1000
	got, err := ctlabi.DecodeMatchResult(answer[:n])
	if err != nil {
		return 0, 0, err
	}
	if got.HitChunks != r.cfg.Blocks {
		return 0, 0, fmt.Errorf("batched match found %d chunks, the chain has %d", got.HitChunks, r.cfg.Blocks)
	}
	return matchMs, faccessMs, nil
}

// verify loads the chain's first blocks through the mount and compares them
// in full with what was stored.
func (r *chainRun) verify(tier *engineio.Tier, res *ChainResult) error {
	got := r.region.Row(sourceRows)
	for i := 0; i < min(r.cfg.Blocks, sourceRows); i++ {
		if err := tier.Load(tier.BlockPath(tierDir, 0, key(i)), got); err != nil {
			return err
		}
		if !bytes.Equal(got, r.sourceRow(i)) {
			return fmt.Errorf("block %d differs from what was stored", i)
		}
		res.VerifiedLoads++
	}
	return nil
}

// readStats reads a mount's stats snapshot.
func readStats(mnt string) (ctlabi.Stats, error) {
	var st ctlabi.Stats
	raw, err := os.ReadFile(filepath.Join(mnt, ctlabi.Dir, ctlabi.StatsFile))
	if err != nil {
		return st, err
	}
	err = json.Unmarshal(raw, &st)
	return st, err
}
