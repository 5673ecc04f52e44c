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
