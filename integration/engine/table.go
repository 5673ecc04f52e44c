package engine

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
)

// WriteTable prints results side by side, one column per run, with the same
// numbers as their JSON.
func WriteTable(w io.Writer, results []Result) error {
	if len(results) == 0 {
		return nil
	}
	g := results[0].Geometry
	fmt.Fprintf(w, "scenario %s: rows of %d B (slot %d B) × %d per node, %d tokens/chunk, TP %d on %d node(s), %s, groups %s\n",
		results[0].Scenario, g.RowBytes, g.SlotBytes, g.Rows, g.TokensPerChunk, g.WorldSize, g.Nodes, strings.ToUpper(g.KV), g.Groups)
	t := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	heads := make([]ctlabi.Stats, len(results))
	for i, r := range results {
		json.Unmarshal(r.Stats, &heads[i]) // an empty or foreign snapshot shows as zeros
	}
	row := func(label string, value func(r Result, mount ctlabi.Stats) string) {
		fmt.Fprintf(t, "%s\t", label)
		for i, r := range results {
			fmt.Fprintf(t, "%s\t", value(r, heads[i]))
		}
		fmt.Fprintln(t)
	}
	if slices.ContainsFunc(results, func(r Result) bool { return r.Round > 0 }) {
		row("round", func(r Result, _ ctlabi.Stats) string { return fmt.Sprint(r.Round) })
	}
	row("engine", func(r Result, _ ctlabi.Stats) string { return r.Engine })
	row("sync", func(r Result, _ ctlabi.Stats) string { return r.Sync })
	row("lookup budget", func(r Result, _ ctlabi.Stats) string { return r.LookupBudget })
	row("requests", func(r Result, _ ctlabi.Stats) string { return fmt.Sprint(r.Requests) })
	row("tokens total", func(r Result, _ ctlabi.Stats) string { return fmt.Sprint(r.TokensTotal) })
	row("tokens hit (not re-prefilled)", func(r Result, _ ctlabi.Stats) string { return fmt.Sprint(r.TokensHit) })
	row("coverage", func(r Result, _ ctlabi.Stats) string { return fmt.Sprintf("%.1f%%", 100*r.Coverage) })
	row("requests with no hit", func(r Result, _ ctlabi.Stats) string { return fmt.Sprint(r.ZeroHitRequests) })
	row("requests parked (no answer in 40 steps)", func(r Result, _ ctlabi.Stats) string { return fmt.Sprint(r.ParkedRequests) })
	row("mount: chains capped/keys withheld", func(_ Result, m ctlabi.Stats) string {
		return fmt.Sprintf("%d/%d", m.Counters.BudgetChainsCapped, m.Counters.BudgetKeysWithheld)
	})
	row("rows identical at the GPUs", func(r Result, _ ctlabi.Stats) string {
		return fmt.Sprintf("%d/%d", r.RowsIdentical, r.RowsChecked)
	})
	row("rows promoted", func(r Result, _ ctlabi.Stats) string { return fmt.Sprint(r.RowsPromoted) })
	row("waves", func(r Result, _ ctlabi.Stats) string { return fmt.Sprint(r.Waves) })
	row("peak summed RETRY per probe", func(r Result, _ ctlabi.Stats) string { return fmt.Sprint(r.RetryPeak) })
	row("primary rows pinned peak/total", func(r Result, _ ctlabi.Stats) string {
		return fmt.Sprintf("%d/%d", r.PrimaryPeakRows, r.PrimaryRows)
	})
	row("bytes written", func(r Result, _ ctlabi.Stats) string { return fmt.Sprintf("%.1f MB", float64(r.BytesWritten)/1e6) })
	row("bytes read", func(r Result, _ ctlabi.Stats) string { return fmt.Sprintf("%.1f MB", float64(r.BytesRead)/1e6) })
	row("staging", func(r Result, _ ctlabi.Stats) string { return r.Staging })
	row("step gap", func(r Result, _ ctlabi.Stats) string { return fmt.Sprintf("%.0f ms", 1000*r.StepGapSeconds) })
	row("load throughput", func(r Result, _ ctlabi.Stats) string { return fmt.Sprintf("%.2f GB/s", r.LoadGBps) })
	row("load wait, waves 2…n", func(r Result, _ ctlabi.Stats) string { return fmt.Sprintf("%.3f s", r.LaterWaveWaitSeconds) })
	row("head: bytes sent per mirrored row", func(_ Result, m ctlabi.Stats) string {
		if m.Counters.RowsMirrored == 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f MB", float64(headBytesSent(m))/float64(m.Counters.RowsMirrored)/1e6)
	})
	row("mount: loads from staging", func(_ Result, m ctlabi.Stats) string { return fmt.Sprint(m.Counters.LoadsFromStaging) })
	row("load/store errors", func(r Result, _ ctlabi.Stats) string { return fmt.Sprintf("%d/%d", r.LoadErrors, r.StoreErrors) })
	row("lookups (faccessat or match probes)", func(r Result, _ ctlabi.Stats) string { return fmt.Sprint(r.Lookups) })
	row("seconds", func(r Result, _ ctlabi.Stats) string { return fmt.Sprintf("%.2f", r.Seconds) })
	row("gpu", func(r Result, _ ctlabi.Stats) string { return r.GPU })
	row("mount: blocks", func(_ Result, m ctlabi.Stats) string { return fmt.Sprint(m.Disk.Blocks) })
	row("mount: reads/writes", func(_ Result, m ctlabi.Stats) string {
		return fmt.Sprintf("%d/%d", m.Counters.Reads, m.Counters.Writes)
	})
	row("mount: warnings", func(_ Result, m ctlabi.Stats) string {
		var codes []string
		for _, warn := range m.Warnings {
			codes = append(codes, warn.Code)
		}
		if len(codes) == 0 {
			return "none"
		}
		return strings.Join(codes, ",")
	})
	return t.Flush()
}

// WriteStagingRatios prints, for every engine and sync setting run with
// staging off and on, the load wait of waves 2…n and the load throughput of
// staging on ÷ off.
func WriteStagingRatios(w io.Writer, results []Result) {
	for _, on := range results {
		if on.Staging != "on" {
			continue
		}
		for _, off := range results {
			if off.Staging != "off" || off.Engine != on.Engine || off.Sync != on.Sync || off.Round != on.Round {
				continue
			}
			wait := "n/a (no later wave waited)"
			if off.LaterWaveWaitSeconds > 0 {
				wait = fmt.Sprintf("%.2f", on.LaterWaveWaitSeconds/off.LaterWaveWaitSeconds)
			}
			throughput := "n/a"
			if off.LoadGBps > 0 {
				throughput = fmt.Sprintf("%.2f", on.LoadGBps/off.LoadGBps)
			}
			round := ""
			if on.Round > 0 {
				round = fmt.Sprintf("round %d, ", on.Round)
			}
			fmt.Fprintf(w, "%s, %ssync %s, step gap %.0f ms: load wait of waves 2…n, staging on ÷ off %s; load throughput on ÷ off %s\n",
				on.Engine, round, on.Sync, 1000*on.StepGapSeconds, wait, throughput)
		}
	}
}

// WriteLegend says what the columns' engines are, before the table.
func WriteLegend(w io.Writer, results []Result) {
	seen := map[string]bool{}
	for _, r := range results {
		if seen[r.Engine] {
			continue
		}
		seen[r.Engine] = true
		switch r.Engine {
		case EngineStock:
			fmt.Fprintln(w, "engine stock: vLLM as the field runs it (the old EAGLE store filter, a lookup that promotes every key it confirms)")
		case EngineFixed:
			fmt.Fprintln(w, "engine fixed: with the fixes (EAGLE segment head kept, whole-prompt match without staging, hits staged in waves)")
		}
	}
	fmt.Fprintln(w, "sync: row mirroring between the nodes' daemons (--peer); coverage: prompt tokens served from the tiers instead of prefilled")
}

// WriteVerdict sums the runs up in one line each for the fixed engine: its
// coverage beside the stock engine's with the same sync, and whether every
// row that reached the GPUs was right and every load and store succeeded.
func WriteVerdict(w io.Writer, results []Result) {
	for _, fixed := range results {
		if fixed.Engine != EngineFixed {
			continue
		}
		against := ""
		for _, stock := range results {
			if stock.Engine == EngineStock && stock.Sync == fixed.Sync && stock.Staging == fixed.Staging && stock.Round == fixed.Round {
				against = fmt.Sprintf(" (stock engine %.1f%%)", 100*stock.Coverage)
			}
		}
		verdict := "PASS: every row at the GPUs right, no load or store failed"
		switch {
		case fixed.RowsIdentical != fixed.RowsChecked:
			verdict = fmt.Sprintf("FAIL: %d of %d rows at the GPUs differ across ranks", fixed.RowsChecked-fixed.RowsIdentical, fixed.RowsChecked)
		case fixed.LoadErrors+fixed.StoreErrors > 0:
			verdict = fmt.Sprintf("FAIL: %d loads and %d stores failed", fixed.LoadErrors, fixed.StoreErrors)
		}
		round := ""
		if fixed.Round > 0 {
			round = fmt.Sprintf("round %d, ", fixed.Round)
		}
		fmt.Fprintf(w, "verdict, fixed engine, %ssync %s, staging %s: coverage %.1f%%%s; %s\n",
			round, fixed.Sync, fixed.Staging, 100*fixed.Coverage, against, verdict)
	}
}

// headBytesSent is the bytes of rows the head's mount sent to all its peers.
func headBytesSent(m ctlabi.Stats) uint64 {
	var n uint64
	for _, p := range m.Peers {
		n += p.Bytes
	}
	return n
}
