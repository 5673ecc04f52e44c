package tier

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
	"github.com/kvtierfs/kvtierfs/staging"
	"github.com/kvtierfs/kvtierfs/staging/diagnose"
	"github.com/kvtierfs/kvtierfs/staging/lookupbudget"
	"github.com/kvtierfs/kvtierfs/sync/rowsync"
	"github.com/kvtierfs/kvtierfs/tiers/disk"
	"github.com/kvtierfs/kvtierfs/tiers/shared"
	"github.com/kvtierfs/kvtierfs/tiers/shm"
)

// fakeStatsStore is a store of the given stats and counters.
type fakeStatsStore struct {
	d disk.Stats
	c disk.Counters
}

func (s *fakeStatsStore) Stats() disk.Stats        { return s.d }
func (s *fakeStatsStore) Counters() *disk.Counters { return &s.c }

// statsOf is a part whose stats are st (the budget, staging, the shared level).
type statsOf[T any] struct{ st T }

func (p statsOf[T]) Stats() T { return p.st }

type fakeSync struct{ snap rowsync.Snapshot }

// fakeDescriptors are the daemon's descriptors as a test sets them.
type fakeDescriptors struct {
	open, limit int
	err         error
	refused     int64
}

func (f fakeDescriptors) Count() (int, int, error) { return f.open, f.limit, f.err }
func (f fakeDescriptors) Refused() int64           { return f.refused }

func (s fakeSync) Snapshot() rowsync.Snapshot { return s.snap }

type fakeStatsRegions struct {
	infos        []shm.Info
	refreshErr   error
	ignored      []shm.Ignored
	ignoredTotal int64
	faults       int64
}

func (r *fakeStatsRegions) Infos([]int64) []shm.Info { return r.infos }
func (r *fakeStatsRegions) Refresh() error           { return r.refreshErr }
func (r *fakeStatsRegions) Ignored() []shm.Ignored   { return r.ignored }
func (r *fakeStatsRegions) IgnoredNow() int          { return len(r.ignored) }
func (r *fakeStatsRegions) IgnoredTotal() int64      { return r.ignoredTotal }
func (r *fakeStatsRegions) Faults() int64            { return r.faults }

type fakeLooked int64

func (p fakeLooked) Looked() int64 { return int64(p) }

type fakeCounts [2]int64

func (k fakeCounts) Counts() (published, dropped int64) { return k[0], k[1] }

// fakeWarner raises its warnings and keeps the store state it judged.
type fakeWarner struct {
	warnings []ctlabi.Warning
	judged   *diagnose.StoreState
}

func (w fakeWarner) Warnings(st diagnose.StoreState) []ctlabi.Warning {
	*w.judged = st
	return w.warnings
}

// statsWith is a snapshot of a mount of the parts set, over a store of st.
func statsWith(t *testing.T, store *fakeStatsStore, set func(*StatsConfig)) ctlabi.Stats {
	t.Helper()
	cfg := StatsConfig{Store: store, Tier: New(Config{Store: &fakeStore{j: &journal{}}})}
	if set != nil {
		set(&cfg)
	}
	return NewStats(cfg).Snapshot(ctlabi.Counters{})
}

// warningsOf are the warnings of code among w.
func warningsOf(w []ctlabi.Warning, code string) []ctlabi.Warning {
	var out []ctlabi.Warning
	for _, x := range w {
		if x.Code == code {
			out = append(out, x)
		}
	}
	return out
}

// TestEveryWarning: each warning is raised, once and naming its evidence,
// when its part shows the failure, and not when it shows none.
func TestEveryWarning(t *testing.T) {
	up := rowsync.PeerStats{Addr: "10.0.0.2:7000", State: rowsync.StateUp}
	self := rowsync.PeerStats{Addr: "10.0.0.1:7000", State: rowsync.StateSelf}
	withRows := func(s *fakeStatsStore) { s.d.RowBytes = map[string]int64{"t": 4096} }
	cases := []struct {
		name  string
		store func(*fakeStatsStore)
		set   func(*StatsConfig)
		code  string
		// says is in the warning's message; "" when it is not raised.
		says string
	}{
		{name: "budget capped", code: ctlabi.WarnLookupBudgetCapped, says: "2 lookups found prefixes longer",
			set: func(c *StatsConfig) {
				c.Budget = statsOf[lookupbudget.Stats]{lookupbudget.Stats{ChainsCapped: 2, Rows: 8, KeysWithheld: 5}}
			}},
		{name: "budget never capped", code: ctlabi.WarnLookupBudgetCapped,
			set: func(c *StatsConfig) { c.Budget = statsOf[lookupbudget.Stats]{lookupbudget.Stats{Rows: 8}} }},
		{name: "shared unreachable", code: ctlabi.WarnSharedUnreachable, says: "the shared store /shared does not answer",
			set: func(c *StatsConfig) { c.Shared = statsOf[shared.Stats]{shared.Stats{Dir: "/shared"}} }},
		{name: "shared reachable", code: ctlabi.WarnSharedUnreachable,
			set: func(c *StatsConfig) { c.Shared = statsOf[shared.Stats]{shared.Stats{Dir: "/shared", Reachable: true}} }},
		{name: "shared behind and growing", code: ctlabi.WarnSharedBehind, says: "7 bytes behind and growing",
			set: func(c *StatsConfig) {
				c.Shared = statsOf[shared.Stats]{shared.Stats{Reachable: true, BytesBehind: 7, BehindGrowing: true}}
			}},
		{name: "shared behind, not growing", code: ctlabi.WarnSharedBehind,
			set: func(c *StatsConfig) { c.Shared = statsOf[shared.Stats]{shared.Stats{Reachable: true, BytesBehind: 7}} }},
		{name: "peer down", code: ctlabi.WarnPeerDown, says: "peer 10.0.0.3:7000 is down (refused)",
			set: func(c *StatsConfig) {
				c.Sync = fakeSync{rowsync.Snapshot{Peers: []rowsync.PeerStats{self, up,
					{Addr: "10.0.0.3:7000", State: rowsync.StateDown, LastError: "refused"}}, Replication: rowsync.GateSnapshot{Allowed: true}}}
			}},
		{name: "peers up", code: ctlabi.WarnPeerDown,
			set: func(c *StatsConfig) {
				c.Sync = fakeSync{rowsync.Snapshot{Peers: []rowsync.PeerStats{self, up,
					{State: rowsync.StateInbound}}, Replication: rowsync.GateSnapshot{Allowed: true}}}
			}},
		{name: "mirroring off by mismatches", code: ctlabi.WarnMirroringOff, says: "4 samples, 1 mismatches",
			set: func(c *StatsConfig) {
				c.Sync = fakeSync{rowsync.Snapshot{Peers: []rowsync.PeerStats{self, up},
					Replication: rowsync.GateSnapshot{Mode: "auto", Samples: 4, Mismatches: 1}}}
			}},
		{name: "mirroring off by the flag", code: ctlabi.WarnMirroringOff, says: "--replicated-kv off",
			set: func(c *StatsConfig) {
				c.Sync = fakeSync{rowsync.Snapshot{Peers: []rowsync.PeerStats{self, up},
					Replication: rowsync.GateSnapshot{Mode: rowsync.ModeOff.String()}}}
			}},
		{name: "a fresh pair is undecided, not off", code: ctlabi.WarnMirroringOff,
			set: func(c *StatsConfig) {
				c.Sync = fakeSync{rowsync.Snapshot{Peers: []rowsync.PeerStats{self, up}, Replication: rowsync.GateSnapshot{Mode: "auto"}}}
			}},
		{name: "mirroring off without other peers", code: ctlabi.WarnMirroringOff,
			set: func(c *StatsConfig) {
				c.Sync = fakeSync{rowsync.Snapshot{Peers: []rowsync.PeerStats{self},
					Replication: rowsync.GateSnapshot{Mode: rowsync.ModeOff.String()}}}
			}},
		{name: "shm unmappable", code: ctlabi.WarnShmUnmappable, says: "mmap refused",
			set: func(c *StatsConfig) { c.Regions = &fakeStatsRegions{refreshErr: errors.New("mmap refused")} }},
		{name: "shm mapped", code: ctlabi.WarnShmUnmappable,
			set: func(c *StatsConfig) { c.Regions = &fakeStatsRegions{} }},
		{name: "one shm file ignored", code: ctlabi.WarnShmIgnored, says: "/dev/shm/a matches --shm-glob but is not mapped (owner)",
			set: func(c *StatsConfig) {
				c.Regions = &fakeStatsRegions{ignored: []shm.Ignored{{Path: "/dev/shm/a", Reason: "owner"}}}
			}},
		{name: "shm files ignored", code: ctlabi.WarnShmIgnored, says: "2 files match --shm-glob but are not mapped, /dev/shm/a among them (owner)",
			set: func(c *StatsConfig) {
				c.Regions = &fakeStatsRegions{ignored: []shm.Ignored{{Path: "/dev/shm/a", Reason: "owner"}, {Path: "/dev/shm/b", Reason: "mode"}}}
			}},
		{name: "an ignored name is printable", code: ctlabi.WarnShmIgnored, says: `"/dev/shm/\x1b[31m" matches`,
			set: func(c *StatsConfig) {
				c.Regions = &fakeStatsRegions{ignored: []shm.Ignored{{Path: "/dev/shm/\x1b[31m", Reason: "owner"}}}
			}},
		{name: "no shm file ignored", code: ctlabi.WarnShmIgnored,
			set: func(c *StatsConfig) { c.Regions = &fakeStatsRegions{} }},
		{name: "region of no row size", code: ctlabi.WarnShmGeometry, says: "/dev/shm/kv: rows unknown", store: withRows,
			set: func(c *StatsConfig) {
				c.Regions = &fakeStatsRegions{infos: []shm.Info{{Path: "/dev/shm/kv", Warning: "rows unknown"}}}
			}},
		{name: "region sized by the store's rows", code: ctlabi.WarnShmGeometry, store: withRows,
			set: func(c *StatsConfig) {
				c.Regions = &fakeStatsRegions{infos: []shm.Info{{Path: "/dev/shm/kv", Rows: 2, RowBytes: 4096}}}
			}},
		{name: "region before the store has blocks", code: ctlabi.WarnShmGeometry,
			set: func(c *StatsConfig) {
				c.Regions = &fakeStatsRegions{infos: []shm.Info{{Path: "/dev/shm/kv", Warning: "rows unknown"}}}
			}},
		{name: "unproven blocks", code: ctlabi.WarnUnprovenBlocks, says: "2 block files found at mount",
			store: func(s *fakeStatsStore) { s.c.UnprovenBlocks.Store(2) }},
		{name: "one unproven block", code: ctlabi.WarnUnprovenBlocks, says: "1 block file found at mount",
			store: func(s *fakeStatsStore) { s.c.UnprovenBlocks.Store(1) }},
		{name: "every block proven", code: ctlabi.WarnUnprovenBlocks},
		{name: "checksum failures", code: ctlabi.WarnChecksumFailures, says: "1 block failed their checksum",
			store: func(s *fakeStatsStore) { s.c.ChecksumFailures.Store(1) }},
		{name: "no checksum failure", code: ctlabi.WarnChecksumFailures},
		{name: "no space, tmp files held", code: ctlabi.WarnNoSpace, says: "3 writes failed with ENOSPC; 10 bytes are held by 2 tmp files",
			store: func(s *fakeStatsStore) { s.c.NoSpace.Store(3); s.d.InFlightTmp, s.d.TmpBytes = 2, 10 }},
		{name: "no space, store full", code: ctlabi.WarnNoSpace, says: "1 write failed with ENOSPC because the store filesystem is full",
			store: func(s *fakeStatsStore) { s.c.NoSpace.Store(1) }},
		{name: "space", code: ctlabi.WarnNoSpace},
		{name: "other files full", code: ctlabi.WarnOtherFilesFull, says: "2 writes outside the block layout failed with EDQUOT: the store tracks 5 such files, its bound (1 untracked",
			store: func(s *fakeStatsStore) {
				s.c.OtherFilesRefused.Store(2)
				s.d.OtherFilesMax, s.d.OtherFilesUntracked = 5, 1
			}},
		{name: "other files within their bound", code: ctlabi.WarnOtherFilesFull},
		{name: "store I/O errors", code: ctlabi.WarnStoreIOErrors, says: "3 reads or writes failed in the store filesystem",
			store: func(s *fakeStatsStore) { s.c.IOErrors.Store(3) }},
		{name: "one store I/O error", code: ctlabi.WarnStoreIOErrors, says: "1 read or write failed",
			store: func(s *fakeStatsStore) { s.c.IOErrors.Store(1) }},
		{name: "no store I/O error", code: ctlabi.WarnStoreIOErrors},
		{name: "the diagnostics' warning", code: ctlabi.WarnHashSeedDrift, says: "drift",
			set: func(c *StatsConfig) {
				c.Diagnostics = fakeWarner{[]ctlabi.Warning{{Code: ctlabi.WarnHashSeedDrift, Message: "drift"}}, &diagnose.StoreState{}}
			}},
		{name: "the diagnostics see nothing", code: ctlabi.WarnHashSeedDrift,
			set: func(c *StatsConfig) { c.Diagnostics = fakeWarner{nil, &diagnose.StoreState{}} }},
		{name: "descriptors nearly all held", code: ctlabi.WarnDescriptorsLow, says: "holds 19000 of the 20000 file descriptors",
			set: func(c *StatsConfig) { c.Descriptors = fakeDescriptors{open: 19000, limit: 20000} }},
		{name: "fewer descriptors free than kept", code: ctlabi.WarnDescriptorsLow, says: "holds 800 of the 1000 file descriptors its limit allows: opens through the mount that would leave fewer than 250 free are refused with ENFILE",
			set: func(c *StatsConfig) { c.Descriptors = fakeDescriptors{open: 800, limit: 1000} }},
		{name: "opens refused", code: ctlabi.WarnDescriptorsLow, says: "3 opens through the mount refused with ENFILE to keep 512 of the daemon's 20000 file descriptors for its own work (it holds 100)",
			set: func(c *StatsConfig) { c.Descriptors = fakeDescriptors{open: 100, limit: 20000, refused: 3} }},
		{name: "descriptors to spare", code: ctlabi.WarnDescriptorsLow,
			set: func(c *StatsConfig) { c.Descriptors = fakeDescriptors{open: 17999, limit: 20000} }},
		{name: "descriptors not counted", code: ctlabi.WarnDescriptorsLow,
			set: func(c *StatsConfig) { c.Descriptors = fakeDescriptors{err: errors.New("no /proc")} }},
		{name: "blocks changed outside", code: ctlabi.WarnChangedOutside, says: "2 blocks failed their checksum and were removed (the engine recomputes them) after their files were changed outside the daemon",
			store: func(s *fakeStatsStore) { s.c.ChangedOutside.Store(2) }},
		{name: "no block changed outside", code: ctlabi.WarnChangedOutside},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			store := &fakeStatsStore{}
			if c.store != nil {
				c.store(store)
			}
			st := statsWith(t, store, c.set)
			got := warningsOf(st.Warnings, c.code)
			switch {
			case c.says == "" && len(got) > 0:
				t.Errorf("%s raised: %+v", c.code, got)
			case c.says != "" && (len(got) != 1 || !strings.Contains(got[0].Message, c.says)):
				t.Errorf("%s warnings %+v, want one saying %q", c.code, got, c.says)
			}
			if others := len(st.Warnings) - len(got); others > 0 {
				t.Errorf("other warnings raised: %+v", st.Warnings)
			}
		})
	}
	raised := map[string]bool{}
	for _, c := range cases {
		raised[c.code] = raised[c.code] || c.says != ""
	}
	// The diagnostics' own codes are theirs to test (staging/diagnose).
	for _, code := range ctlabi.WarningCodes {
		if !raised[code] && !slices.Contains([]string{ctlabi.WarnWriteOnlyGroup, ctlabi.WarnWriteOnlyTier, ctlabi.WarnPrimaryTierExhausted}, code) {
			t.Errorf("no case raises %s", code)
		}
	}
}

// TestCounterWarningsClearWhenQuiet: a warning a counter raises stays while
// the counter grew within the window, and clears once it has been quiet.
func TestCounterWarningsClearWhenQuiet(t *testing.T) {
	now := time.Unix(1e9, 0)
	store := &fakeStatsStore{}
	s := NewStats(StatsConfig{Store: store, Tier: New(Config{Store: &fakeStore{j: &journal{}}}), WarningWindow: time.Minute,
		Now: func() time.Time { return now }})
	raised := func() bool {
		return len(warningsOf(s.Snapshot(ctlabi.Counters{}).Warnings, ctlabi.WarnChecksumFailures)) > 0
	}
	if raised() {
		t.Fatal("raised before any failure")
	}
	store.c.ChecksumFailures.Add(1)
	if !raised() {
		t.Fatal("not raised after a failure")
	}
	now = now.Add(30 * time.Second)
	if !raised() {
		t.Error("cleared within the window")
	}
	now = now.Add(time.Minute)
	if raised() {
		t.Error("still raised after a quiet window")
	}
	if got := s.Snapshot(ctlabi.Counters{}).Counters.ChecksumFailures; got != 1 {
		t.Errorf("checksum_failures %d after the warning cleared, want the total, 1", got)
	}
}

// TestSnapshotAssemblesEveryPart: every part's stats reach their section
// and counters, the mount's own counters are kept, and the diagnostics
// judge the store and the primary region's rows.
func TestSnapshotAssemblesEveryPart(t *testing.T) {
	w := newWorld(t, true)
	w.store.present[ref(hashA).Rel] = 4096
	w.budget.allow[hashA] = true
	w.gate.open = false
	w.tier.Lookup(ref(hashA), 7) // withheld by mirroring
	w.tier.Match([]byte("not json"), w.tier.MatchThread())

	store := &fakeStatsStore{d: disk.Stats{Store: "/store", Blocks: 3, NeverLookedUp: 1, RowBytes: map[string]int64{"t": 4096},
		Groups: map[string]disk.GroupStats{"0": {Blocks: 3}}, StorePhases: map[string]disk.PhaseStats{"rename": {Count: 2}}}}
	store.c.Lookups.Store(11)
	store.c.StoresReadBack.Store(12)
	judged := &diagnose.StoreState{}
	regions := &fakeStatsRegions{infos: []shm.Info{{Path: "/dev/shm/a", Rows: 5, RowBytes: 4096}, {Path: "/dev/shm/b", Rows: 9, RowBytes: 4096}},
		ignoredTotal: 13, faults: 14}
	s := NewStats(StatsConfig{Mountpoint: "/mnt/kv", Store: store, Tier: w.tier,
		Budget:      statsOf[lookupbudget.Stats]{lookupbudget.Stats{KeysWithheld: 15}},
		Stager:      statsOf[staging.Stats]{staging.Stats{Hits: 16}},
		Shared:      statsOf[shared.Stats]{shared.Stats{Dir: "/shared", Reachable: true, Lookups: 17}},
		Sync:        fakeSync{rowsync.Snapshot{Peers: []rowsync.PeerStats{{Addr: "p", State: rowsync.StateSelf}}, Replication: rowsync.GateSnapshot{Mode: "on", Allowed: true}, RowsMirrored: 18, AuthFailures: 19, HandshakesEvicted: 25, RowsLate: 26}},
		Regions:     regions,
		Primer:      fakeLooked(20),
		KVEvents:    fakeCounts{21, 22},
		Diagnostics: fakeWarner{judged: judged}})
	st := s.Snapshot(ctlabi.Counters{LoadsFromStore: 23, TiersPrimed: 24})

	c := st.Counters
	for name, got := range map[string][2]int64{
		"loads_from_store": {c.LoadsFromStore, 23}, "tiers_primed": {c.TiersPrimed, 24}, "lookups": {c.Lookups, 11},
		"stores_read_back": {c.StoresReadBack, 12}, "lookups_withheld": {c.LookupsWithheld, 1}, "matches": {c.Matches, w.tier.Matches()},
		"budget_keys_withheld": {c.BudgetKeysWithheld, 15}, "names_primed": {c.NamesPrimed, 20},
		"kv_events_published": {c.KVEventsPublished, 21}, "kv_events_dropped": {c.KVEventsDropped, 22},
		"rows_mirrored": {c.RowsMirrored, 18}, "auth_failures": {c.AuthFailures, 19}, "shm_ignored": {c.ShmIgnored, 13},
		"shm_faults": {c.ShmFaults, 14}, "handshakes_evicted": {c.HandshakesEvicted, 25}, "rows_late": {c.RowsLate, 26},
	} {
		if got[0] != got[1] {
			t.Errorf("%s = %d, want %d", name, got[0], got[1])
		}
	}
	if st.Mountpoint != "/mnt/kv" || st.Disk.Store != "/store" || st.Disk.StorePhases["rename"].Count != 2 || st.Groups["0"].Blocks != 3 {
		t.Errorf("mountpoint %q, disk %+v, groups %+v", st.Mountpoint, st.Disk, st.Groups)
	}
	if st.Staging == nil || st.Staging.Hits != 16 || st.Shared == nil || st.Shared.Lookups != 17 ||
		st.Replication == nil || st.Replication.Mode != "on" || len(st.Peers) != 1 || st.Peers[0].Addr != "p" {
		t.Errorf("staging %+v, shared %+v, replication %+v, peers %+v", st.Staging, st.Shared, st.Replication, st.Peers)
	}
	if len(st.Primary.Regions) != 2 || st.Primary.Regions[1].Path != "/dev/shm/b" {
		t.Errorf("regions %+v", st.Primary.Regions)
	}
	if *judged != (diagnose.StoreState{Blocks: 3, NeverLookedUp: 1, PrimaryRows: 9}) {
		t.Errorf("the diagnostics judged %+v, want 3 blocks, 1 never looked up, 9 rows (the largest region's)", *judged)
	}
	if len(st.Warnings) != 0 {
		t.Errorf("warnings %+v", st.Warnings)
	}
}

// TestSnapshotOfTheStoreAlone: without the optional parts their sections
// are absent and the lists are empty, not null (stats.json's readers).
func TestSnapshotOfTheStoreAlone(t *testing.T) {
	st := statsWith(t, &fakeStatsStore{}, nil)
	if st.Staging != nil || st.Shared != nil || st.Replication != nil {
		t.Errorf("staging %+v, shared %+v, replication %+v: want absent", st.Staging, st.Shared, st.Replication)
	}
	if st.Peers == nil || st.Warnings == nil || st.Primary.Regions == nil || st.Primary.Ignored == nil || st.Groups == nil {
		t.Errorf("a list or map is null: %+v", st)
	}
}

// setEveryField sets every exported number, string and boolean of the
// struct v points to, so that a copy that leaves a field out shows as zero.
func setEveryField(v any) {
	s := reflect.ValueOf(v).Elem()
	for i := range s.NumField() {
		switch f := s.Field(i); {
		case !f.CanSet():
		case f.CanInt():
			f.SetInt(int64(i + 1))
		case f.CanFloat():
			f.SetFloat(float64(i) + 0.5)
		case f.Kind() == reflect.String:
			f.SetString("s")
		case f.Kind() == reflect.Bool:
			f.SetBool(true)
		}
	}
}

// zeroFields names the fields of the struct v that hold their zero value.
func zeroFields(v any) []string {
	s := reflect.ValueOf(v)
	var out []string
	for i := range s.NumField() {
		if s.Field(i).IsZero() {
			out = append(out, s.Type().Field(i).Name)
		}
	}
	return out
}

// TestABISectionsCopyEveryField: the shared level's and the store's stats,
// every field set, leave no field of their ABI section unset.
func TestABISectionsCopyEveryField(t *testing.T) {
	var sh shared.Stats
	setEveryField(&sh)
	if zero := zeroFields(*abiShared(sh)); len(zero) > 0 {
		t.Errorf("abiShared leaves %v unset", zero)
	}
	d := disk.Stats{RowBytes: map[string]int64{"t": 1}, StorePhases: map[string]disk.PhaseStats{"rename": {Count: 1}}}
	setEveryField(&d)
	if zero := zeroFields(abiDisk(d)); len(zero) > 0 {
		t.Errorf("abiDisk leaves %v unset", zero)
	}
}

// TestDescriptorsSection: stats.json carries the daemon's descriptors, the
// level kept for its own work and the opens refused.
func TestDescriptorsSection(t *testing.T) {
	st := statsWith(t, &fakeStatsStore{}, func(c *StatsConfig) {
		c.Descriptors = fakeDescriptors{open: 300, limit: 1000, refused: 7}
	})
	if want := (ctlabi.Descriptors{Open: 300, Limit: 1000, Kept: 250}); st.Descriptors != want || st.Counters.OpensRefused != 7 {
		t.Errorf("descriptors %+v, opens refused %d; want %+v and 7", st.Descriptors, st.Counters.OpensRefused, want)
	}
}
