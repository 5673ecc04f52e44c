package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/kvtierfs/kvtierfs/integration/engineio"
)

// Result is what one run measured. The first block of fields is the JSON
// contract of `kvtierfs bench --json`; the rest explains it.
type Result struct {
	// Scenario, Engine and Sync ("on" or "off") identify the run.
	Scenario string `json:"scenario"`
	Engine   string `json:"engine"`
	Sync     string `json:"sync"`
	// TokensTotal is the prompt tokens of the measured requests, TokensHit
	// those served from the tiers (not re-prefilled), Coverage their ratio.
	TokensTotal int64   `json:"tokens_total"`
	TokensHit   int64   `json:"tokens_hit"`
	Coverage    float64 `json:"coverage"`
	// RowsChecked is the rows loaded into the GPUs; RowsIdentical those whose
	// KV was right on every rank's GPU.
	RowsChecked   int64 `json:"rows_checked"`
	RowsIdentical int64 `json:"rows_identical"`
	// BytesWritten and BytesRead are the bytes of the engine's block stores
	// and loads through the mount.
	BytesWritten int64 `json:"bytes_written"`
	BytesRead    int64 `json:"bytes_read"`
	// Waves is the number of promotion batches (disk→CPU) that served hits.
	Waves int64 `json:"waves"`
	// Seconds is the wall time of the scenario, without cluster start and stop.
	Seconds float64 `json:"seconds"`

	// Requests is the number of measured requests; ZeroHitRequests those
	// that got no hit at all; ParkedRequests those of the upstream engine
	// still deferred ("ask again") after its 40 steps, counted as no hit.
	Requests        int `json:"requests"`
	ZeroHitRequests int `json:"zero_hit_requests"`
	ParkedRequests  int `json:"parked_requests"`
	// LookupBudget ("auto" or "off") is the mounts' --lookup-budget.
	LookupBudget string `json:"lookup_budget"`
	// Round is the run's round of `bench --rounds` (from 1; absent without
	// the flag), set by the caller: Run runs one run.
	Round int `json:"round,omitempty"`
	// RetryPeak is the largest summed RETRY of one stock lookup probe: the
	// rows it reserved for promotions; it pins at the row count when the
	// primary tier is exhausted.
	RetryPeak int `json:"retry_peak"`
	// RowsPromoted is the blocks loaded from the tier into rows.
	RowsPromoted int64 `json:"rows_promoted"`
	// LoadErrors and StoreErrors count failed block loads and stores.
	LoadErrors  int64 `json:"load_errors"`
	StoreErrors int64 `json:"store_errors"`
	// Lookups is the engine's faccessat calls on the mount.
	Lookups int64 `json:"lookups"`
	// LoadGBps is BytesRead over the time spent in promotions.
	LoadGBps float64 `json:"load_gbps"`
	// Staging ("on" or "off") and StepGapSeconds are the run's --staging
	// and --step-gap.
	Staging        string  `json:"staging"`
	StepGapSeconds float64 `json:"step_gap_seconds"`
	// LaterWaveWaitSeconds is the time the fixed engine waited on the loads
	// of every wave after the first of a lookup (the gaps not counted): what
	// staging during the gaps can save.
	LaterWaveWaitSeconds float64 `json:"later_wave_wait_seconds"`
	// PrimaryRows is the rows of each primary region, PrimaryPeakRows the most
	// rows pinned at once (reserved, staged or being stored).
	PrimaryRows     int `json:"primary_rows"`
	PrimaryPeakRows int `json:"primary_peak_rows"`
	// GPU names the load stage's backends as kind:device.
	GPU string `json:"gpu"`
	// Geometry is the run's shape.
	Geometry Geometry `json:"geometry"`
	// Stats is the head mount's `kvtierfs stat --json` at the end of the run,
	// PeerStats the other nodes'.
	Stats     json.RawMessage   `json:"stats"`
	PeerStats []json.RawMessage `json:"peer_stats,omitempty"`
}

// Geometry is the shape of a run, as configured (see Config).
type Geometry struct {
	// RowBytes and SlotBytes are the sizes of a row and of one rank's slot.
	RowBytes  int `json:"row_bytes"`
	SlotBytes int `json:"slot_bytes"`
	// Rows is the rows of each node's region.
	Rows int `json:"rows"`
	// TokensPerChunk, WorldSize, Nodes, KV and Groups are Config's.
	TokensPerChunk int    `json:"tokens_per_chunk"`
	WorldSize      int    `json:"world_size"`
	Nodes          int    `json:"nodes"`
	KV             string `json:"kv"`
	Groups         string `json:"groups"`
}

// Run runs a scenario on a new cluster (daemons, mounts, stores, regions) and
// tears it all down before returning, also when ctx is cancelled. The error
// joins the run's and the teardown's; with --sync on and a binary without
// mirroring it wraps ErrSyncUnavailable.
func Run(ctx context.Context, cfg Config) (res Result, err error) {
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	res = Result{
		Scenario:       cfg.Scenario,
		Engine:         cfg.Engine,
		Sync:           onOff(cfg.Sync),
		PrimaryRows:    cfg.Rows,
		Staging:        onOff(cfg.Staging),
		LookupBudget:   budgetMode(cfg.LookupBudget),
		StepGapSeconds: cfg.StepGap.Seconds(),
		Geometry: Geometry{
			RowBytes: cfg.RowBytes, SlotBytes: cfg.SlotBytes(), Rows: cfg.Rows, TokensPerChunk: cfg.TokensPerChunk,
			WorldSize: cfg.WorldSize, Nodes: cfg.Nodes, KV: cfg.KV, Groups: FormatGroups(cfg.Groups),
		},
	}
	reporter := newProgressReporter(cfg.Progress, fmt.Sprintf("%s/%s/sync %s/staging %s/budget %s", cfg.Scenario, cfg.Engine, res.Sync, res.Staging, res.LookupBudget))
	cl, err := startCluster(ctx, cfg)
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, cl.close()) }()
	workers, stage, err := newWorkers(cfg, cl.nodes)
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, stage.close()) }()
	res.GPU = stage.describe()
	for _, note := range stage.notes {
		reporter.always("%s", note)
	}
	var s *scheduler
	engineio.OnSignalFreeThread(func() {
		if s, err = newScheduler(cfg, cl.nodes[0], workers, &res, reporter); err != nil {
			return
		}
		s.startIOThreads()
		defer s.close()
		if cfg.Profile != "" {
			if s.profile, err = newPhaseProfile(cfg.Profile, "sync-"+res.Sync, cl.nodes); err != nil {
				return
			}
		}
		start := time.Now()
		err = runScenario(ctx, s)
		res.Seconds = time.Since(start).Seconds()
		if s.profile != nil {
			report, perr := s.profile.stop()
			reporter.always("--profile: %s", strings.ReplaceAll(strings.TrimSpace(report), "\n", "; "))
			err = errors.Join(err, perr)
		}
	})
	if err != nil {
		return res, err
	}
	if res.TokensTotal > 0 {
		res.Coverage = float64(res.TokensHit) / float64(res.TokensTotal)
	}
	if s.loadSeconds > 0 {
		res.LoadGBps = float64(res.BytesRead) / s.loadSeconds / 1e9
	}
	res.PrimaryPeakRows = s.primary.peakPinned
	for _, n := range cl.nodes {
		stats, err := n.stats()
		if err != nil {
			return res, err
		}
		if n.index == 0 {
			res.Stats = stats
		} else {
			res.PeerStats = append(res.PeerStats, stats)
		}
	}
	return res, nil
}

// budgetMode is the --lookup-budget value of on.
func budgetMode(on bool) string {
	if on {
		return "auto"
	}
	return "off"
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// runScenario drives the scheduler through the scenario's requests.
func runScenario(ctx context.Context, s *scheduler) error {
	cfg := s.cfg
	switch cfg.Scenario {
	case ScenarioEagle, ScenarioLongPrefix:
		prompts := make([][]uint32, cfg.Requests)
		for i := range prompts {
			prompts[i] = tokenStream(fmt.Sprintf("%s/%d", cfg.Scenario, i), cfg.PromptTokens)
		}
		return storeThenAskCold(ctx, s, prompts)
	case ScenarioMultinode:
		return multinode(ctx, s)
	case ScenarioAgent:
		return agent(ctx, s)
	}
	return unknownScenario(cfg.Scenario)
}

// storeThenAskCold serves every prompt once (prefill and store), restarts the
// engine and serves them again, measured (together with AtOnce): every hit
// must come from the disk.
func storeThenAskCold(ctx context.Context, s *scheduler, prompts [][]uint32) error {
	for i, p := range prompts {
		if err := s.serve(ctx, p); err != nil {
			return err
		}
		s.progress("stored prompt %d/%d", i+1, len(prompts))
	}
	s.restart()
	if err := s.beginMeasuring(); err != nil {
		return err
	}
	if s.cfg.AtOnce {
		return s.serveTogether(ctx, prompts)
	}
	for i, p := range prompts {
		if err := s.serve(ctx, p); err != nil {
			return err
		}
		s.progress("asked prompt %d/%d cold: %d of %d tokens hit so far", i+1, len(prompts), s.res.TokensHit, s.res.TokensTotal)
	}
	return nil
}

// multinode stores Prompts distinct prompts of Promote chunks each, then a
// filler prompt of Rows chunks that recycles every primary row, then asks
// each prompt again, measured: every hit block is promoted into a row that
// held the filler or an earlier prompt on every node. More prompts make the
// measured phase longer without a larger region.
func multinode(ctx context.Context, s *scheduler) error {
	chunk := s.cfg.TokensPerChunk
	prompts := make([][]uint32, s.cfg.Prompts)
	for i := range prompts {
		prompts[i] = tokenStream(fmt.Sprintf("multinode/prompt/%d", i), s.cfg.Promote*chunk+1)
	}
	filler := tokenStream("multinode/filler", s.cfg.Rows*chunk+1)
	for _, p := range append(append([][]uint32{}, prompts...), filler) {
		if err := s.serve(ctx, p); err != nil {
			return err
		}
	}
	if err := s.beginMeasuring(); err != nil {
		return err
	}
	for _, p := range prompts {
		if err := s.serve(ctx, p); err != nil {
			return err
		}
	}
	return nil
}

// agent serves Requests requests round-robin over Sessions sessions. Every
// session's tokens start with the same SharedPrefix tokens; turn t of a
// session is its first PrefixMin + t·(PrefixMax-PrefixMin)/(turns-1) tokens,
// so each turn extends the previous one. All requests are measured.
func agent(ctx context.Context, s *scheduler) error {
	cfg := s.cfg
	shared := tokenStream("agent/shared", cfg.SharedPrefix)
	sessions := make([][]uint32, cfg.Sessions)
	for i := range sessions {
		own := tokenStream(fmt.Sprintf("agent/session/%d", i), cfg.PrefixMax-cfg.SharedPrefix)
		sessions[i] = append(append([]uint32{}, shared...), own...)
	}
	turns := (cfg.Requests + cfg.Sessions - 1) / cfg.Sessions
	if err := s.beginMeasuring(); err != nil {
		return err
	}
	for i := 0; i < cfg.Requests; i++ {
		turn := i / cfg.Sessions
		length := cfg.PrefixMin
		if turns > 1 {
			length += (cfg.PrefixMax - cfg.PrefixMin) * turn / (turns - 1)
		}
		if err := s.serve(ctx, sessions[i%cfg.Sessions][:length]); err != nil {
			return err
		}
		s.progress("request %d/%d: %.1f%% of %d tokens hit so far, %d waves", i+1, cfg.Requests,
			100*float64(s.res.TokensHit)/float64(s.res.TokensTotal), s.res.TokensTotal, s.res.Waves)
	}
	return nil
}

// progressReporter writes progress lines of a run that has lasted a few
// seconds, at most one a second.
type progressReporter struct {
	w      io.Writer
	prefix string
	start  time.Time
	last   time.Time
}

// Progress pacing.
const (
	progressAfter = 2 * time.Second
	progressEvery = time.Second
)

func newProgressReporter(w io.Writer, prefix string) *progressReporter {
	now := time.Now()
	return &progressReporter{w: w, prefix: prefix, start: now, last: now}
}

// report writes a line if the run is long enough and the last line is old
// enough.
func (p *progressReporter) report(format string, args ...any) {
	now := time.Now()
	if p.w == nil || now.Sub(p.start) < progressAfter || now.Sub(p.last) < progressEvery {
		return
	}
	p.last = now
	p.always(format, args...)
}

// always writes a line.
func (p *progressReporter) always(format string, args ...any) {
	if p.w != nil {
		fmt.Fprintf(p.w, "[%s %5.1fs] %s\n", p.prefix, time.Since(p.start).Seconds(), fmt.Sprintf(format, args...))
	}
}
