package fusefs

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvtierfs/kvtierfs/fusefs/core"
	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
	"github.com/kvtierfs/kvtierfs/staging/diagnose"
	"github.com/kvtierfs/kvtierfs/tiers/disk"
	"github.com/kvtierfs/kvtierfs/tiers/shared"
)

// newStatsFS returns an FS over an empty store, enough for Stats.
func newStatsFS(t *testing.T) *FS {
	store, err := disk.Open(disk.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	return &FS{store: store, logger: slog.New(slog.DiscardHandler), diagnostics: diagnose.New(diagnose.Options{}), recent: diagnose.NewRecent(0, nil),
		loads: core.NewLoads(core.Config{Store: store})}
}

// TestStatsFileDecodesWithTheABI reads stats.json as the daemon serves it and
// decodes it with ctlabi's types, unknown fields refused; its top-level
// fields are those of the golden stats.json the ABI keeps.
func TestStatsFileDecodesWithTheABI(t *testing.T) {
	f := newStatsFS(t)
	h, _, errno := (&statsFile{fsys: f}).Open(fuse.NewContext(t.Context(), &fuse.Caller{Owner: fuse.Owner{Uid: 0}}), syscall.O_RDONLY)
	if errno != 0 {
		t.Fatalf("open stats.json: %v", errno)
	}
	served := h.(*snapshotHandle).data
	dec := json.NewDecoder(bytes.NewReader(served))
	dec.DisallowUnknownFields()
	var st ctlabi.Stats
	if err := dec.Decode(&st); err != nil {
		t.Fatalf("decoding the daemon's stats.json with ctlabi.Stats: %v\n%s", err, served)
	}
	if _, err := dec.Token(); err != io.EOF {
		t.Fatalf("data after the stats object: %v", err)
	}
	golden, err := os.ReadFile("ctlabi/testdata/stats.json")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := topLevelFields(t, served), topLevelFields(t, golden); !isSubset(got, want) {
		t.Errorf("the daemon serves fields %v, the golden stats.json has %v", got, want)
	}
}

func topLevelFields(t *testing.T, doc []byte) []string {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(doc, &fields); err != nil {
		t.Fatal(err)
	}
	var names []string
	for name := range fields {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

func isSubset(some, all []string) bool {
	for _, s := range some {
		if !slices.Contains(all, s) {
			return false
		}
	}
	return true
}

// TestMetricsExportEveryListedStat gathers the mount's metrics: each of
// ctlabi.Metrics outside staging (off here) is exported, and one series per
// warning code.
func TestMetricsExportEveryListedStat(t *testing.T) {
	f := newStatsFS(t)
	reg := prometheus.NewPedanticRegistry()
	if _, err := newMetrics(reg, f); err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, family := range families {
		got[family.GetName()] = len(family.GetMetric())
	}
	for _, m := range ctlabi.Metrics {
		if exported := got[m.Name] == 1; exported == strings.HasPrefix(m.Field, "staging.") {
			t.Errorf("metric %s exported %v with staging off", m.Name, exported)
		}
	}
	if got["kvtierfs_warning"] != len(ctlabi.WarningCodes) {
		t.Errorf("kvtierfs_warning has %d series, want one per code (%d)", got["kvtierfs_warning"], len(ctlabi.WarningCodes))
	}
}

// TestStatsFileBytesGolden serves stats.json from a mount over an empty
// store with a shared level whose every field is set, and compares the
// bytes with testdata/stats.json (the store's temporary path written as
// /STORE): the assembly of the snapshot, sections left empty and warnings
// included, stays byte for byte what readers have parsed so far.
func TestStatsFileBytesGolden(t *testing.T) {
	dir := t.TempDir()
	store, err := disk.Open(disk.Config{Dir: dir, Capacity: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	f := &FS{store: store, mountpoint: "/mnt/kv", logger: slog.New(slog.DiscardHandler), diagnostics: diagnose.New(diagnose.Options{}),
		recent: diagnose.NewRecent(0, nil), loads: core.NewLoads(core.Config{Store: store}),
		shared: fakeShared{shared.Stats{Dir: "/shared", QueueBlocks: 1, QueueBytes: 2, BytesBehind: 3, WrittenBlocks: 4, WrittenBytes: 5,
			DroppedBlocks: 6, FetchedBlocks: 7, FetchedBytes: 8, FetchSecondsAvg: 0.5, Lookups: 9, LookupHits: 10, NegativeHits: 11,
			CorruptDropped: 12, Timeouts: 13, LeaseHolder: "node-a", LeaseHeld: true, CapacityBytes: 14, UsedBytes: 15, EvictedBlocks: 16,
			JournalNames: 17, JournalFallbacks: 18}}}
	h, _, errno := (&statsFile{fsys: f}).Open(fuse.NewContext(t.Context(), &fuse.Caller{Owner: fuse.Owner{Uid: 0}}), syscall.O_RDONLY)
	if errno != 0 {
		t.Fatalf("open stats.json: %v", errno)
	}
	served := bytes.ReplaceAll(h.(*snapshotHandle).data, []byte(store.Stats().Store), []byte("/STORE"))
	golden, err := os.ReadFile("testdata/stats.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(served, golden) {
		t.Errorf("stats.json differs from testdata/stats.json:\n%s", served)
	}
}
