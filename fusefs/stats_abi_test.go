package fusefs

import (
	"bytes"
	"encoding/json"
	"flag"
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
	"github.com/kvtierfs/kvtierfs/internal/descriptors"
	"github.com/kvtierfs/kvtierfs/staging/diagnose"
	"github.com/kvtierfs/kvtierfs/sync/rowsync"
	"github.com/kvtierfs/kvtierfs/tiers/disk"
	"github.com/kvtierfs/kvtierfs/tiers/shared"
	"github.com/kvtierfs/kvtierfs/tiers/tier"
)

// newStatsFS returns an FS over an empty store with the parts of opts that
// stats.json reads, enough for Stats.
func newStatsFS(t *testing.T, opts Options) *FS {
	store, err := disk.Open(disk.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	opts.Store = store
	return statsFS(store, "", opts)
}

// noDescriptors is a descriptor count of none: the golden stats.json's.
func noDescriptors() (open, limit int, err error) { return 0, 0, nil }

// statsFS returns an FS at mountpoint over the store of opts, with the
// parts of opts that stats.json reads.
func statsFS(store *disk.Store, mountpoint string, opts Options) *FS {
	f := &FS{store: store, tier: tier.New(tier.Config{Store: store}), mountpoint: mountpoint, logger: slog.New(slog.DiscardHandler),
		diagnostics: diagnose.New(diagnose.Options{}), shared: opts.Shared, loads: core.NewLoads(core.Config{Store: store}),
		reserve: descriptors.New(noDescriptors, nil)}
	f.stats = tier.NewStats(f.statsConfig(opts))
	return f
}

// TestStatsFileDecodesWithTheABI reads stats.json as the daemon serves it and
// decodes it with ctlabi's types, unknown fields refused; its top-level
// fields are those of the golden stats.json the ABI keeps.
func TestStatsFileDecodesWithTheABI(t *testing.T) {
	f := newStatsFS(t, Options{})
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
// ctlabi.Metrics outside staging and the shared level (both off here) is
// exported, and one series per warning code.
func TestMetricsExportEveryListedStat(t *testing.T) {
	f := newStatsFS(t, Options{})
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
		optional := strings.HasPrefix(m.Field, "staging.") || strings.HasPrefix(m.Field, "shared.")
		if exported := got[m.Name] == 1; exported == optional {
			t.Errorf("metric %s exported %v with staging and the shared level off", m.Name, exported)
		}
	}
	if got["kvtierfs_warning"] != len(ctlabi.WarningCodes) {
		t.Errorf("kvtierfs_warning has %d series, want one per code (%d)", got["kvtierfs_warning"], len(ctlabi.WarningCodes))
	}
}

// updateGolden rewrites testdata/stats.json from what the mount serves:
// go test ./fusefs -run TestStatsFileBytesGolden -update, after adding a
// field to the ABI on purpose (and reading the diff).
var updateGolden = flag.Bool("update", false, "rewrite testdata/stats.json")

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
	f := statsFS(store, "/mnt/kv", Options{Store: store,
		Shared: fakeShared{shared.Stats{Dir: "/shared", QueueBlocks: 1, QueueBytes: 2, BytesBehind: 3, WrittenBlocks: 4, WrittenBytes: 5,
			DroppedBlocks: 6, FetchedBlocks: 7, FetchedBytes: 8, FetchSecondsAvg: 0.5, Lookups: 9, LookupHits: 10, NegativeHits: 11,
			CorruptDropped: 12, Timeouts: 13, LeaseHolder: "node-a", LeaseHeld: true, CapacityBytes: 14, UsedBytes: 15, EvictedBlocks: 16,
			JournalNames: 17, JournalFallbacks: 18}}})
	h, _, errno := (&statsFile{fsys: f}).Open(fuse.NewContext(t.Context(), &fuse.Caller{Owner: fuse.Owner{Uid: 0}}), syscall.O_RDONLY)
	if errno != 0 {
		t.Fatalf("open stats.json: %v", errno)
	}
	served := bytes.ReplaceAll(h.(*snapshotHandle).data, []byte(store.Stats().Store), []byte("/STORE"))
	if *updateGolden {
		if err := os.WriteFile("testdata/stats.json", served, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	golden, err := os.ReadFile("testdata/stats.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(served, golden) {
		t.Errorf("stats.json differs from testdata/stats.json:\n%s", served)
	}
}

// TestPeerStatesAreTheABIs: the peer states rowsync reports are copied into
// stats.json as they are, so they must be the ABI's (ctlabi.Peer.Serving).
func TestPeerStatesAreTheABIs(t *testing.T) {
	for rowsyncState, abiState := range map[string]string{rowsync.StateConnecting: ctlabi.PeerConnecting, rowsync.StateUp: ctlabi.PeerUp,
		rowsync.StateDown: ctlabi.PeerDown, rowsync.StateInbound: ctlabi.PeerInbound, rowsync.StateSelf: ctlabi.PeerSelf} {
		if rowsyncState != abiState {
			t.Errorf("rowsync reports state %q where the ABI says %q", rowsyncState, abiState)
		}
		if got, want := (ctlabi.Peer{State: abiState}).Serving(), (rowsync.PeerStats{State: rowsyncState}).Serving(); got != want {
			t.Errorf("state %q: ABI serving %v, rowsync %v", abiState, got, want)
		}
	}
}

// TestStatsConfigLeavesAbsentPartsNil: a part the mount does not have is a
// nil interface in the stats' config (not a nil pointer in one, which the
// snapshot would call), and the snapshot of a store alone has its sections
// absent.
func TestStatsConfigLeavesAbsentPartsNil(t *testing.T) {
	store := openStoreAt(t, t.TempDir())
	f := &FS{tier: tier.New(tier.Config{Store: store}), reserve: descriptors.New(noDescriptors, nil)} // every mount's (New)
	cfg := f.statsConfig(Options{Store: store})
	if cfg.Budget != nil || cfg.Stager != nil || cfg.Shared != nil || cfg.Sync != nil || cfg.Regions != nil ||
		cfg.Primer != nil || cfg.KVEvents != nil || cfg.Diagnostics != nil {
		t.Fatalf("a mount without them configured the stats with %+v", cfg)
	}
	if st := tier.NewStats(cfg).Snapshot(ctlabi.Counters{}); st.Staging != nil || st.Shared != nil || st.Replication != nil {
		t.Errorf("sections of parts the mount lacks: %+v", st)
	}
}
