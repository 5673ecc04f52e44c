package engine

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
)

// Issue 23 end to end: engines whose lookup promotes every key it confirms
// (stock, upstream) on real mounts with --lookup-budget auto and off.

// budgetRows is the primary tier of these tests; a long prefix is 2.2 × it.
const budgetRows = 32

// budgetConfig is long-prefix with a primary tier of budgetRows rows and a
// prompt of chunks chunks (plus half a chunk) for engine, groups and budget.
func budgetConfig(t *testing.T, engine, groups string, chunks int, budget bool) Config {
	t.Helper()
	cfg := ciConfig(t, ScenarioLongPrefix, engine)
	var err error
	if cfg.Groups, err = ParseGroups(groups); err != nil {
		t.Fatal(err)
	}
	cfg.Rows, cfg.LookupBudget = budgetRows, budget
	cfg.PromptTokens = chunks*cfg.TokensPerChunk + cfg.TokensPerChunk/2
	return cfg
}

// mountStats decodes the head mount's stats of a run.
func mountStats(t *testing.T, res Result) ctlabi.Stats {
	t.Helper()
	var st ctlabi.Stats
	if err := json.Unmarshal(res.Stats, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// wantRightRows fails unless the run loaded rows and every one was right at
// the GPUs.
func wantRightRows(t *testing.T, name string, res Result) {
	t.Helper()
	if res.RowsChecked == 0 || res.RowsIdentical != res.RowsChecked {
		t.Errorf("%s: %d/%d rows right at the GPUs, want all of some", name, res.RowsIdentical, res.RowsChecked)
	}
}

// TestBudgetLongPrefix: a prefix of 2.2 × R chunks, cold, with full +
// sliding, full + EAGLE and full attention alone. Without the budget vLLM
// main's walk gets no hit (full + window) or parks the request (full alone);
// with it both engines get a hit, never park, and load only right rows; the
// mount says it capped the chain.
func TestBudgetLongPrefix(t *testing.T) {
	chunks := budgetRows * 22 / 10
	for _, groups := range []string{"full,sliding:1:1", "full,eagle:2:2", "full"} {
		off := run(t, budgetConfig(t, EngineUpstream, groups, chunks, false))
		if groups == "full" && off.ParkedRequests != 1 || groups != "full" && off.TokensHit != 0 {
			t.Errorf("upstream, %s, budget off: %d tokens hit, %d parked; want vLLM main's failure (no hit, parked with full attention alone)",
				groups, off.TokensHit, off.ParkedRequests)
		}
		for _, engine := range []string{EngineUpstream, EngineStock} {
			name := fmt.Sprintf("%s, %s, budget auto", engine, groups)
			res := run(t, budgetConfig(t, engine, groups, chunks, true))
			if res.TokensHit == 0 || res.ParkedRequests != 0 {
				t.Errorf("%s: %d tokens hit, %d parked; want a hit and no parked request", name, res.TokensHit, res.ParkedRequests)
			}
			wantRightRows(t, name, res)
			if st := mountStats(t, res); st.Counters.BudgetChainsCapped == 0 || st.Counters.BudgetKeysWithheld == 0 {
				t.Errorf("%s: mount counters %+v: want the chain capped and keys withheld", name, st.Counters)
			}
			if groups == "full" && res.TokensHit < int64(budgetRows*9/10*res.Geometry.TokensPerChunk) {
				t.Errorf("%s: %d tokens hit, want at least 90%% of the %d rows' chunks", name, res.TokensHit, budgetRows)
			}
		}
	}
}

// TestBudgetShortPrefixUnchanged: a prefix of half the rows gets the same hit
// with the budget as without, and the mount caps nothing.
func TestBudgetShortPrefixUnchanged(t *testing.T) {
	for _, engine := range []string{EngineUpstream, EngineStock} {
		for _, groups := range []string{"full,sliding:1:1", "full"} {
			off := run(t, budgetConfig(t, engine, groups, budgetRows/2, false))
			on := run(t, budgetConfig(t, engine, groups, budgetRows/2, true))
			if on.TokensHit != off.TokensHit || on.TokensHit == 0 {
				t.Errorf("%s, %s: %d tokens hit with the budget, %d without; want the same hit", engine, groups, on.TokensHit, off.TokensHit)
			}
			if st := mountStats(t, on); st.Counters.BudgetChainsCapped != 0 {
				t.Errorf("%s, %s: %d chains capped, want none", engine, groups, st.Counters.BudgetChainsCapped)
			}
			wantRightRows(t, engine+", "+groups, on)
		}
	}
}

// TestBudgetFixedEngineUnchanged: the fixed engine matches through
// .kvtier/match and loads in waves: the budget changes nothing for it.
func TestBudgetFixedEngineUnchanged(t *testing.T) {
	chunks := budgetRows * 22 / 10
	off := run(t, budgetConfig(t, EngineFixed, "full,sliding:1:1", chunks, false))
	on := run(t, budgetConfig(t, EngineFixed, "full,sliding:1:1", chunks, true))
	if on.TokensHit != off.TokensHit || on.TokensHit != int64(chunks*on.Geometry.TokensPerChunk) || on.RowsIdentical != off.RowsIdentical {
		t.Errorf("fixed: %d tokens hit (%d rows right) with the budget, %d (%d) without; want the whole prefix both times",
			on.TokensHit, on.RowsIdentical, off.TokensHit, off.RowsIdentical)
	}
	if st := mountStats(t, on); st.Counters.BudgetKeysWithheld != 0 {
		t.Errorf("fixed: %d keys withheld, want none", st.Counters.BudgetKeysWithheld)
	}
	wantRightRows(t, "fixed", on)
}

// TestBudgetRequestsAtOnce: two and three long-prefix requests arrive
// together and share the scheduler's steps and the primary rows: with the
// budget no request parks, no wrong row loads, and the requests together
// get at least the hits they get without it.
func TestBudgetRequestsAtOnce(t *testing.T) {
	chunks := budgetRows * 22 / 10
	for _, requests := range []int{2, 3} {
		for _, groups := range []string{"full,sliding:1:1", "full"} {
			var hits [2]int64
			for i, budget := range []bool{false, true} {
				cfg := budgetConfig(t, EngineUpstream, groups, chunks, budget)
				cfg.Requests, cfg.AtOnce = requests, true
				res := run(t, cfg)
				hits[i] = res.TokensHit
				if budget && res.ParkedRequests != 0 {
					t.Errorf("%d requests, %s, budget auto: %d parked", requests, groups, res.ParkedRequests)
				}
				if budget {
					wantRightRows(t, fmt.Sprintf("%d requests, %s", requests, groups), res)
				}
			}
			if hits[1] < hits[0] || hits[1] == 0 {
				t.Errorf("%d requests, %s: %d tokens hit with the budget, %d without; want more, and some", requests, groups, hits[1], hits[0])
			}
		}
	}
}

// TestBudgetAgent: the agent bench's sessions (40 turns of 4 sessions over
// a shared preamble of 78 chunks, 124 primary rows, two nodes): with the
// budget both walks get at least 40 % coverage and no request parks (the
// stock walk had 9 %: the lookup thread's next request was denied what the
// last one was; vLLM main's parked 2 requests whose resident chunks no link
// joined to the keys asked), and neither gets fewer hits than without it.
func TestBudgetAgent(t *testing.T) {
	for _, engine := range []string{EngineStock, EngineUpstream} {
		var results [2]Result
		for i, budget := range []bool{false, true} {
			cfg := ciConfig(t, ScenarioAgent, engine)
			cfg.LookupBudget = budget
			results[i] = run(t, cfg)
		}
		off, on := results[0], results[1]
		t.Logf("%s: coverage %.3f without the budget (%d parked), %.3f with it (%d parked)", engine, off.Coverage, off.ParkedRequests, on.Coverage, on.ParkedRequests)
		if on.TokensHit < off.TokensHit {
			t.Errorf("%s, budget auto: %d tokens hit, %d without; want no fewer", engine, on.TokensHit, off.TokensHit)
		}
		if on.Coverage < 0.4 || on.ParkedRequests != 0 {
			t.Errorf("%s, budget auto: coverage %.3f, %d parked; want at least 0.4, none parked", engine, on.Coverage, on.ParkedRequests)
		}
		wantRightRows(t, engine+", agent", on)
	}
}
