//go:build bench

package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvtierfs/kvtierfs/integration/engine"
)

func TestBenchFlagRules(t *testing.T) {
	cases := []struct {
		args    []string
		want    string // scenario, or empty when refused
		errText string
	}{
		{[]string{"disk"}, "disk", ""},
		{[]string{"--scenario", "chain"}, "chain", ""},
		{[]string{"eagle", "--scenario", "eagle"}, "eagle", ""},
		{[]string{"disk", "--blocks", "8", "--lookups", "100"}, "disk", ""},
		{[]string{"chain", "--half-zero", "--staging-bytes", "64MiB"}, "chain", ""},
		{[]string{"agent", "--sessions", "2", "--sync", "on"}, "agent", ""},
		{[]string{"multinode", "--promote", "16"}, "multinode", ""},
		{[]string{}, "", "--scenario: missing"},
		{[]string{"nosuch"}, "", `--scenario "nosuch": want one of`},
		{[]string{"disk", "chain"}, "", "expected one SCENARIO, got 2"},
		{[]string{"disk", "--scenario", "chain"}, "", "scenario given twice"},
		{[]string{"disk", "--half-zero"}, "", "--half-zero does not apply to scenario disk"},
		{[]string{"disk", "--engine", "stock"}, "", "--engine does not apply to scenario disk"},
		{[]string{"chain", "--sync", "on"}, "", "--sync does not apply to scenario chain"},
		{[]string{"eagle", "--blocks", "8"}, "", "--blocks does not apply to scenario eagle"},
		{[]string{"disk", "--rows", "8"}, "", "--rows does not apply to scenario disk"},
		{[]string{"eagle", "--sessions", "2"}, "", "--sessions does not apply to scenario eagle"},
		{[]string{"agent", "--promote", "2"}, "", "--promote does not apply to scenario agent"},
		{[]string{"agent", "--prompts", "2"}, "", "--prompts does not apply to scenario agent"},
		{[]string{"multinode", "--profile", "p"}, "multinode", ""},
		{[]string{"disk", "--profile", "p"}, "", "--profile does not apply to scenario disk"},
		{[]string{"multinode", "--rounds", "3"}, "multinode", ""},
		{[]string{"chain", "--rounds", "3"}, "chain", ""},
		{[]string{"eagle", "--rounds", "3"}, "", "--rounds does not apply to scenario eagle"},
		{[]string{"agent", "--rounds", "3"}, "", "--rounds does not apply to scenario agent"},
	}
	for _, c := range cases {
		b := newBenchFlags()
		if err := parseFlags(b.fl, c.args); err != nil {
			t.Fatalf("%q: %v", c.args, err)
		}
		got, err := b.scenarioName()
		if err == nil {
			err = b.checkApplicable(got)
		}
		switch {
		case c.want != "" && (err != nil || got != c.want):
			t.Errorf("%q: scenario %q, %v; want %q", c.args, got, err, c.want)
		case c.want == "" && (err == nil || !strings.Contains(err.Error(), c.errText)):
			t.Errorf("%q: error %v; want one containing %q", c.args, err, c.errText)
		}
	}
}

// TestBenchRoundCount: --rounds of multinode is 0 without the flag (one run
// of each setting, as before the flag), else at least 1, pairing off and on.
func TestBenchRoundCount(t *testing.T) {
	off, on := false, true
	for _, c := range []struct {
		args    []string
		syncs   []bool
		want    int
		errText string
	}{
		{[]string{"multinode"}, []bool{off, on}, 0, ""},
		{[]string{"multinode", "--sync", "on"}, []bool{on}, 0, ""},
		{[]string{"multinode", "--rounds", "1"}, []bool{off, on}, 1, ""},
		{[]string{"multinode", "--rounds", "3"}, []bool{on, off}, 3, ""},
		{[]string{"multinode", "--rounds", "0"}, []bool{off, on}, 0, "--rounds 0: want at least 1"},
		{[]string{"multinode", "--rounds", "2"}, []bool{on}, 0, "want --sync off,on"},
		{[]string{"multinode", "--rounds", "2"}, []bool{off, off}, 0, "want --sync off,on"},
		{[]string{"multinode", "--rounds", "2"}, []bool{off, on, off}, 0, "want --sync off,on"},
	} {
		b := newBenchFlags()
		if err := parseFlags(b.fl, c.args); err != nil {
			t.Fatalf("%q: %v", c.args, err)
		}
		got, err := b.roundCount(c.syncs)
		switch {
		case c.errText == "" && (err != nil || got != c.want):
			t.Errorf("%q, syncs %v: %d, %v; want %d", c.args, c.syncs, got, err, c.want)
		case c.errText != "" && (err == nil || !strings.Contains(err.Error(), c.errText)):
			t.Errorf("%q, syncs %v: error %v; want one containing %q", c.args, c.syncs, err, c.errText)
		}
	}
}

// TestProfileDirsDoNotCollide: every planned run's profiles, named by the
// sync setting within their directory, land where no other run's do, and
// a plan of one engine, staging and budget keeps --profile's plain layout.
func TestProfileDirsDoNotCollide(t *testing.T) {
	for _, rounds := range []int{0, 2} {
		engines, stagings, budgets := []string{"stock", "fixed"}, []bool{false, true}, []bool{true, false}
		seen := map[string]bool{}
		for _, run := range engine.PlanRuns(rounds, engines, []bool{false, true}, stagings, budgets) {
			file := filepath.Join(profileDir("p", run, len(engines)*len(stagings)*len(budgets)), "node0-sync-"+onOff(run.Sync)+".pprof")
			if seen[file] {
				t.Errorf("rounds %d: two runs write %s", rounds, file)
			}
			seen[file] = true
		}
	}
	one := engine.PlanRuns(3, []string{"fixed"}, []bool{false, true}, []bool{true}, []bool{true})
	if got := profileDir("p", one[2], 1); got != filepath.Join("p", "round2") {
		t.Errorf("a plan of one setting puts round 2's profiles in %s, want p/round2", got)
	}
	if got := profileDir("p", engine.PlannedRun{Engine: "fixed"}, 1); got != "p" {
		t.Errorf("a plan of one setting and no rounds puts its profiles in %s, want p", got)
	}
}
