package engine

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

// benchCommand is `kvtierfs bench` with args, its work directory in dir.
func benchCommand(dir string, args ...string) (*exec.Cmd, *bytes.Buffer, *bytes.Buffer) {
	cmd := exec.Command(mounttest.Binary(), append([]string{"bench", "--dir", dir}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	return cmd, &stdout, &stderr
}

// checkBenchCleanedUp fails if a bench process left a mount, a file in its
// work directory, a region file or a process of its own.
func checkBenchCleanedUp(t *testing.T, dir string, pid int) {
	t.Helper()
	checkCleanedUp(t, dir, fmt.Sprintf("kvtierbench_%d", pid))
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if cmdline, err := os.ReadFile(p); err == nil && bytes.Contains(cmdline, []byte(dir)) {
			t.Errorf("a process still runs in the bench's directory: %s: %q", p, cmdline)
		}
	}
}

// TestBenchJSON runs the command end to end: it starts its own daemons, prints
// one JSON object per run with the contract's fields, and removes everything.
func TestBenchJSON(t *testing.T) {
	dir := t.TempDir()
	cmd, stdout, stderr := benchCommand(dir, "--scenario", "eagle", "--row-bytes", "64KiB", "--requests", "1", "--gpu", "host", "--json")
	if err := cmd.Run(); err != nil {
		t.Fatalf("bench: %v\n%s", err, stderr)
	}
	checkBenchCleanedUp(t, dir, cmd.Process.Pid)
	var runs []map[string]json.RawMessage
	if err := json.Unmarshal(stdout.Bytes(), &runs); err != nil {
		t.Fatalf("decoding %s: %v", stdout, err)
	}
	if len(runs) != 2 {
		t.Fatalf("%d runs, want stock and fixed", len(runs))
	}
	for _, field := range []string{"scenario", "engine", "sync", "tokens_total", "tokens_hit", "coverage", "rows_checked",
		"rows_identical", "bytes_written", "bytes_read", "waves", "seconds", "stats"} {
		if _, ok := runs[1][field]; !ok {
			t.Errorf("JSON lacks %q", field)
		}
	}
	var stats struct{ Disk struct{ Blocks int } }
	if err := json.Unmarshal(runs[1]["stats"], &stats); err != nil || stats.Disk.Blocks == 0 {
		t.Errorf("stats of the mount: %s (%v)", runs[1]["stats"], err)
	}
	if string(runs[0]["engine"]) != `"stock"` || string(runs[0]["tokens_hit"]) != "0" || string(runs[1]["tokens_hit"]) == "0" {
		t.Errorf("stock then fixed, stock without hits: got %s %s, %s %s", runs[0]["engine"], runs[0]["tokens_hit"], runs[1]["engine"], runs[1]["tokens_hit"])
	}
}

// TestBenchTable checks the human output: the legend, the table, the
// mount's stat and the verdict, which fails a run whose rows differ at the
// GPUs (multinode without sync).
func TestBenchTable(t *testing.T) {
	dir := t.TempDir()
	cmd, stdout, stderr := benchCommand(dir, "multinode", "--row-bytes", "64KiB", "--rows", "16", "--promote", "8", "--prompts", "2", "--sync", "off", "--gpu", "host")
	if err := cmd.Run(); err != nil {
		t.Fatalf("bench: %v\n%s", err, stderr)
	}
	checkBenchCleanedUp(t, dir, cmd.Process.Pid)
	for _, want := range []string{"scenario multinode", "rows identical at the GPUs", "0/16", "kvtierfs stat of the head node's mount", "warnings:",
		"engine fixed: with the fixes", "verdict, fixed engine, sync off, staging on: coverage", "FAIL: 16 of 16 rows at the GPUs differ across ranks"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, stdout)
		}
	}
}

// TestBenchDisk checks that the disk scenario reaches package diskbench.
func TestBenchDisk(t *testing.T) {
	dir := t.TempDir()
	cmd, stdout, stderr := benchCommand(dir, "disk", "--row-bytes", "64KiB", "--blocks", "8", "--lookups", "16",
		"--threads", "2", "--drop-caches=false", "--json")
	if err := cmd.Run(); err != nil {
		t.Fatalf("bench disk: %v\n%s", err, stderr)
	}
	checkBenchCleanedUp(t, dir, cmd.Process.Pid)
	var res struct {
		Blocks        int               `json:"blocks"`
		VerifiedLoads int               `json:"verified_loads"`
		Measurements  []json.RawMessage `json:"measurements"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil || res.Blocks != 8 || res.VerifiedLoads != 8 || len(res.Measurements) == 0 {
		t.Fatalf("bench disk --json: %+v (%v):\n%s", res, err, stdout)
	}
}

// TestBenchBadFlags: every bad flag is refused before anything starts, with
// status 2 and a message naming the flag and what it accepts.
func TestBenchBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"nope"}, `--scenario "nope": want one of eagle, multinode, long-prefix, agent, disk`},
		{[]string{}, "--scenario: missing"},
		{[]string{"eagle", "--engine", "fast"}, `--engine "fast": want stock, upstream, fixed`},
		{[]string{"multinode", "--sync", "maybe"}, `--sync "maybe": want off, on`},
		{[]string{"eagle", "--nodes", "5"}, "--nodes 5: want 1 to 4"},
		{[]string{"eagle", "--row-bytes", "1000"}, "--row-bytes 1000: want a positive multiple of 4096"},
		{[]string{"eagle", "--gpu", "tpu"}, `--gpu "tpu": want auto, cuda or host`},
		{[]string{"eagle", "--groups", "full,eagle:3:2"}, "--groups"},
		{[]string{"eagle", "--promote", "4"}, "--promote does not apply to scenario eagle"},
		{[]string{"eagle", "--sync", "on"}, "--sync on: needs --nodes 2"},
		{[]string{"disk", "--engine", "stock"}, "--engine does not apply to scenario disk"},
		{[]string{"disk", "--blocks", "0"}, "--blocks 0"},
		{[]string{"eagle", "--rounds", "2"}, "--rounds does not apply to scenario eagle"},
		{[]string{"multinode", "--rounds", "0"}, "--rounds 0: want at least 1"},
		{[]string{"multinode", "--rounds", "2", "--sync", "on"}, "--rounds pairs a run with --sync off and one with on"},
		{[]string{"multinode", "--rounds", "2", "--sync", "off,on,off"}, "--rounds pairs a run with --sync off and one with on"},
	} {
		dir := t.TempDir()
		cmd, _, stderr := benchCommand(dir, tc.args...)
		err := cmd.Run()
		if exit, ok := err.(*exec.ExitError); !ok || exit.ExitCode() != 2 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("bench %v: %v, stderr %q; want status 2 and %q", tc.args, err, stderr, tc.want)
		}
		checkBenchCleanedUp(t, dir, cmd.Process.Pid)
	}
}

// TestBenchInterrupt sends SIGINT while the bench stores a long prompt: it
// stops, says so, and leaves no mount, daemon, region or file behind.
func TestBenchInterrupt(t *testing.T) {
	dir := t.TempDir()
	cmd, _, stderr := benchCommand(dir, "long-prefix", "--engine", "fixed", "--row-bytes", "64KiB", "--prompt-tokens", "20000000", "--gpu", "host")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if mounted, _ := mountedUnder(dir); len(mounted) > 0 {
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			<-exited
			t.Fatalf("the bench mounted nothing within 30 s:\n%s", stderr)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cmd.Process.Signal(syscall.SIGINT)
	select {
	case err := <-exited:
		if err == nil || !strings.Contains(stderr.String(), "interrupted") {
			t.Errorf("after SIGINT: %v, stderr %q; want a failure that says interrupted", err, stderr)
		}
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		<-exited
		t.Fatalf("the bench did not stop within 60 s of SIGINT:\n%s", stderr)
	}
	checkBenchCleanedUp(t, dir, cmd.Process.Pid)
}

// TestBenchProfile: with --profile a multinode run writes a CPU profile of
// every node's daemon and of the bench for its measured requests, and the
// cores each kept busy, and removes everything else.
func TestBenchProfile(t *testing.T) {
	dir, profiles := t.TempDir(), t.TempDir()
	cmd, _, stderr := benchCommand(dir, "multinode", "--nodes", "2", "--sync", "on", "--row-bytes", "256KiB", "--rows", "16", "--promote", "8", "--gpu", "host", "--profile", profiles)
	if err := cmd.Run(); err != nil {
		t.Fatalf("bench: %v\n%s", err, stderr)
	}
	checkBenchCleanedUp(t, dir, cmd.Process.Pid)
	for _, name := range []string{"node0-sync-on.pprof", "node1-sync-on.pprof", "bench-sync-on.pprof"} {
		f, err := os.Open(filepath.Join(profiles, name))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		z, err := gzip.NewReader(f) // a pprof profile is a gzipped protocol buffer
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if n, err := io.Copy(io.Discard, z); err != nil || n == 0 {
			t.Errorf("%s: %d bytes, %v", name, n, err)
		}
	}
	report, err := os.ReadFile(filepath.Join(profiles, "cpu-sync-on.txt"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{"measured requests: ", "machine: ", "node 0 daemon: ", "node 1 daemon: ", "bench (engine, ranks, GPU stage): "} {
		if !strings.Contains(string(report), "\n"+line) && !strings.HasPrefix(string(report), line) {
			t.Errorf("cpu-sync-on.txt lacks %q:\n%s", line, report)
		}
	}
	if !strings.Contains(stderr.String(), "--profile: measured requests") {
		t.Errorf("the run's progress does not report the CPU use:\n%s", stderr)
	}
}

// tableRow is the cells of the bench table's row whose label is label.
func tableRow(t *testing.T, out, label string) []string {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), label+"  "); ok {
			return strings.Fields(rest)
		}
	}
	t.Fatalf("the table has no row %q:\n%s", label, out)
	return nil
}

// TestBenchRounds: multinode --rounds 2 runs each round's sync off and on,
// on first in the second round, and prints each round's on ÷ off and their
// median, which agree with the table's columns of the runs.
func TestBenchRounds(t *testing.T) {
	dir := t.TempDir()
	cmd, stdout, stderr := benchCommand(dir, "multinode", "--row-bytes", "64KiB", "--rows", "16", "--promote", "8", "--prompts", "2", "--gpu", "host", "--rounds", "2")
	if err := cmd.Run(); err != nil {
		t.Fatalf("bench: %v\n%s", err, stderr)
	}
	checkBenchCleanedUp(t, dir, cmd.Process.Pid)
	out := stdout.String()
	rounds, syncs := tableRow(t, out, "round"), tableRow(t, out, "sync")
	if got := strings.Join(rounds, " ") + " / " + strings.Join(syncs, " "); got != "1 1 2 2 / off on on off" {
		t.Fatalf("table columns (rounds / syncs) %s, want 1 1 2 2 / off on on off:\n%s", got, out)
	}
	var gbps []float64 // the table's load throughput of each run, in its column
	cells := tableRow(t, out, "load throughput")
	for i := 0; i < len(cells); i += 2 { // "4.12 GB/s"
		var v float64
		if _, err := fmt.Sscanf(cells[i], "%g", &v); err != nil {
			t.Fatalf("load throughput %q: %v", cells, err)
		}
		gbps = append(gbps, v)
	}
	column := func(round, sync string) float64 {
		for i := range rounds {
			if rounds[i] == round && syncs[i] == sync {
				return gbps[i]
			}
		}
		t.Fatalf("no column of round %s sync %s", round, sync)
		return 0
	}
	if !strings.Contains(out, "mirroring on ÷ off of the load throughput, fixed engine, staging on, lookup budget auto:\n") {
		t.Fatalf("output lacks the rounds' heading:\n%s", out)
	}
	var ratios []float64
	for _, want := range []struct{ round, first string }{{"1", "off"}, {"2", "on"}} {
		prefix := fmt.Sprintf("  round %s (%s first): ", want.round, want.first)
		var line string
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, prefix) {
				line = l
			}
		}
		var off, on, ratio float64
		var onSame, onAll, offSame, offAll int
		var verdict string
		if _, err := fmt.Sscanf(strings.TrimPrefix(line, prefix), "off %g GB/s, on %g GB/s, on ÷ off %g; rows identical on %d/%d, off %d/%d; %s",
			&off, &on, &ratio, &onSame, &onAll, &offSame, &offAll, &verdict); err != nil {
			t.Fatalf("round %s's line %q: %v\n%s", want.round, line, err, out)
		}
		if off != column(want.round, "off") || on != column(want.round, "on") {
			t.Errorf("round %s: off %.2f, on %.2f; the table has %.2f, %.2f", want.round, off, on, column(want.round, "off"), column(want.round, "on"))
		}
		// The line's GB/s are rounded to 0.005: the ratio lies within what
		// they allow, itself rounded.
		if off > 0.01 && (ratio < (on-0.005)/(off+0.005)-0.005 || ratio > (on+0.005)/(off-0.005)+0.005) {
			t.Errorf("round %s: on ÷ off %.2f of %.2f ÷ %.2f", want.round, ratio, on, off)
		}
		if onSame != onAll || onAll == 0 || offSame >= offAll || verdict != "checks" {
			t.Errorf("round %s: rows identical on %d/%d, off %d/%d, %q; want every row with mirroring, some stale without, checks pass", want.round, onSame, onAll, offSame, offAll, verdict)
		}
		ratios = append(ratios, ratio)
	}
	var median, offMin, offMax, onMin, onMax float64
	var counted, of int
	var medianLine string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "  median on ÷ off ") {
			medianLine = l
		}
	}
	if _, err := fmt.Sscanf(medianLine, "  median on ÷ off %g of %d round(s) of %d; off %g–%g GB/s, on %g–%g GB/s",
		&median, &counted, &of, &offMin, &offMax, &onMin, &onMax); err != nil {
		t.Fatalf("median line %q: %v\n%s", medianLine, err, out)
	}
	if counted != 2 || of != 2 || median < (ratios[0]+ratios[1])/2-0.011 || median > (ratios[0]+ratios[1])/2+0.011 {
		t.Errorf("median %.2f of %d of %d rounds; the rounds' ratios are %v", median, counted, of, ratios)
	}
	if offMin != min(column("1", "off"), column("2", "off")) || offMax != max(column("1", "off"), column("2", "off")) ||
		onMin != min(column("1", "on"), column("2", "on")) || onMax != max(column("1", "on"), column("2", "on")) {
		t.Errorf("ranges off %.2f–%.2f, on %.2f–%.2f disagree with the table's %v", offMin, offMax, onMin, onMax, gbps)
	}
	for _, want := range []string{"verdict, fixed engine, round 1, sync off", "verdict, fixed engine, round 2, sync on, staging on: coverage 100.0%; PASS"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// TestBenchRoundsJSON: with --rounds, --json prints an object of the runs,
// each with its round, and the rounds' summary, computed from them; --profile
// DIR puts round N's profiles in DIR/roundN, both sync settings' side by side.
func TestBenchRoundsJSON(t *testing.T) {
	dir, profiles := t.TempDir(), t.TempDir()
	cmd, stdout, stderr := benchCommand(dir, "multinode", "--row-bytes", "64KiB", "--rows", "16", "--promote", "8", "--prompts", "1", "--gpu", "host", "--rounds", "1", "--json", "--profile", profiles)
	if err := cmd.Run(); err != nil {
		t.Fatalf("bench: %v\n%s", err, stderr)
	}
	checkBenchCleanedUp(t, dir, cmd.Process.Pid)
	if entries, err := os.ReadDir(profiles); err != nil || len(entries) != 1 || entries[0].Name() != "round1" {
		t.Errorf("--profile directory holds %v (%v); want round1 only", entries, err)
	}
	for _, name := range []string{"node0-sync-off.pprof", "node1-sync-on.pprof", "bench-sync-off.pprof", "cpu-sync-on.txt"} {
		if fi, err := os.Stat(filepath.Join(profiles, "round1", name)); err != nil || fi.Size() == 0 {
			t.Errorf("round1/%s: %v", name, err)
		}
	}
	var got struct {
		Runs      []Result        `json:"runs"`
		Mirroring []MirrorSummary `json:"mirroring"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
		t.Fatalf("decoding %s: %v", stdout, err)
	}
	if len(got.Runs) != 2 || got.Runs[0].Round != 1 || got.Runs[0].Sync != "off" || got.Runs[1].Round != 1 || got.Runs[1].Sync != "on" {
		t.Fatalf("runs %+v; want round 1 off then on", got.Runs)
	}
	if len(got.Mirroring) != 1 || len(got.Mirroring[0].Rounds) != 1 {
		t.Fatalf("mirroring %+v; want one setting of one round", got.Mirroring)
	}
	m, off, on := got.Mirroring[0], got.Runs[0], got.Runs[1]
	r := m.Rounds[0]
	if r.OffGBps != off.LoadGBps || r.OnGBps != on.LoadGBps || r.Ratio != on.LoadGBps/off.LoadGBps || r.First != "off" || !r.ChecksPass ||
		m.Counted != 1 || m.MedianRatio != r.Ratio || m.OffGBpsMin != off.LoadGBps || m.OnGBpsMax != on.LoadGBps {
		t.Errorf("mirroring %+v disagrees with the runs' load_gbps %v, %v (rows on %d/%d, off %d/%d)",
			m, off.LoadGBps, on.LoadGBps, on.RowsIdentical, on.RowsChecked, off.RowsIdentical, off.RowsChecked)
	}
}
