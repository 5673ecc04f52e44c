package engine

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

// planString writes a plan as "round:engine:sync/staging/budget" items.
func planString(plan []PlannedRun) string {
	var items []string
	for _, r := range plan {
		items = append(items, fmt.Sprintf("%d:%s:%s/%s/%s", r.Round, r.Engine, onOff(r.Sync), onOff(r.Staging), budgetMode(r.Budget)))
	}
	return strings.Join(items, " ")
}

// TestPlanRunsAlternatesWhichSyncGoesFirst: without rounds the runs nest as
// they always did; with K rounds each setting's off and on run side by side,
// in --sync's order in odd rounds (off first by default) and reversed in
// even ones.
func TestPlanRunsAlternatesWhichSyncGoesFirst(t *testing.T) {
	offOn, on, both := []bool{false, true}, []bool{true}, []bool{true, false}
	for _, tc := range []struct {
		name                    string
		rounds                  int
		engines                 []string
		syncs, stagings, budget []bool
		want                    string
	}{
		{"no rounds", 0, []string{EngineFixed}, offOn, on, on,
			"0:fixed:off/on/auto 0:fixed:on/on/auto"},
		{"no rounds, nested engine, sync, staging", 0, []string{EngineStock, EngineFixed}, offOn, both, on,
			"0:stock:off/on/auto 0:stock:off/off/auto 0:stock:on/on/auto 0:stock:on/off/auto " +
				"0:fixed:off/on/auto 0:fixed:off/off/auto 0:fixed:on/on/auto 0:fixed:on/off/auto"},
		{"one round", 1, []string{EngineFixed}, offOn, on, on,
			"1:fixed:off/on/auto 1:fixed:on/on/auto"},
		{"three rounds", 3, []string{EngineFixed}, offOn, on, on,
			"1:fixed:off/on/auto 1:fixed:on/on/auto 2:fixed:on/on/auto 2:fixed:off/on/auto 3:fixed:off/on/auto 3:fixed:on/on/auto"},
		{"on,off given", 2, []string{EngineFixed}, both, on, on,
			"1:fixed:on/on/auto 1:fixed:off/on/auto 2:fixed:off/on/auto 2:fixed:on/on/auto"},
		{"two stagings pair within each", 2, []string{EngineFixed}, offOn, both, on,
			"1:fixed:off/on/auto 1:fixed:on/on/auto 1:fixed:off/off/auto 1:fixed:on/off/auto " +
				"2:fixed:on/on/auto 2:fixed:off/on/auto 2:fixed:on/off/auto 2:fixed:off/off/auto"},
	} {
		got := planString(PlanRuns(tc.rounds, tc.engines, tc.syncs, tc.stagings, tc.budget))
		if got != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", tc.name, got, tc.want)
		}
	}
}

// roundRun is a finished run of round r for the summary's tests: rows
// identical at every rank (all of 10) with mirroring on, none off.
func roundRun(round int, sync string, gbps float64) Result {
	r := Result{Engine: EngineFixed, Staging: "on", LookupBudget: "auto", Round: round, Sync: sync, LoadGBps: gbps, RowsChecked: 10}
	if sync == "on" {
		r.RowsIdentical = 10
	}
	return r
}

// TestSummarizeMirroringMedian pairs each round's runs whatever their order,
// takes the median of the ratios (the middle two's mean for an even count)
// and each side's range, and leaves a round that failed its checks out of
// both.
func TestSummarizeMirroringMedian(t *testing.T) {
	results := []Result{
		roundRun(1, "off", 5.0), roundRun(1, "on", 4.0), // 0.8
		roundRun(2, "on", 3.0), roundRun(2, "off", 6.0), // 0.5
		roundRun(3, "off", 4.0), roundRun(3, "on", 3.6), // 0.9
	}
	sums := SummarizeMirroring(results)
	if len(sums) != 1 {
		t.Fatalf("%d summaries, want 1: %+v", len(sums), sums)
	}
	s := sums[0]
	if len(s.Rounds) != 3 || s.Counted != 3 {
		t.Fatalf("rounds %d, counted %d; want 3, 3: %+v", len(s.Rounds), s.Counted, s)
	}
	for i, want := range []struct {
		first string
		ratio float64
	}{{"off", 0.8}, {"on", 0.5}, {"off", 0.9}} {
		r := s.Rounds[i]
		if r.Round != i+1 || r.First != want.first || !near(r.Ratio, want.ratio) || !r.ChecksPass {
			t.Errorf("round %d: %+v; want round %d, %s first, ratio %.2f, checks pass", i+1, r, i+1, want.first, want.ratio)
		}
	}
	if !near(s.MedianRatio, 0.8) || s.OffGBpsMin != 4 || s.OffGBpsMax != 6 || s.OnGBpsMin != 3 || s.OnGBpsMax != 4 {
		t.Errorf("median %.3f, off %.1f–%.1f, on %.1f–%.1f; want 0.8, 4–6, 3–4", s.MedianRatio, s.OffGBpsMin, s.OffGBpsMax, s.OnGBpsMin, s.OnGBpsMax)
	}

	// Round 4's mirrored run has a stale row: it is shown, not counted;
	// with an even count left the median is the middle two's mean.
	bad := roundRun(4, "on", 9.0)
	bad.RowsIdentical = 9
	results = append(results, bad, roundRun(4, "off", 1.0), roundRun(5, "on", 2.8), roundRun(5, "off", 4.0)) // 0.7
	s = SummarizeMirroring(results)[0]
	if len(s.Rounds) != 5 || s.Counted != 4 || s.Rounds[3].ChecksPass || !near(s.MedianRatio, 0.75) || s.OffGBpsMin != 4 || s.OnGBpsMax != 4 {
		t.Errorf("with a failed round: %+v; want 5 rounds, 4 counted, round 4 failing, median 0.75, ranges without round 4", s)
	}

	// An unmirrored run whose rows are all identical proves nothing (no
	// row reached a reused row unmirrored), nor does one that failed loads.
	for _, spoil := range []func(off, on *Result){
		func(off, _ *Result) { off.RowsIdentical = off.RowsChecked },
		func(_, on *Result) { on.LoadErrors = 1 },
		func(off, _ *Result) { off.StoreErrors = 1 },
		func(_, on *Result) { on.RowsChecked, on.RowsIdentical = 0, 0 },
	} {
		off, on := roundRun(1, "off", 5), roundRun(1, "on", 4)
		spoil(&off, &on)
		if s := SummarizeMirroring([]Result{off, on})[0]; s.Counted != 0 || s.Rounds[0].ChecksPass || s.MedianRatio != 0 {
			t.Errorf("spoilt round counted: %+v", s)
		}
	}

	// Without --rounds (round 0) the one pair is round 1; a run without
	// its other half, and runs of one sync setting only, give nothing.
	s = SummarizeMirroring([]Result{roundRun(0, "off", 5), roundRun(0, "on", 4)})[0]
	if len(s.Rounds) != 1 || s.Rounds[0].Round != 1 || !near(s.MedianRatio, 0.8) {
		t.Errorf("no rounds: %+v", s)
	}
	if sums := SummarizeMirroring([]Result{roundRun(0, "off", 5), roundRun(0, "off", 4)}); len(sums) != 0 {
		t.Errorf("sync off only: %+v; want none", sums)
	}
	s = SummarizeMirroring([]Result{roundRun(1, "off", 5), roundRun(1, "on", 4), roundRun(2, "off", 5)})[0]
	if len(s.Rounds) != 1 {
		t.Errorf("a lone run counted as a round: %+v", s)
	}
}

// TestWriteMirroringLines: one line a round and the median line, which the
// bench test reads back.
func TestWriteMirroringLines(t *testing.T) {
	var out bytes.Buffer
	WriteMirroring(&out, SummarizeMirroring([]Result{roundRun(1, "off", 5), roundRun(1, "on", 4), roundRun(2, "on", 3), roundRun(2, "off", 6)}))
	want := "mirroring on ÷ off of the load throughput, fixed engine, staging on, lookup budget auto:\n" +
		"  round 1 (off first): off 5.00 GB/s, on 4.00 GB/s, on ÷ off 0.80; rows identical on 10/10, off 0/10; checks pass\n" +
		"  round 2 (on first): off 6.00 GB/s, on 3.00 GB/s, on ÷ off 0.50; rows identical on 10/10, off 0/10; checks pass\n" +
		"  median on ÷ off 0.65 of 2 round(s) of 2; off 5.00–6.00 GB/s, on 3.00–4.00 GB/s\n"
	if out.String() != want {
		t.Errorf("got\n%s\nwant\n%s", out.String(), want)
	}
}

func near(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }
