package main

import (
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
)

// watchSnapshots returns two snapshots 2 s apart with known differences.
func watchSnapshots() (prev, cur ctlabi.Stats) {
	prev = ctlabi.Stats{
		Mountpoint:  "/mnt/kvtier",
		Disk:        ctlabi.Disk{Blocks: 100, PhysicalBytes: 50 << 30, CapacityBytes: 100 << 30, FreeBytes: 50 << 30, Evictions: 10},
		Primary:     ctlabi.Primary{Regions: []ctlabi.Region{{Path: "/dev/shm/vllm_offload_1.mmap", Size: 124 << 18, Rows: 124, RowBytes: 1 << 18}}},
		Counters:    ctlabi.Counters{Lookups: 1000, LookupHits: 500, Reads: 10, ReadBytes: 10 << 20, Writes: 5, WriteBytes: 5 << 20, RowsMirrored: 10},
		Staging:     &ctlabi.Staging{BudgetBytes: 4 << 30, Bytes: 1 << 30, Chains: 2, Hits: 4},
		Peers:       []ctlabi.Peer{{Addr: "nodeB:7470", State: "up", RowsSent: 10}},
		Replication: &ctlabi.Replication{Allowed: true},
	}
	cur = prev
	cur.Disk.Evictions = 14
	cur.Counters = ctlabi.Counters{Lookups: 1200, LookupHits: 550, Reads: 30, ReadBytes: 30 << 20, Writes: 9, WriteBytes: 9 << 20, RowsMirrored: 30}
	cur.Staging = &ctlabi.Staging{BudgetBytes: 4 << 30, Bytes: 3 << 30, Chains: 1, Hits: 14}
	cur.Peers = []ctlabi.Peer{{Addr: "nodeB:7470", State: "down", RowsSent: 30, LastError: "connection refused"}}
	cur.Warnings = []ctlabi.Warning{{Code: "peer_down", Message: "peer nodeB:7470 is down"}}
	return prev, cur
}

func TestRenderWatch(t *testing.T) {
	prev, cur := watchSnapshots()
	r := snapshotRates(&prev, &cur, 2*time.Second)
	var out strings.Builder
	renderWatch(&out, cur, r, time.Date(2026, 12, 1, 1, 2, 3, 0, time.UTC), 2*time.Second)
	view := out.String()
	for _, want := range []string{
		"kvtierfs /mnt/kvtier   01:02:03   every 2s",
		"disk     [" + strings.Repeat("█", 10) + strings.Repeat("·", 10) + "]  50.0%  50.0 GiB used, 50.0 GiB free, 100 blocks",
		"staging  [" + strings.Repeat("█", 15) + strings.Repeat("·", 5) + "]  75.0%  3.0 GiB of 4.0 GiB, 1 chain streaming",
		"primary  /dev/shm/vllm_offload_1.mmap: 31.0 MiB, 124 rows × 256.0 KiB",
		"lookups  100.0/s    hits 25.0%",
		"loads    10.0/s     10.0 MiB/s, 5.0/s from staging",
		"stores   2.0/s      2.0 MiB/s, 2.0/s evictions",
		"mirrored 10.0/s",
		"peer     nodeB:7470 down, 10.0 rows/s, last error: connection refused",
		"  [peer_down] peer nodeB:7470 is down",
	} {
		if !strings.Contains(view, want) {
			t.Errorf("view lacks %q:\n%s", want, view)
		}
	}

	out.Reset()
	renderWatch(&out, prev, snapshotRates(nil, &prev, 0), time.Now(), time.Second)
	if view := out.String(); !strings.Contains(view, "lookups  -") || !strings.Contains(view, "warnings: none") {
		t.Errorf("first frame shows rates or warnings it cannot know:\n%s", view)
	}
}

func TestRenderWatchLine(t *testing.T) {
	prev, cur := watchSnapshots()
	var out strings.Builder
	renderWatchLine(&out, cur, snapshotRates(&prev, &cur, 2*time.Second), time.Date(2026, 12, 1, 1, 2, 3, 0, time.UTC))
	want := "time=2026-12-01T01:02:03Z disk=50.0% blocks=100 staging=75.0% primary_rows=124 lookups_per_s=100.0 loads_per_s=10.0 " +
		"load_bytes_per_s=10485760 stores_per_s=2.0 store_bytes_per_s=2097152 mirrored_per_s=10.0 peers_up=0/1 warnings=peer_down\n"
	if out.String() != want {
		t.Errorf("line\n%q\nwant\n%q", out.String(), want)
	}
	out.Reset()
	renderWatchLine(&out, prev, nil, time.Now())
	// logfmt: key=value fields, values without spaces, quotes or '='.
	field := regexp.MustCompile(`^[a-z_]+=[^ "=]+$`)
	for _, f := range strings.Fields(out.String()) {
		if !field.MatchString(f) {
			t.Errorf("field %q of a watch line is not logfmt", f)
		}
	}
	if strings.Count(out.String(), " ")+1 != len(strings.Fields(out.String())) {
		t.Errorf("a value holds a space: %q", out.String())
	}
}

// TestWatchHistoryAndWidth renders the terminal view with history and a
// long warning: the history lists each snapshot's rates, and fitted to 80
// columns no line is wider.
func TestWatchHistoryAndWidth(t *testing.T) {
	prev, cur := watchSnapshots()
	cur.Warnings = append(cur.Warnings, ctlabi.Warning{Code: "no_space", Message: strings.Repeat("a long message ", 20)})
	r := snapshotRates(&prev, &cur, 2*time.Second)
	at := time.Date(2026, 12, 1, 1, 2, 3, 0, time.UTC)
	var view strings.Builder
	renderWatch(&view, cur, r, at, 2*time.Second)
	renderHistory(&view, []historyRow{{at: at.Add(-2 * time.Second), rates: rates{}}, {at: at, rates: *r}})
	fitted := fitWidth(view.String(), 80)
	for _, want := range []string{"time      lookups/s   hits   loads/s", "01:02:01        0.0      -       0.0", "01:02:03      100.0  25.0%      10.0    10.0 MiB"} {
		if !strings.Contains(fitted, want) {
			t.Errorf("history lacks %q:\n%s", want, fitted)
		}
	}
	for _, line := range strings.Split(fitted, "\n") {
		if n := utf8.RuneCountInString(line); n > 80 {
			t.Errorf("a line of %d columns: %q", n, line)
		}
	}
	if !strings.Contains(fitted, "[no_space] a long message a long message") || !strings.Contains(fitted, "…") {
		t.Errorf("the long warning is not cut to the width:\n%s", fitted)
	}
}

func TestBar(t *testing.T) {
	cases := map[[2]int64]string{
		{0, 100}:   "[" + strings.Repeat("·", 20) + "]   0.0%",
		{100, 100}: "[" + strings.Repeat("█", 20) + "] 100.0%",
		{150, 100}: "[" + strings.Repeat("█", 20) + "] 100.0%",
		{1, 0}:     "[" + strings.Repeat("·", 20) + "]   0.0%",
	}
	for in, want := range cases {
		if got := bar(in[0], in[1]); got != want {
			t.Errorf("bar(%d, %d) = %q, want %q", in[0], in[1], got, want)
		}
	}
}
