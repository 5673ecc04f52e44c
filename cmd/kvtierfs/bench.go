//go:build bench

package main

// The benchmark build (-tags bench, `make build` writes it as BIN-bench):
// the whole command plus `kvtierfs bench`, which links the engine model,
// the disk benchmark and the daemon harness of integration/. The daemon
// build execs it (bench_exec.go); its mounts run the benchmark build
// itself, whose daemon is the same code.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/pflag"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
	"github.com/kvtierfs/kvtierfs/integration/diskbench"
	"github.com/kvtierfs/kvtierfs/integration/engine"
)

// scenarioDisk and scenarioChain are the raw disk-tier and wave-staging
// benchmarks of package diskbench.
const (
	scenarioDisk  = "disk"
	scenarioChain = "chain"
)

// benchLinked is true in the benchmark build, where runBench is the bench.
const benchLinked = true

// benchScenarios lists every scenario of `kvtierfs bench`.
var benchScenarios = append(engine.Scenarios(), scenarioDisk, scenarioChain)

// rawScenario reports whether a scenario drives the I/O directly rather than through the engine model.
func rawScenario(name string) bool { return name == scenarioDisk || name == scenarioChain }

// intFlag is an integer flag of the engine model that overrides a field of
// the scenario's default configuration when given.
type intFlag struct {
	name, usage string
	field       func(c *engine.Config) *int
	scenarios   []string // the scenarios it applies to; nil means all engine scenarios
	value       *int
}

// benchFlags is the parsed command line of `kvtierfs bench`.
type benchFlags struct {
	fl                       *pflag.FlagSet
	scenario, engines, syncs string
	stagings, budgets        string
	atOnce                   bool
	stepGap                  time.Duration
	rowBytes, groups, kv     string
	hashSeed, model, gpuKind string
	gpuDevices, replicatedKV string
	capacity, dir, profile   string
	asJSON, dropCaches       bool
	halfZero, netns          bool
	stagingBytes             string
	passthroughMinRow        string
	rounds                   int
	threads, blocks, lookups int
	ints                     []intFlag
}

func newBenchFlags() *benchFlags {
	b := &benchFlags{fl: newFlagSet("bench")}
	fl := b.fl
	fl.StringVar(&b.scenario, "scenario", "", "scenario: "+strings.Join(benchScenarios, ", ")+" (or as the first argument)")
	fl.StringVar(&b.engines, "engine", "", "engine behaviours to run, comma-separated: stock, upstream, fixed (default stock,fixed; multinode: fixed)")
	fl.StringVar(&b.syncs, "sync", "", "row mirroring between the nodes, comma-separated: off, on (default off; multinode: off,on; agent: on)")
	fl.StringVar(&b.rowBytes, "row-bytes", "", fmt.Sprintf("row and block size, a multiple of the page size (%d here; default 256KiB; disk: 8MiB; the field's row is %d)", os.Getpagesize(), engine.FieldRowBytes))
	b.ints = []intFlag{
		{name: "rows", usage: "rows of each node's primary (shm) region (eagle 64, multinode 128, long-prefix and agent 124)", field: func(c *engine.Config) *int { return &c.Rows }},
		{name: "tokens-per-chunk", usage: "tokens per chunk, i.e. per key (default 2048)", field: func(c *engine.Config) *int { return &c.TokensPerChunk }},
		{name: "world-size", usage: "TP world size, spread evenly over the nodes (default --nodes when that is given: one GPU per node; else multinode and agent 2, else 1)", field: func(c *engine.Config) *int { return &c.WorldSize }},
		{name: "nodes", usage: "nodes: 1 to 4, each a kvtierfs daemon, mount, store and shm region; with --sync on every node gets the same peer list (multinode and agent 2, else 1)", field: func(c *engine.Config) *int { return &c.Nodes }},
		{name: "requests", usage: "prompts (eagle 4, long-prefix 1) or agent requests (40)", field: func(c *engine.Config) *int { return &c.Requests },
			scenarios: []string{engine.ScenarioEagle, engine.ScenarioLongPrefix, engine.ScenarioAgent}},
		{name: "prompt-tokens", usage: "prompt length (eagle 100400, long-prefix 348000)", field: func(c *engine.Config) *int { return &c.PromptTokens },
			scenarios: []string{engine.ScenarioEagle, engine.ScenarioLongPrefix}},
		{name: "promote", usage: "rows each multinode prompt promotes (112)", field: func(c *engine.Config) *int { return &c.Promote },
			scenarios: []string{engine.ScenarioMultinode}},
		{name: "prompts", usage: "distinct multinode prompts, stored and then asked again one after another, measured (4)", field: func(c *engine.Config) *int { return &c.Prompts },
			scenarios: []string{engine.ScenarioMultinode}},
		{name: "sessions", usage: "agent sessions taking turns (4)", field: func(c *engine.Config) *int { return &c.Sessions },
			scenarios: []string{engine.ScenarioAgent}},
		{name: "prefix-min", usage: "agent prompt length of a session's first turn (240000)", field: func(c *engine.Config) *int { return &c.PrefixMin },
			scenarios: []string{engine.ScenarioAgent}},
		{name: "prefix-max", usage: "agent prompt length of a session's last turn (350000)", field: func(c *engine.Config) *int { return &c.PrefixMax },
			scenarios: []string{engine.ScenarioAgent}},
		{name: "shared-prefix", usage: "agent tokens every session starts with (160000)", field: func(c *engine.Config) *int { return &c.SharedPrefix },
			scenarios: []string{engine.ScenarioAgent}},
	}
	for i := range b.ints {
		b.ints[i].value = fl.Int(b.ints[i].name, 0, b.ints[i].usage)
	}
	fl.StringVar(&b.stagings, "staging", "on", "the mounts' wave staging, comma-separated: off, on (engine scenarios; disk: one of them)")
	fl.StringVar(&b.budgets, "lookup-budget", "auto", "the mounts' --lookup-budget, comma-separated: auto, off (engine scenarios)")
	fl.BoolVar(&b.atOnce, "at-once", false, "eagle, long-prefix: the measured cold requests arrive together (their lookups share the scheduler's steps)")
	fl.DurationVar(&b.stepGap, "step-gap", 0, "time the fixed engine computes between waves of one lookup, after a wave reached the GPUs (e.g. 200ms)")
	fl.IntVar(&b.threads, "threads", engine.DefaultIOThreads, "tier I/O threads for stores and for loads")
	fl.StringVar(&b.kv, "kv", engine.KVMLA, "KV layout across ranks: mla (replicated) or gqa (per rank)")
	fl.StringVar(&b.groups, "groups", "", "KV cache groups: full, sliding:TAIL:ACC, eagle:TAIL:ACC, comma-separated (eagle: full,eagle:2:8; multinode: full; else full,sliding:1:1)")
	fl.StringVar(&b.hashSeed, "hash-seed", "0", "hash seed mixed into every chunk key (the PYTHONHASHSEED analogue)")
	fl.StringVar(&b.model, "model", "DeepSeek-V4-Flash", "model name of the tier directories <model>_<digest12>_r0")
	fl.StringVar(&b.gpuKind, "gpu", "auto", "CPU→GPU load stage: auto, cuda or host")
	fl.StringVar(&b.gpuDevices, "gpu-devices", "0", "CUDA devices, comma-separated; rank r uses device r mod their count")
	fl.BoolVar(&b.netns, "netns", false, "put each node's daemon in a network namespace of its own, the nodes on one bridge, so that mirrored rows cross veth links (root, iproute2)")
	fl.StringVar(&b.replicatedKV, "replicated-kv", "auto", "passed to the mounts with --sync on: auto, on or off")
	fl.StringVar(&b.capacity, "capacity", "", "store capacity passed to the mounts (default theirs)")
	fl.StringVar(&b.profile, "profile", "", "engine scenarios: write a CPU profile of every node's daemon and of the bench during the measured requests, and the CPU they and the machine used, to this directory (not with --netns; with --rounds, to its subdirectory roundN for round N; with more than one engine, staging or lookup budget, to a subdirectory ENGINE-staging-S-budget-B for each)")
	fl.StringVar(&b.dir, "dir", "", "directory for the run's stores and mountpoints (default $TMPDIR or /tmp)")
	fl.IntVar(&b.blocks, "blocks", diskbench.DefaultConfig().Blocks, "disk: blocks stored and loaded on each side; chain: the chain's length (default 222)")
	fl.IntVar(&b.lookups, "lookups", diskbench.DefaultConfig().LookupKeys, "disk: keys looked up (the stored ones present, the rest absent); chain: keys matched")
	fl.BoolVar(&b.dropCaches, "drop-caches", diskbench.DefaultConfig().DropCaches, "disk, chain: empty the whole machine's page cache before each cold phase, for cold loads that read the disk (root only; off by default, as it slows every other process of the machine)")
	fl.BoolVar(&b.halfZero, "half-zero", false, "chain: rows whose second half is zero (the other node's slot)")
	fl.StringVar(&b.passthroughMinRow, "passthrough-min-row", "", "disk: the mount's --passthrough-min-row (default the mount's), e.g. 0 to pass every row through, 1TiB to write every row through the daemon")
	fl.StringVar(&b.stagingBytes, "staging-bytes", "1GiB", "chain: staging budget of the staging-on mount")
	fl.IntVar(&b.rounds, "rounds", 0, fmt.Sprintf("chain: rounds of the three load phases, each round in a rotated order (default %d); disk: rounds that alternate the mount and the bare directory in the store phase (default %d, at most --blocks); "+
		"multinode: rounds of a run with --sync off and one with on, fresh daemons each, which goes first alternating, printed with each round's on ÷ off, their median and each side's range (default 1; given, --json prints an object of the runs and the rounds)",
		diskbench.DefaultChainConfig().Rounds, diskbench.DefaultConfig().Rounds))
	fl.BoolVar(&b.asJSON, "json", false, "print the results as JSON (an array of runs; disk: one object) instead of a table")
	return b
}

// diskOnlyFlags and engineOnlyFlags are the flags that apply to one side only.
var (
	diskOnlyFlags   = []string{"blocks", "lookups", "drop-caches", "half-zero", "staging-bytes", "rounds", "passthrough-min-row"}
	engineOnlyFlags = []string{"engine", "sync", "staging", "lookup-budget", "at-once", "step-gap", "kv", "groups", "hash-seed", "model", "gpu", "gpu-devices", "replicated-kv", "capacity", "netns", "profile"}
)

func runBench(args []string) error {
	b := newBenchFlags()
	if err := parseFlags(b.fl, args); err != nil {
		return err
	}
	scenario, err := b.scenarioName()
	if err != nil {
		return usageError{err}
	}
	if err := b.checkApplicable(scenario); err != nil {
		return usageError{err}
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	// A closed output (`kvtierfs bench … | head`) interrupts the run like
	// Ctrl-C: unhandled, SIGPIPE would end the process before it unmounted
	// and removed what it created.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGPIPE)
	defer stop()
	switch scenario {
	case scenarioDisk:
		return b.runDisk(ctx, exe)
	case scenarioChain:
		return b.runChain(exe)
	}
	return b.runEngine(ctx, scenario, exe)
}

// scenarioName takes the scenario from the first argument or --scenario.
func (b *benchFlags) scenarioName() (string, error) {
	name := b.scenario
	switch {
	case b.fl.NArg() > 1:
		return "", fmt.Errorf("expected one SCENARIO, got %d arguments: %s", b.fl.NArg(), strings.Join(b.fl.Args(), " "))
	case b.fl.NArg() == 1 && name != "" && name != b.fl.Arg(0):
		return "", fmt.Errorf("scenario given twice: %q and --scenario %q", b.fl.Arg(0), name)
	case b.fl.NArg() == 1:
		name = b.fl.Arg(0)
	case name == "":
		return "", fmt.Errorf("--scenario: missing; want one of %s", strings.Join(benchScenarios, ", "))
	}
	if !slices.Contains(benchScenarios, name) {
		return "", fmt.Errorf("--scenario %q: want one of %s", name, strings.Join(benchScenarios, ", "))
	}
	return name, nil
}

// checkApplicable refuses flags the scenario does not use.
func (b *benchFlags) checkApplicable(scenario string) error {
	var refused []string
	switch {
	case scenario == scenarioDisk:
		refused = []string{"half-zero", "staging-bytes"}
		for _, f := range engineOnlyFlags {
			if f != "staging" {
				refused = append(refused, f)
			}
		}
	case rawScenario(scenario):
		refused = engineOnlyFlags
	default:
		for _, f := range diskOnlyFlags {
			if f != "rounds" || scenario != engine.ScenarioMultinode {
				refused = append(refused, f)
			}
		}
	}
	for _, f := range b.ints {
		applies := slices.Contains(f.scenarios, scenario) || f.scenarios == nil && !rawScenario(scenario)
		if !applies {
			refused = append(refused, f.name)
		}
	}
	for _, name := range refused {
		if b.fl.Changed(name) {
			return fmt.Errorf("--%s does not apply to scenario %s", name, scenario)
		}
	}
	return nil
}

// engineConfig is the scenario's default configuration with the flags given.
func (b *benchFlags) engineConfig(scenario, exe string) (engine.Config, error) {
	cfg, err := engine.DefaultConfig(scenario)
	if err != nil {
		return cfg, err
	}
	for _, f := range b.ints {
		if b.fl.Changed(f.name) {
			*f.field(&cfg) = *f.value
		}
	}
	if b.fl.Changed("nodes") && !b.fl.Changed("world-size") {
		cfg.WorldSize = cfg.Nodes // one GPU per node, as in the field
	}
	if b.fl.Changed("row-bytes") {
		n, err := parseSize("row-bytes", b.rowBytes)
		if err != nil {
			return cfg, err
		}
		cfg.RowBytes = int(n)
	}
	if b.fl.Changed("groups") {
		if cfg.Groups, err = engine.ParseGroups(b.groups); err != nil {
			return cfg, err
		}
	}
	if cfg.GPUDevices, err = parseInts("gpu-devices", b.gpuDevices); err != nil {
		return cfg, err
	}
	cfg.IOThreads, cfg.KV, cfg.HashSeed, cfg.Model, cfg.GPU = b.threads, b.kv, b.hashSeed, b.model, b.gpuKind
	cfg.AtOnce = b.atOnce
	cfg.ReplicatedKV, cfg.Capacity, cfg.Dir, cfg.StepGap, cfg.Netns = b.replicatedKV, b.capacity, b.dir, b.stepGap, b.netns
	cfg.Profile = b.profile
	cfg.Binary, cfg.RegionID, cfg.Progress = exe, fmt.Sprintf("kvtierbench_%d", os.Getpid()), os.Stderr
	return cfg, nil
}

// runEngine runs the scenario once per engine and sync setting, and prints
// the results side by side.
func (b *benchFlags) runEngine(ctx context.Context, scenario, exe string) error {
	cfg, err := b.engineConfig(scenario, exe)
	if err != nil {
		return usageError{err}
	}
	engines, err := b.engineList(scenario)
	if err != nil {
		return usageError{err}
	}
	syncs, err := b.syncList(scenario, cfg, exe)
	if err != nil {
		return usageError{err}
	}
	stagings, err := parseOnOff("staging", b.stagings)
	if err != nil {
		return usageError{err}
	}
	budgets, err := parseBudgets(b.budgets)
	if err != nil {
		return usageError{err}
	}
	rounds, err := b.roundCount(syncs)
	if err != nil {
		return usageError{err}
	}
	plan := engine.PlanRuns(rounds, engines, syncs, stagings, budgets)
	for _, run := range plan { // every setting checked before the first run starts
		cfg.Engine, cfg.Sync, cfg.Staging, cfg.LookupBudget = run.Engine, run.Sync, run.Staging, run.Budget
		if err := cfg.Validate(); err != nil {
			return usageError{err}
		}
	}
	var results []engine.Result
	for _, run := range plan {
		cfg.Engine, cfg.Sync, cfg.Staging, cfg.LookupBudget = run.Engine, run.Sync, run.Staging, run.Budget
		if run.Round > 0 {
			fmt.Fprintf(os.Stderr, "kvtierfs bench: round %d of %d, --sync %s\n", run.Round, rounds, onOff(run.Sync))
		}
		if b.profile != "" {
			cfg.Profile = profileDir(b.profile, run, len(engines)*len(stagings)*len(budgets))
		}
		res, err := engine.Run(ctx, cfg)
		if ctx.Err() != nil {
			return fmt.Errorf("interrupted; everything the run started was stopped and removed (%v)", err)
		}
		if err != nil {
			return fmt.Errorf("%s, %s--engine %s, --sync %s, --staging %s, --lookup-budget %s: %w",
				scenario, roundPrefix(run.Round), run.Engine, onOff(run.Sync), onOff(run.Staging), res.LookupBudget, err)
		}
		res.Round = run.Round
		results = append(results, res)
	}
	// The rounds' checks are multinode's (rows identical at every rank with
	// mirroring, stale without): other scenarios' sync runs are not rounds.
	var mirroring []engine.MirrorSummary
	if scenario == engine.ScenarioMultinode {
		mirroring = engine.SummarizeMirroring(results)
	}
	if b.asJSON {
		if rounds > 0 {
			return writeJSON(os.Stdout, benchRounds{Runs: results, Mirroring: mirroring})
		}
		return writeJSON(os.Stdout, results)
	}
	engine.WriteLegend(os.Stdout, results)
	if err := engine.WriteTable(os.Stdout, results); err != nil {
		return err
	}
	engine.WriteStagingRatios(os.Stdout, results)
	engine.WriteMirroring(os.Stdout, mirroring)
	// The last run's mount only: the others' are columns of the table.
	last := results[len(results)-1]
	var st ctlabi.Stats
	if err := json.Unmarshal(last.Stats, &st); err != nil {
		return fmt.Errorf("decoding the mount's stats: %w", err)
	}
	fmt.Printf("\nkvtierfs stat of the head node's mount at the end of the %s engine, %ssync %s, lookup budget %s run:\n", last.Engine, roundPrefix(last.Round), last.Sync, last.LookupBudget)
	printStats(os.Stdout, st)
	fmt.Println()
	engine.WriteVerdict(os.Stdout, results)
	return nil
}

// benchRounds is the JSON of an engine run with --rounds: every run, and
// each setting's rounds of mirroring on ÷ off.
type benchRounds struct {
	Runs      []engine.Result        `json:"runs"`
	Mirroring []engine.MirrorSummary `json:"mirroring"`
}

// roundCount is --rounds of an engine scenario: 0 without the flag (one
// run of each setting), else at least 1, with both sync settings to pair.
func (b *benchFlags) roundCount(syncs []bool) (int, error) {
	if !b.fl.Changed("rounds") {
		return 0, nil
	}
	if b.rounds < 1 {
		return 0, fmt.Errorf("--rounds %d: want at least 1", b.rounds)
	}
	if !slices.Contains(syncs, false) || !slices.Contains(syncs, true) || len(syncs) != 2 {
		return 0, fmt.Errorf("--rounds pairs a run with --sync off and one with on: want --sync off,on (the default with --nodes 2 or more)")
	}
	return b.rounds, nil
}

// roundPrefix names a run's round in a message, if it has one.
// profileDir is where a run's profiles go under --profile DIR: DIR/roundN
// for round N, and below that a directory naming the engine, staging and
// lookup budget when the plan runs more than one of those settings, so that
// no run's files (named by the sync setting alone) overwrite another's.
func profileDir(dir string, run engine.PlannedRun, settings int) string {
	if run.Round > 0 {
		dir = filepath.Join(dir, fmt.Sprintf("round%d", run.Round))
	}
	if settings > 1 {
		budget := "off"
		if run.Budget {
			budget = "auto"
		}
		dir = filepath.Join(dir, fmt.Sprintf("%s-staging-%s-budget-%s", run.Engine, onOff(run.Staging), budget))
	}
	return dir
}

func roundPrefix(round int) string {
	if round == 0 {
		return ""
	}
	return fmt.Sprintf("round %d, ", round)
}

// engineList parses --engine.
func (b *benchFlags) engineList(scenario string) ([]string, error) {
	if !b.fl.Changed("engine") {
		if scenario == engine.ScenarioMultinode {
			return []string{engine.EngineFixed}, nil
		}
		return []string{engine.EngineStock, engine.EngineFixed}, nil
	}
	var engines []string
	for _, name := range strings.Split(b.engines, ",") {
		name = strings.TrimSpace(name)
		if !slices.Contains(engine.Engines(), name) {
			return nil, fmt.Errorf("--engine %q: want %s, comma-separated", b.engines, strings.Join(engine.Engines(), ", "))
		}
		engines = append(engines, name)
	}
	return engines, nil
}

// parseBudgets parses --lookup-budget: a comma-separated list of auto and
// off, true for auto.
func parseBudgets(value string) ([]bool, error) {
	var out []bool
	for _, name := range strings.Split(value, ",") {
		switch strings.TrimSpace(name) {
		case "auto":
			out = append(out, true)
		case "off":
			out = append(out, false)
		default:
			return nil, fmt.Errorf("--lookup-budget %q: want auto, off or both comma-separated", value)
		}
	}
	return out, nil
}

// parseOnOff parses a comma-separated list of off and on.
func parseOnOff(flag, value string) ([]bool, error) {
	var out []bool
	for _, name := range strings.Split(value, ",") {
		switch strings.TrimSpace(name) {
		case "off":
			out = append(out, false)
		case "on":
			out = append(out, true)
		default:
			return nil, fmt.Errorf("--%s %q: want off, on or both comma-separated", flag, value)
		}
	}
	return out, nil
}

// syncList parses --sync. Without the flag, a default that includes "on" falls
// back to "off" with a note when the binary cannot mirror rows yet.
func (b *benchFlags) syncList(scenario string, cfg engine.Config, exe string) ([]bool, error) {
	if b.fl.Changed("sync") {
		return parseOnOff("sync", b.syncs)
	}
	syncs := []bool{false}
	switch {
	case cfg.Nodes == 1:
	case scenario == engine.ScenarioMultinode:
		syncs = []bool{false, true}
	case scenario == engine.ScenarioAgent:
		syncs = []bool{true}
	}
	if !slices.Contains(syncs, true) {
		return syncs, nil
	}
	if err := engine.CheckSync(exe); err != nil {
		fmt.Fprintf(os.Stderr, "kvtierfs bench: %v: running with --sync off only\n", errors.Unwrap(err))
		return []bool{false}, nil
	}
	return syncs, nil
}

// runDisk runs the raw disk-tier benchmark of package diskbench.
// diskbench has no cancellation: an interrupt lets the run finish and clean up.
func (b *benchFlags) runDisk(ctx context.Context, exe string) error {
	cfg := diskbench.DefaultConfig()
	cfg.Binary, cfg.Dir, cfg.Progress = exe, b.dir, os.Stderr
	if cfg.Dir == "" {
		cfg.Dir = os.TempDir()
	}
	cfg.Threads, cfg.Blocks, cfg.LookupKeys, cfg.DropCaches = b.threads, b.blocks, b.lookups, b.dropCaches
	cfg.PassthroughMinRow = b.passthroughMinRow
	cfg.Rounds = min(cfg.Rounds, cfg.Blocks)
	if b.fl.Changed("rounds") {
		cfg.Rounds = b.rounds
	}
	switch b.stagings {
	case "on":
	case "off":
		cfg.StagingOff = true
	default:
		return usageError{fmt.Errorf("--staging %q: disk takes one of on, off", b.stagings)}
	}
	if err := b.rowBytesInto(&cfg.RowBytes); err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return usageError{err}
	}
	finished := make(chan struct{})
	defer close(finished)
	go func() {
		select {
		case <-ctx.Done():
			fmt.Fprintln(os.Stderr, "kvtierfs bench: interrupted: the disk benchmark finishes its run, then removes everything it created")
		case <-finished:
		}
	}()
	res, err := diskbench.Run(cfg)
	if ctx.Err() != nil {
		return fmt.Errorf("interrupted (%v)", err)
	}
	if err != nil {
		return err
	}
	if b.asJSON {
		return writeJSON(os.Stdout, res)
	}
	fmt.Printf("disk: %d blocks of %d B, %d threads, %d lookups, cold cache %v, %d loads verified\n",
		res.Blocks, res.RowBytes, res.Threads, res.LookupKeys, res.ColdCache, res.VerifiedLoads)
	t := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(t, "phase\tunit\tmount\tdirect\tratio\tdaemon CPU s/GB\t")
	for _, m := range res.Measurements {
		fmt.Fprintf(t, "%s\t%s\t%.3f\t%.3f\t%.3f\t%.3f\t\n", m.Phase, m.Unit, m.Mount, m.Direct, m.Ratio, m.DaemonCPUPerGB)
	}
	return t.Flush()
}

// runChain runs the wave-staging benchmark of package diskbench.
func (b *benchFlags) runChain(exe string) error {
	cfg := diskbench.DefaultChainConfig()
	cfg.Binary, cfg.Dir, cfg.Progress = exe, b.dir, os.Stderr
	if cfg.Dir == "" {
		cfg.Dir = os.TempDir()
	}
	cfg.Threads, cfg.DropCaches, cfg.HalfZero = b.threads, b.dropCaches, b.halfZero
	if b.fl.Changed("blocks") {
		cfg.Blocks = b.blocks
	}
	if b.fl.Changed("lookups") {
		cfg.MatchKeys = b.lookups
	}
	if b.fl.Changed("rounds") {
		cfg.Rounds = b.rounds
	}
	var err error
	if cfg.StagingBytes, err = parseSize("staging-bytes", b.stagingBytes); err != nil {
		return usageError{err}
	}
	if err := b.rowBytesInto(&cfg.RowBytes); err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return usageError{err}
	}
	res, err := diskbench.RunChain(cfg)
	if err != nil {
		return err
	}
	if b.asJSON {
		return writeJSON(os.Stdout, res)
	}
	fmt.Printf("chain: %d blocks of %d B looked up in order, then loaded by %d threads, %d rounds; half-zero rows %v, cold cache %v, %d loads verified\n",
		res.Blocks, res.RowBytes, res.Threads, res.Rounds, res.HalfZero, res.ColdCache, res.VerifiedLoads)
	t := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(t, "measure\tvalue\tbaseline\tratio\t")
	fmt.Fprintf(t, "loads, staging on (GB/s) vs direct\t%.3f\t%.3f\t%.2f\t\n", res.StagingOn, res.Direct, res.StagingOn/res.Direct)
	fmt.Fprintf(t, "loads, staging off (GB/s) vs direct\t%.3f\t%.3f\t%.2f\t\n", res.StagingOff, res.Direct, res.StagingOff/res.Direct)
	fmt.Fprintf(t, "staged load (ms) vs memcpy of a row\t%.3f\t%.3f\t%.2f\t\n", res.StagedLoadMillis, res.MemcpyMillis, res.StagedLoadMillis/res.MemcpyMillis)
	fmt.Fprintf(t, "match of %d keys (ms) vs faccessat each\t%.3f\t%.3f\t%.1f\t\n", res.MatchKeys, res.MatchMillis, res.FaccessatMillis, res.FaccessatMillis/res.MatchMillis)
	fmt.Fprintf(t, "loads served from staging\t%d\t%d\t\t\n", res.StagingHits, res.Rounds*res.Blocks)
	fmt.Fprintf(t, "bytes staged, never loaded\t%d\t\t\t\n", res.StagingWastedBytes)
	if err := t.Flush(); err != nil {
		return err
	}
	ratios := make([]string, len(res.StagingOnRatios))
	for i, r := range res.StagingOnRatios {
		ratios[i] = fmt.Sprintf("%.2f", r)
	}
	fmt.Printf("staging on vs direct, round by round: %s\n", strings.Join(ratios, " "))
	return nil
}

// rowBytesInto sets *rowBytes from --row-bytes when it was given.
func (b *benchFlags) rowBytesInto(rowBytes *int) error {
	if !b.fl.Changed("row-bytes") {
		return nil
	}
	n, err := parseSize("row-bytes", b.rowBytes)
	if err != nil {
		return usageError{err}
	}
	*rowBytes = int(n)
	return nil
}

// parseInts parses a comma-separated list of non-negative integers.
func parseInts(flag, s string) ([]int, error) {
	var out []int
	for _, item := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(item))
		if err != nil || n < 0 {
			return nil, fmt.Errorf("--%s %q: want non-negative integers, comma-separated", flag, s)
		}
		out = append(out, n)
	}
	return out, nil
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
