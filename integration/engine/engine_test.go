package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

func TestMain(m *testing.M) { mounttest.Main(m) }

// ciRowBytes keeps the scenarios' I/O small: the behaviours do not depend on
// the row size.
const ciRowBytes = 64 << 10

// ciConfig is a scenario's defaults at CI size, on the host GPU backend.
func ciConfig(t *testing.T, scenario, engine string) Config {
	t.Helper()
	cfg, err := DefaultConfig(scenario)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Engine = engine
	cfg.RowBytes = ciRowBytes
	cfg.GPU = "host"
	cfg.Binary = mounttest.Binary()
	cfg.Dir = t.TempDir()
	cfg.RegionID = fmt.Sprintf("kvtiertest_%d", os.Getpid())
	return cfg
}

// run runs cfg and checks what every run must leave behind: nothing mounted,
// no region file, an empty work directory, and mount stats that agree with
// the engine's own counts.
func run(t *testing.T, cfg Config) Result {
	t.Helper()
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("%s/%s: %v", cfg.Scenario, cfg.Engine, err)
	}
	checkCleanedUp(t, cfg.Dir, cfg.RegionID)
	var st ctlabi.Stats
	if err := json.Unmarshal(res.Stats, &st); err != nil {
		t.Fatalf("stats: %v", err)
	}
	if st.Counters.Reads != res.RowsPromoted || st.Counters.ReadBytes != res.BytesRead {
		t.Errorf("mount counted %d reads of %d B, the engine %d promotions of %d B", st.Counters.Reads, st.Counters.ReadBytes, res.RowsPromoted, res.BytesRead)
	}
	if res.LoadErrors != 0 || res.StoreErrors != 0 {
		t.Errorf("%d load and %d store errors", res.LoadErrors, res.StoreErrors)
	}
	if len(res.PeerStats) != cfg.Nodes-1 {
		t.Errorf("%d peer stats for %d nodes", len(res.PeerStats), cfg.Nodes)
	}
	t.Logf("%s/%s sync %s: coverage %.4f (%d/%d tokens), rows %d/%d identical, %d promoted in %d waves, retry peak %d, %d zero-hit requests, written %d B, read %d B",
		res.Scenario, res.Engine, res.Sync, res.Coverage, res.TokensHit, res.TokensTotal, res.RowsIdentical, res.RowsChecked,
		res.RowsPromoted, res.Waves, res.RetryPeak, res.ZeroHitRequests, res.BytesWritten, res.BytesRead)
	return res
}

// checkCleanedUp fails if anything of a run is left: a mount below dir, an
// entry in dir, or a region file of id.
func checkCleanedUp(t *testing.T, dir, id string) {
	t.Helper()
	if mounted, err := mountedUnder(dir); err != nil || len(mounted) > 0 {
		t.Errorf("still mounted below %s: %v %v", dir, mounted, err)
	}
	if left, _ := os.ReadDir(dir); len(left) > 0 {
		t.Errorf("%d entries left in %s", len(left), dir)
	}
	if regions, _ := filepath.Glob(fmt.Sprintf("/dev/shm/vllm_offload_%s_*.mmap", id)); len(regions) > 0 {
		t.Errorf("region files left: %v", regions)
	}
}

// TestEagle: with the stock store filter the EAGLE group never has tail+1
// consecutive chunks, so every lookup is vetoed and nothing is ever read back
// while stores pile up; with the fixed filter the same prompts hit from disk.
func TestEagle(t *testing.T) {
	stock := ciConfig(t, ScenarioEagle, EngineStock)
	stock.Requests = 2
	res := run(t, stock)
	if res.TokensHit != 0 || res.BytesRead != 0 || res.RowsChecked != 0 || res.ZeroHitRequests != stock.Requests {
		t.Errorf("stock: %d tokens hit, %d B read, %d rows loaded, %d/%d requests without a hit; want nothing read back",
			res.TokensHit, res.BytesRead, res.RowsChecked, res.ZeroHitRequests, stock.Requests)
	}
	if res.BytesWritten == 0 {
		t.Error("stock: nothing written")
	}

	fixed := ciConfig(t, ScenarioEagle, EngineFixed)
	fixed.Requests = 2
	res = run(t, fixed)
	// 49 complete chunks; the EAGLE run ends at 49 and drops one: 48 chunks.
	wantHit := int64(fixed.Requests * 48 * fixed.TokensPerChunk)
	if res.TokensHit != wantHit || res.ZeroHitRequests != 0 {
		t.Errorf("fixed: %d tokens hit, want %d", res.TokensHit, wantHit)
	}
	if res.RowsChecked == 0 || res.RowsIdentical != res.RowsChecked || res.BytesRead == 0 {
		t.Errorf("fixed: %d/%d rows identical, %d B read", res.RowsIdentical, res.RowsChecked, res.BytesRead)
	}
}

// TestLongPrefix: a 348,000-token prompt on a 124-row primary tier, cold.
// Stock, on a mount with --lookup-budget off (the field): the lookup
// reserves a row per key, runs out at the row count and the sliding group
// vetoes: coverage 0 with the summed RETRY pinned at 124. Fixed: 169 of
// 169.9 chunks served (99.5%) in several waves.
func TestLongPrefix(t *testing.T) {
	stock := ciConfig(t, ScenarioLongPrefix, EngineStock)
	stock.LookupBudget = false
	res := run(t, stock)
	if res.Coverage != 0 || res.RetryPeak != stock.Rows || res.BytesRead != 0 {
		t.Errorf("stock: coverage %.4f, retry peak %d (rows %d), %d B read; want 0, pinned at the rows, 0", res.Coverage, res.RetryPeak, stock.Rows, res.BytesRead)
	}

	fixed := ciConfig(t, ScenarioLongPrefix, EngineFixed)
	res = run(t, fixed)
	if res.Coverage < 0.99 || res.Waves < 2 {
		t.Errorf("fixed: coverage %.4f in %d waves, want >= 0.99 in several waves", res.Coverage, res.Waves)
	}
	if res.RowsChecked != 170 || res.RowsIdentical != res.RowsChecked {
		t.Errorf("fixed: %d/%d rows identical, want 170/170", res.RowsIdentical, res.RowsChecked)
	}
	if res.PrimaryPeakRows > fixed.Rows {
		t.Errorf("fixed: %d rows in use, more than the %d of the region", res.PrimaryPeakRows, fixed.Rows)
	}
}

// multinodeConfig is multinode at CI size: two prompts, so the second one's
// rows held the first one's blocks.
func multinodeConfig(t *testing.T, sync bool) Config {
	cfg := ciConfig(t, ScenarioMultinode, EngineFixed)
	cfg.Rows, cfg.Promote, cfg.Prompts, cfg.Sync = 32, 24, 2, sync
	return cfg
}

// measuredRows is the number of rows a multinode run promotes, measured.
func measuredRows(cfg Config) int64 { return int64(cfg.Promote * cfg.Prompts) }

// TestMultinodeSyncOff: TP=2 across two nodes; the head promotes every hit
// block into a recycled row of its own region only, so rank 1 loads stale KV:
// 0/N rows identical at the GPUs (the field's 0/112).
func TestMultinodeSyncOff(t *testing.T) {
	cfg := multinodeConfig(t, false)
	res := run(t, cfg)
	if want := measuredRows(cfg); res.RowsPromoted != want || res.RowsChecked != want || res.RowsIdentical != 0 {
		t.Errorf("sync off: %d promoted, %d/%d identical; want %d promoted, 0/%d", res.RowsPromoted, res.RowsIdentical, res.RowsChecked, want, want)
	}
}

// TestMultinodeSyncOn: with the filesystem mirroring promoted rows, N/N.
func TestMultinodeSyncOn(t *testing.T) {
	if err := CheckSync(mounttest.Binary()); err != nil {
		t.Fatalf("`kvtierfs mount` cannot mirror rows: %v", err)
	}
	cfg := multinodeConfig(t, true)
	res := run(t, cfg)
	if want := measuredRows(cfg); res.RowsChecked != want || res.RowsIdentical != res.RowsChecked {
		t.Errorf("sync on: %d/%d identical, want %d/%d", res.RowsIdentical, res.RowsChecked, want, want)
	}
}

// TestMultinodeFourNodes: TP=4 spread over four nodes, each daemon in a
// network namespace of its own and given the same peer list (itself
// included). Without mirroring the three other ranks
// load stale KV (0/N rows right at every GPU); with it N/N, the head sending
// each promoted row's non-zero bytes (one slot) once to each of its three
// peers, and skipping its own entry.
func TestMultinodeFourNodes(t *testing.T) {
	for _, sync := range []bool{false, true} {
		cfg := multinodeConfig(t, sync)
		cfg.Nodes, cfg.WorldSize, cfg.Netns = 4, 4, true
		res := run(t, cfg)
		want := map[bool]int64{false: 0, true: measuredRows(cfg)}[sync]
		if res.RowsChecked != measuredRows(cfg) || res.RowsIdentical != want {
			t.Errorf("sync %v: %d/%d rows identical at every rank, want %d/%d", sync, res.RowsIdentical, res.RowsChecked, want, measuredRows(cfg))
		}
		if !sync {
			continue
		}
		var head ctlabi.Stats
		if err := json.Unmarshal(res.Stats, &head); err != nil {
			t.Fatal(err)
		}
		states := map[string]int{}
		for _, p := range head.Peers {
			states[p.State]++
			if !strings.HasPrefix(p.Addr, "10.213.9.") {
				t.Errorf("peer %s is not at a namespace's address", p.Addr)
			}
		}
		if states["self"] != 1 || states["up"] != 3 || len(head.Peers) != 4 {
			t.Errorf("head's peers %+v, want itself and three up", head.Peers)
		}
		perRow := float64(headBytesSent(head)) / float64(head.Counters.RowsMirrored)
		if slot := float64(cfg.SlotBytes()); head.Counters.RowsMirrored == 0 || perRow > 3*slot || perRow < 2*slot {
			t.Errorf("the head sent %.0f B per mirrored row (%d rows), want about 3 slots of %.0f B", perRow, head.Counters.RowsMirrored, slot)
		}
	}
}

// TestMultinodeGQASyncOn: a head-sharded cache must not be mirrored; with
// --replicated-kv auto the filesystem decides so from store samples and then
// answers lookups "absent", so no rank ever loads wrong KV.
func TestMultinodeGQASyncOn(t *testing.T) {
	if err := CheckSync(mounttest.Binary()); err != nil {
		t.Fatalf("`kvtierfs mount` cannot mirror rows: %v", err)
	}
	cfg := multinodeConfig(t, true)
	cfg.KV = KVGQA
	res := run(t, cfg)
	if res.RowsIdentical != res.RowsChecked {
		t.Errorf("GQA, sync on: %d/%d rows identical: a rank loaded wrong KV", res.RowsIdentical, res.RowsChecked)
	}
}

// TestSyncOnWithoutMirroring: --sync on with a binary whose mount cannot
// mirror fails with ErrSyncUnavailable before starting anything.
func TestSyncOnWithoutMirroring(t *testing.T) {
	oldMount := filepath.Join(t.TempDir(), "kvtierfs")
	if err := os.WriteFile(oldMount, []byte("#!/bin/sh\necho 'Usage: kvtierfs mount MOUNTPOINT [flags]'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := multinodeConfig(t, true)
	cfg.Binary = oldMount
	if _, err := Run(context.Background(), cfg); !errors.Is(err, ErrSyncUnavailable) {
		t.Fatalf("got %v, want ErrSyncUnavailable", err)
	}
	checkCleanedUp(t, cfg.Dir, cfg.RegionID)
}

// agentConfig is agent at CI size: 12 requests of 3 sessions, 8192 tokens per
// chunk (29 to 42 chunks a prompt), a 24-row primary tier that holds the
// shared preamble's 19 chunks but no session's previous turn.
func agentConfig(t *testing.T, engine string) Config {
	cfg := ciConfig(t, ScenarioAgent, engine)
	cfg.Nodes, cfg.WorldSize, cfg.Sync = 1, 1, false
	cfg.Requests, cfg.Sessions, cfg.Rows, cfg.TokensPerChunk = 12, 3, 24, 8192
	return cfg
}

// TestAgent: stock on a mount without the lookup budget (the field) hits
// only while a hit fits in the primary tier (the first turns of the later
// sessions, on the shared preamble); fixed streams every turn's previous
// prefix through the tier in waves; upstream (vLLM main) gets more with the
// budget than without.
func TestAgent(t *testing.T) {
	stock := agentConfig(t, EngineStock)
	stock.LookupBudget = false
	res := run(t, stock)
	if res.ZeroHitRequests != stock.Requests-(stock.Sessions-1) || res.RetryPeak != stock.Rows {
		t.Errorf("stock: %d of %d requests without a hit, retry peak %d; want %d, pinned at %d",
			res.ZeroHitRequests, stock.Requests, res.RetryPeak, stock.Requests-(stock.Sessions-1), stock.Rows)
	}
	stockCoverage := res.Coverage

	fixed := agentConfig(t, EngineFixed)
	res = run(t, fixed)
	if res.ZeroHitRequests != 1 || res.Coverage < 0.75 || res.Coverage < 4*stockCoverage {
		t.Errorf("fixed: coverage %.4f (stock %.4f), %d requests without a hit; want >= 0.75, 4× stock, only the first request missing",
			res.Coverage, stockCoverage, res.ZeroHitRequests)
	}
	if res.Waves <= int64(fixed.Requests) || res.RowsIdentical != res.RowsChecked {
		t.Errorf("fixed: %d waves for %d requests, %d/%d rows identical", res.Waves, fixed.Requests, res.RowsIdentical, res.RowsChecked)
	}

	var coverage [2]float64
	for i, budget := range []bool{false, true} {
		upstream := agentConfig(t, EngineUpstream)
		upstream.LookupBudget = budget
		res = run(t, upstream)
		coverage[i] = res.Coverage
		if budget && (res.ParkedRequests != 0 || res.RowsIdentical != res.RowsChecked) {
			t.Errorf("upstream, budget auto: %d parked, %d/%d rows identical", res.ParkedRequests, res.RowsIdentical, res.RowsChecked)
		}
	}
	if coverage[1] <= coverage[0] {
		t.Errorf("upstream: coverage %.4f with the budget, %.4f without; want more", coverage[1], coverage[0])
	}
}

// TestAgentTwoNodes: the agent workload with TP=2 across two nodes. Without
// mirroring, rank 1 loads stale KV for every promoted row; with it, every row
// is right on both GPUs.
func TestAgentTwoNodes(t *testing.T) {
	for _, sync := range []bool{false, true} {
		if err := CheckSync(mounttest.Binary()); sync && err != nil {
			t.Fatalf("`kvtierfs mount` cannot mirror rows: %v", err)
		}
		cfg := agentConfig(t, EngineFixed)
		cfg.Nodes, cfg.WorldSize, cfg.Sync, cfg.Requests = 2, 2, sync, 6
		res := run(t, cfg)
		if res.RowsChecked == 0 || res.Coverage < 0.5 {
			t.Fatalf("sync %v: coverage %.4f, %d rows loaded", sync, res.Coverage, res.RowsChecked)
		}
		if identical := res.RowsIdentical == res.RowsChecked; identical != sync {
			t.Errorf("sync %v: %d/%d rows identical at the GPUs", sync, res.RowsIdentical, res.RowsChecked)
		}
	}
}

// TestTP2OneNodeGQA: two ranks on one node write their own slots of the same
// rows with rank-dependent KV; promoted rows carry both slots, so both GPUs
// get their own KV.
func TestTP2OneNodeGQA(t *testing.T) {
	cfg := ciConfig(t, ScenarioEagle, EngineFixed)
	cfg.Requests, cfg.WorldSize, cfg.KV = 1, 2, KVGQA
	res := run(t, cfg)
	if res.RowsChecked == 0 || res.RowsIdentical != res.RowsChecked {
		t.Errorf("%d/%d rows identical, want all", res.RowsIdentical, res.RowsChecked)
	}
}

// TestValidateNamesTheFlag checks that bad configurations name their flag and
// its allowed values.
func TestValidateNamesTheFlag(t *testing.T) {
	for want, mutate := range map[string]func(*Config){
		"--engine \"x\": want one of stock, upstream, fixed": func(c *Config) { c.Engine = "x" },
		"--row-bytes 1000":                     func(c *Config) { c.RowBytes = 1000 },
		"--nodes 5: want 1 to 4":               func(c *Config) { c.Nodes = 5 },
		"--world-size 3":                       func(c *Config) { c.WorldSize = 3 },
		"--sync on: needs --nodes 2":           func(c *Config) { c.Nodes, c.WorldSize, c.Sync = 1, 1, true },
		"--kv \"x\": want mla or gqa":          func(c *Config) { c.KV = "x" },
		"--gpu \"x\": want auto, cuda or host": func(c *Config) { c.GPU = "x" },
		"--replicated-kv \"x\"":                func(c *Config) { c.ReplicatedKV = "x" },
		"--promote 0":                          func(c *Config) { c.Promote = 0 },
		"--prompts 0":                          func(c *Config) { c.Prompts = 0 },
		"--rows 0":                             func(c *Config) { c.Rows = 0 },
		"--model":                              func(c *Config) { c.Model = "a/b" },
		"--profile: not with --netns":          func(c *Config) { c.Profile, c.Netns = "p", true },
	} {
		cfg, _ := DefaultConfig(ScenarioMultinode)
		cfg.Binary = "kvtierfs"
		mutate(&cfg)
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("got %v, want an error containing %q", err, want)
		}
	}
	if _, err := DefaultConfig("nope"); err == nil || !strings.Contains(err.Error(), "eagle, multinode, long-prefix, agent") {
		t.Errorf("unknown scenario: %v", err)
	}
}

// TestStagedGap: the long prompt through a 32-row primary tier, with the
// engine computing between waves as a real scheduler does. With staging on,
// the mount stages each next wave during the gap, so every load of waves
// 2…n is served from memory; with staging off, none is.
func TestStagedGap(t *testing.T) {
	results := map[bool]Result{}
	for _, staging := range []bool{false, true} {
		cfg := ciConfig(t, ScenarioLongPrefix, EngineFixed)
		cfg.Rows, cfg.StepGap, cfg.Staging = 32, 100*time.Millisecond, staging
		res := run(t, cfg)
		var st ctlabi.Stats
		if err := json.Unmarshal(res.Stats, &st); err != nil {
			t.Fatal(err)
		}
		laterWaves := res.RowsPromoted - int64(cfg.Rows)
		switch {
		case res.Waves < 3 || res.RowsIdentical != res.RowsChecked || res.Coverage < 0.99:
			t.Errorf("staging %v: %d waves, %d/%d rows identical, coverage %.4f; want >= 3 waves, all identical, >= 0.99",
				staging, res.Waves, res.RowsIdentical, res.RowsChecked, res.Coverage)
		case !staging && st.Counters.LoadsFromStaging != 0:
			t.Errorf("staging off: %d loads served from staging", st.Counters.LoadsFromStaging)
		// Every load of waves 2…n foreseen: served from staging, or queued
		// there and taken before a busy machine let its fetch start.
		case staging && (st.Counters.LoadsFromStaging == 0 || st.Staging == nil ||
			st.Counters.LoadsFromStaging+st.Staging.Late < laterWaves):
			t.Errorf("staging on: %d loads served from staging, %d queued too late (%+v), want every load of waves 2…n (%d of %d promoted)",
				st.Counters.LoadsFromStaging, lateOf(st), st.Staging, laterWaves, res.RowsPromoted)
		case res.LaterWaveWaitSeconds <= 0 || res.StepGapSeconds != 0.1:
			t.Errorf("staging %v: later-wave wait %v s, step gap %v s", staging, res.LaterWaveWaitSeconds, res.StepGapSeconds)
		}
		results[staging] = res
	}
	var out strings.Builder
	WriteStagingRatios(&out, []Result{results[false], results[true]})
	if !strings.Contains(out.String(), "staging on ÷ off") {
		t.Errorf("no staging ratio printed: %q", out.String())
	}
}

// lateOf is stat's count of loads staging foresaw too late, 0 without staging.
func lateOf(st ctlabi.Stats) int64 {
	if st.Staging == nil {
		return 0
	}
	return st.Staging.Late
}
