package engine

import (
	"fmt"
	"io"
	"slices"
)

// A measure of mirroring on ÷ off (issue 28, DESIGN.md "N nodes: what
// mirroring costs"): the unmirrored side alone moves by half between runs
// of one machine, so `bench multinode --rounds K` runs K rounds of one run
// with mirroring off and one with it on, each with fresh daemons, which of
// the two goes first alternating from round to round so that a drift of the
// machine weighs on both sides alike, and sums the rounds up by the median
// of their ratios.

// PlannedRun is one run of a bench invocation, in the order they run.
type PlannedRun struct {
	// Round is the run's round, from 1; 0 when the invocation has no rounds.
	Round                 int
	Engine                string
	Sync, Staging, Budget bool
}

// PlanRuns orders the runs of an invocation. With rounds 0 (no --rounds)
// it is every engine, sync, staging and budget setting once, nested in
// that order. With rounds K ≥ 1 it is K rounds; each round runs, for every
// engine, staging and budget setting, each sync setting next to the other,
// in the order given in odd rounds and reversed in even ones.
func PlanRuns(rounds int, engines []string, syncs, stagings, budgets []bool) []PlannedRun {
	var plan []PlannedRun
	if rounds == 0 {
		for _, eng := range engines {
			for _, sync := range syncs {
				for _, staging := range stagings {
					for _, budget := range budgets {
						plan = append(plan, PlannedRun{Engine: eng, Sync: sync, Staging: staging, Budget: budget})
					}
				}
			}
		}
		return plan
	}
	for round := 1; round <= rounds; round++ {
		order := slices.Clone(syncs)
		if round%2 == 0 {
			slices.Reverse(order)
		}
		for _, eng := range engines {
			for _, staging := range stagings {
				for _, budget := range budgets {
					for _, sync := range order {
						plan = append(plan, PlannedRun{Round: round, Engine: eng, Sync: sync, Staging: staging, Budget: budget})
					}
				}
			}
		}
	}
	return plan
}

// MirrorRound is one round's pair of runs with mirroring off and on.
type MirrorRound struct {
	// Round counts from 1.
	Round int `json:"round"`
	// First is the sync setting ("off" or "on") that ran first.
	First string `json:"first"`
	// OffGBps and OnGBps are the runs' load throughput, Ratio on ÷ off.
	OffGBps float64 `json:"off_gbps"`
	OnGBps  float64 `json:"on_gbps"`
	Ratio   float64 `json:"ratio"`
	// OnRowsIdentical/OnRowsChecked and OffRowsIdentical/OffRowsChecked are
	// the runs' rows identical at every rank.
	OnRowsIdentical  int64 `json:"on_rows_identical"`
	OnRowsChecked    int64 `json:"on_rows_checked"`
	OffRowsIdentical int64 `json:"off_rows_identical"`
	OffRowsChecked   int64 `json:"off_rows_checked"`
	// ChecksPass is true when the mirrored run had every row identical at
	// every rank and the unmirrored one some stale (so its rows did reach
	// rows that held other data and were not mirrored), neither run had a
	// failed load or store, and both loaded.
	ChecksPass bool `json:"checks_pass"`
}

// MirrorSummary is the rounds of one engine, staging and budget setting.
type MirrorSummary struct {
	Engine       string        `json:"engine"`
	Staging      string        `json:"staging"`
	LookupBudget string        `json:"lookup_budget"`
	Rounds       []MirrorRound `json:"rounds"`
	// Counted is the rounds whose checks passed: the median and the
	// ranges are theirs.
	Counted int `json:"counted"`
	// MedianRatio is the median of the counted rounds' on ÷ off (the mean
	// of the middle two for an even count; 0 when none counted).
	MedianRatio float64 `json:"median_ratio"`
	// OffGBpsMin … OnGBpsMax are the ranges of each side's throughput.
	OffGBpsMin float64 `json:"off_gbps_min"`
	OffGBpsMax float64 `json:"off_gbps_max"`
	OnGBpsMin  float64 `json:"on_gbps_min"`
	OnGBpsMax  float64 `json:"on_gbps_max"`
}

// SummarizeMirroring pairs the runs with mirroring off and on of one
// round, engine, staging and budget setting (results in the order they
// ran) and sums each setting's rounds up. Runs without their other half
// are left out; results without both sync settings give none.
func SummarizeMirroring(results []Result) []MirrorSummary {
	type setting struct{ engine, staging, budget string }
	type pair struct {
		off, on *Result
		first   string
	}
	var settings []setting
	pairs := map[setting]map[int]*pair{}
	for i := range results {
		r := &results[i]
		s := setting{r.Engine, r.Staging, r.LookupBudget}
		if pairs[s] == nil {
			pairs[s] = map[int]*pair{}
			settings = append(settings, s)
		}
		p := pairs[s][r.Round]
		if p == nil {
			p = &pair{first: r.Sync}
			pairs[s][r.Round] = p
		}
		switch r.Sync {
		case "off":
			p.off = r
		case "on":
			p.on = r
		}
	}
	var out []MirrorSummary
	for _, s := range settings {
		sum := MirrorSummary{Engine: s.engine, Staging: s.staging, LookupBudget: s.budget}
		rounds := make([]int, 0, len(pairs[s]))
		for round := range pairs[s] {
			rounds = append(rounds, round)
		}
		slices.Sort(rounds)
		var ratios, offs, ons []float64
		for _, round := range rounds {
			p := pairs[s][round]
			if p.off == nil || p.on == nil {
				continue
			}
			mr := MirrorRound{Round: max(round, 1), First: p.first, OffGBps: p.off.LoadGBps, OnGBps: p.on.LoadGBps,
				OnRowsIdentical: p.on.RowsIdentical, OnRowsChecked: p.on.RowsChecked,
				OffRowsIdentical: p.off.RowsIdentical, OffRowsChecked: p.off.RowsChecked}
			if mr.OffGBps > 0 {
				mr.Ratio = mr.OnGBps / mr.OffGBps
			}
			mr.ChecksPass = mr.OffGBps > 0 && mr.OnGBps > 0 &&
				p.on.RowsChecked > 0 && p.on.RowsIdentical == p.on.RowsChecked &&
				p.off.RowsIdentical < p.off.RowsChecked &&
				p.on.LoadErrors+p.on.StoreErrors+p.off.LoadErrors+p.off.StoreErrors == 0
			sum.Rounds = append(sum.Rounds, mr)
			if mr.ChecksPass {
				ratios, offs, ons = append(ratios, mr.Ratio), append(offs, mr.OffGBps), append(ons, mr.OnGBps)
			}
		}
		if len(sum.Rounds) == 0 {
			continue
		}
		sum.Counted = len(ratios)
		if sum.Counted > 0 {
			sum.MedianRatio = median(ratios)
			sum.OffGBpsMin, sum.OffGBpsMax = slices.Min(offs), slices.Max(offs)
			sum.OnGBpsMin, sum.OnGBpsMax = slices.Min(ons), slices.Max(ons)
		}
		out = append(out, sum)
	}
	return out
}

// median is the middle value of xs, the mean of the middle two for an even
// count; xs must not be empty.
func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// WriteMirroring prints each setting's rounds of mirroring on ÷ off, one
// line a round, then their median and each side's range.
func WriteMirroring(w io.Writer, summaries []MirrorSummary) {
	for _, sum := range summaries {
		fmt.Fprintf(w, "mirroring on ÷ off of the load throughput, %s engine, staging %s, lookup budget %s:\n",
			sum.Engine, sum.Staging, sum.LookupBudget)
		for _, r := range sum.Rounds {
			check := "checks pass"
			if !r.ChecksPass {
				check = "CHECKS FAIL, not counted"
			}
			fmt.Fprintf(w, "  round %d (%s first): off %.2f GB/s, on %.2f GB/s, on ÷ off %.2f; rows identical on %d/%d, off %d/%d; %s\n",
				r.Round, r.First, r.OffGBps, r.OnGBps, r.Ratio, r.OnRowsIdentical, r.OnRowsChecked, r.OffRowsIdentical, r.OffRowsChecked, check)
		}
		if sum.Counted == 0 {
			fmt.Fprintf(w, "  median on ÷ off: n/a, no round of %d passed its checks\n", len(sum.Rounds))
			continue
		}
		fmt.Fprintf(w, "  median on ÷ off %.2f of %d round(s) of %d; off %.2f–%.2f GB/s, on %.2f–%.2f GB/s\n",
			sum.MedianRatio, sum.Counted, len(sum.Rounds), sum.OffGBpsMin, sum.OffGBpsMax, sum.OnGBpsMin, sum.OnGBpsMax)
	}
}
