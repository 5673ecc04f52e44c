package tier

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
	"github.com/kvtierfs/kvtierfs/staging/lookupbudget"
	"github.com/kvtierfs/kvtierfs/tiers/block"
	"github.com/kvtierfs/kvtierfs/tiers/disk"
	"github.com/kvtierfs/kvtierfs/tiers/shm"
)

// journal records, in order, what the fakes were told.
type journal struct{ lines []string }

func (j *journal) add(format string, args ...any) {
	j.lines = append(j.lines, fmt.Sprintf(format, args...))
}

// take returns the lines so far and starts again.
func (j *journal) take() []string {
	lines := j.lines
	j.lines = nil
	return lines
}

// fakeStore holds the blocks of present and tells its one listener as a
// disk.Store does: Published inside Publish.
type fakeStore struct {
	j           *journal
	present     map[string]int64
	listen      func(disk.Event)
	publishErr  error
	makeDirsErr error
	phases      []disk.Phase
	stats       disk.Stats
}

func (s *fakeStore) Lookup(rel string, thread uint32) bool {
	_, ok := s.present[rel]
	s.j.add("store lookup %s by %d", rel, thread)
	return ok
}

func (s *fakeStore) Size(rel string) (int64, bool) {
	size, ok := s.present[rel]
	return size, ok
}

func (s *fakeStore) Publish(tmpRel, destRel string) error {
	s.j.add("store publish %s as %s", tmpRel, destRel)
	if s.publishErr != nil {
		return s.publishErr
	}
	s.present[destRel] = 4096
	s.listen(disk.Event{Kind: disk.Published, Rel: destRel, Size: 4096})
	return nil
}

func (s *fakeStore) Remove(rel string) error {
	s.j.add("store remove %s", rel)
	delete(s.present, rel)
	return nil
}

func (s *fakeStore) Listen(fn func(disk.Event)) {
	if s.listen != nil {
		panic("the tier listens to the store twice")
	}
	s.listen = fn
}

func (s *fakeStore) TimePhase(p disk.Phase, start time.Time) { s.phases = append(s.phases, p) }

func (s *fakeStore) CountMissedLookup() { s.j.add("store missed lookup") }

func (s *fakeStore) Stats() disk.Stats { return s.stats }

func (s *fakeStore) MakeDirs(relDir string) error {
	s.j.add("store makes %s", relDir)
	if s.makeDirsErr != nil {
		return s.makeDirsErr
	}
	return nil
}

type fakeShared struct {
	j    *journal
	hold map[string]bool
}

func (s *fakeShared) Lookup(rel string) bool           { return s.hold[rel] }
func (s *fakeShared) LookedUp(rel string, size int64)  { s.j.add("shared looked up %s %d", rel, size) }
func (s *fakeShared) Published(rel string, size int64) { s.j.add("write-behind %s %d", rel, size) }

type fakeStager struct{ j *journal }

func (s fakeStager) NoteLookup(ref block.Ref, thread uint32, present bool) {
	s.j.add("staging lookup %s by %d present=%v", ref.Rel, thread, present)
}
func (s fakeStager) NoteStore(ref block.Ref)  { s.j.add("staging store %s", ref.Rel) }
func (s fakeStager) Invalidate(ref block.Ref) { s.j.add("staging invalidate %s", ref.Rel) }

// fakeBudget answers present only for keys in allow, and asks each lookup
// of mustAsk's tiers.
type fakeBudget struct {
	j       *journal
	allow   map[string]bool
	mustAsk bool
	rows    int
}

func (b *fakeBudget) Answer(key lookupbudget.Key, thread uint32, found bool) bool {
	b.j.add("budget answer %s found=%v", key.Hash, found)
	return found && b.allow[key.Hash]
}
func (b *fakeBudget) MustAsk(tier string) bool       { return b.mustAsk }
func (b *fakeBudget) NoteStore(key lookupbudget.Key) { b.j.add("budget store %s", key.Hash) }
func (b *fakeBudget) Loaded(key lookupbudget.Key)    { b.j.add("budget loaded %s", key.Hash) }
func (b *fakeBudget) NoteIOThread(thread uint32)     { b.j.add("budget io thread %d", thread) }
func (b *fakeBudget) Rows() int                      { return b.rows }
func (b *fakeBudget) Exempt(tier string)             { b.j.add("budget exempts %s", tier) }
func (b *fakeBudget) SetRows(rows int) {
	b.rows = rows
	b.j.add("budget rows %d", rows)
}
func (b *fakeBudget) NoteGroup(tier string, group int) { b.j.add("budget group %s %d", tier, group) }

type fakeDiagnostics struct{ j *journal }

func (d fakeDiagnostics) Stored(ref block.Ref, bytes int64) {
	d.j.add("diagnostics stored %s %d", ref.Rel, bytes)
}
func (d fakeDiagnostics) Read(ref block.Ref, bytes int64) {
	d.j.add("diagnostics read %s %d", ref.Rel, bytes)
}
func (d fakeDiagnostics) MissedLookup(tier string, group int) {
	d.j.add("diagnostics missed %s group %d", tier, group)
}
func (d fakeDiagnostics) LookedUp(ref block.Ref, present bool) {
	d.j.add("diagnostics lookup %s present=%v", ref.Rel, present)
}

type fakeKVEvents struct{ j *journal }

func (k fakeKVEvents) BlockGone(rel string) { k.j.add("kv gone %s", rel) }

// fakeRegions has regions of the rows given, and journals the row sizes
// it was asked about.
type fakeRegions struct {
	j    *journal
	rows []int64
}

func (r *fakeRegions) Infos(rowSizes []int64) []shm.Info {
	r.j.add("regions for row sizes %v", rowSizes)
	var out []shm.Info
	for _, rows := range r.rows {
		out = append(out, shm.Info{Rows: rows})
	}
	return out
}

type fakeGate struct{ open bool }

// fakePrimer owns one thread.
type fakePrimer struct{ thread uint32 }

func (p fakePrimer) Owns(thread uint32) bool { return thread == p.thread }

func (g *fakeGate) ServeLoads() bool { return g.open }

// world is a tier over fakes of everything it tells and asks.
type world struct {
	j       *journal
	store   *fakeStore
	shared  *fakeShared
	budget  *fakeBudget
	regions *fakeRegions
	gate    *fakeGate
	tier    *Tier
}

func newWorld(t *testing.T, withGate bool, mount ...Listener) *world {
	t.Helper()
	j := &journal{}
	w := &world{j: j, store: &fakeStore{j: j, present: map[string]int64{}}, shared: &fakeShared{j: j, hold: map[string]bool{}},
		budget: &fakeBudget{j: j, allow: map[string]bool{}, rows: 1}, regions: &fakeRegions{j: j}}
	cfg := Config{Store: w.store, Shared: w.shared, Stager: fakeStager{j}, Budget: w.budget, Diagnostics: fakeDiagnostics{j},
		KVEvents: fakeKVEvents{j}, Primer: fakePrimer{thread: 99}, Regions: w.regions}
	if withGate {
		w.gate = &fakeGate{open: true}
		cfg.Gate = w.gate
	}
	w.tier = New(cfg, mount...)
	return w
}

// ref is the block of hash in tier "t", group 0.
func ref(hash string) block.Ref { return block.Name{Tier: "t", Group: 0, Hash: hash}.Ref() }

const (
	hashA = "0123456789abcdef0123456789abcdef"
	hashB = "fedcba9876543210fedcba9876543210"
)

// TestEventsReachListenersInOrder: each event of a block's life reaches
// every listener in the documented order (staging, budget, diagnostics, KV
// events, write-behind, then the mount's), each as its kind concerns it;
// Leaving comes before the store acts, Published from inside its Publish.
func TestEventsReachListenersInOrder(t *testing.T) {
	var w *world
	var heard []Kind
	w = newWorld(t, false, func(e Event) {
		w.j.add("mount %d %s size=%d", e.Kind, e.Ref.Rel, e.Size)
		heard = append(heard, e.Kind)
	}, func(e Event) { w.j.add("mount's second %d", e.Kind) })
	a := ref(hashA)
	steps := []struct {
		what string
		do   func()
		want []string
	}{
		{"publish", func() {
			if err := w.tier.Publish(a.Rel+".tmp", a); err != nil {
				t.Fatal(err)
			}
		}, []string{
			"staging invalidate " + a.Rel,
			fmt.Sprintf("mount %d %s size=0", Leaving, a.Rel),
			fmt.Sprintf("mount's second %d", Leaving),
			"store publish " + a.Rel + ".tmp as " + a.Rel,
			"staging store " + a.Rel,
			"budget store " + hashA,
			"diagnostics stored " + a.Rel + " 4096",
			"write-behind " + a.Rel + " 4096",
			fmt.Sprintf("mount %d %s size=4096", Published, a.Rel),
			fmt.Sprintf("mount's second %d", Published),
		}},
		{"unlink", func() {
			if err := w.tier.Unlink(a); err != nil {
				t.Fatal(err)
			}
		}, []string{
			"staging invalidate " + a.Rel,
			fmt.Sprintf("mount %d %s size=0", Leaving, a.Rel),
			fmt.Sprintf("mount's second %d", Leaving),
			"store remove " + a.Rel,
		}},
		{"the store's unlink", func() { w.store.listen(disk.Event{Kind: disk.Unlinked, Rel: a.Rel}) }, []string{
			"kv gone " + a.Rel,
			fmt.Sprintf("mount %d %s size=0", Unlinked, a.Rel),
			fmt.Sprintf("mount's second %d", Unlinked),
		}},
		{"the store's removal", func() { w.store.listen(disk.Event{Kind: disk.Removed, Rel: a.Rel}) }, []string{
			"staging invalidate " + a.Rel,
			"kv gone " + a.Rel,
			fmt.Sprintf("mount %d %s size=0", Evicted, a.Rel),
			fmt.Sprintf("mount's second %d", Evicted),
		}},
		{"the store's import", func() { w.store.listen(disk.Event{Kind: disk.Imported, Rel: a.Rel}) }, []string{
			fmt.Sprintf("mount %d %s size=0", Imported, a.Rel),
			fmt.Sprintf("mount's second %d", Imported),
		}},
		{"an event of no block", func() { w.store.listen(disk.Event{Kind: disk.Removed, Rel: "t/notablock"}) }, nil},
	}
	for _, step := range steps {
		step.do()
		if got := w.j.take(); !slices.Equal(got, step.want) {
			t.Errorf("%s told\n%q\nwant\n%q", step.what, got, step.want)
		}
	}
	if want := []Kind{Leaving, Published, Leaving, Unlinked, Evicted, Imported}; !slices.Equal(heard, want) {
		t.Errorf("the mount heard %v, want %v", heard, want)
	}
	if !slices.Equal(w.store.phases, []disk.Phase{disk.PhaseIndex}) {
		t.Errorf("phases timed %v, want the one publish's index phase", w.store.phases)
	}
}

// TestFailedPublishTellsOnlyLeaving: a publish the store refuses was told
// as leaving (the old bytes may be gone) and never as published.
func TestFailedPublishTellsOnlyLeaving(t *testing.T) {
	w := newWorld(t, false)
	w.store.publishErr = syscall.EIO
	a := ref(hashA)
	if err := w.tier.Publish(a.Rel+".tmp", a); !errors.Is(err, syscall.EIO) {
		t.Fatalf("publish: %v, want the store's EIO", err)
	}
	want := []string{"staging invalidate " + a.Rel, "store publish " + a.Rel + ".tmp as " + a.Rel}
	if got := w.j.take(); !slices.Equal(got, want) {
		t.Errorf("told %q, want %q", got, want)
	}
}

// TestFirstPublishSizesTheBudget: a publish while the budget knows no rows
// sizes it from the regions; once it knows them, publishes do not.
func TestFirstPublishSizesTheBudget(t *testing.T) {
	w := newWorld(t, false)
	w.budget.rows = 0
	w.regions.rows = []int64{4}
	a, b := ref(hashA), ref(hashB)
	if err := w.tier.Publish(a.Rel+".tmp", a); err != nil {
		t.Fatal(err)
	}
	if got := w.j.take(); !slices.Contains(got, "budget rows 4") {
		t.Errorf("the first publish did not size the budget: %q", got)
	}
	if err := w.tier.Publish(b.Rel+".tmp", b); err != nil {
		t.Fatal(err)
	}
	if got := w.j.take(); slices.ContainsFunc(got, func(line string) bool { return strings.HasPrefix(line, "budget rows") }) {
		t.Errorf("a publish sized a budget that knows its rows: %q", got)
	}
}

// TestSizeBudget: the budget learns the rows of the largest region, asked
// with the store's distinct row sizes, and every numbered group of every
// tier; without regions or a budget nothing is sized.
func TestSizeBudget(t *testing.T) {
	w := newWorld(t, false)
	w.regions.rows = []int64{5, 9, 7}
	w.store.stats = disk.Stats{RowBytes: map[string]int64{"a": 8192, "b": 4096, "c": 8192},
		Groups: map[string]disk.GroupStats{"0": {}, "3": {}, "x": {}}}
	w.tier.SizeBudget()
	got := w.j.take()
	want := []string{"regions for row sizes [4096 8192]", "budget rows 9"}
	if len(got) < 2 || !slices.Equal(got[:2], want) {
		t.Fatalf("told %q, want %q first", got, want)
	}
	groups := got[2:]
	slices.Sort(groups)
	wantGroups := []string{"budget group a 0", "budget group a 3", "budget group b 0", "budget group b 3", "budget group c 0", "budget group c 3"}
	if !slices.Equal(groups, wantGroups) {
		t.Errorf("groups noted %q, want %q", groups, wantGroups)
	}
	for _, cfg := range []Config{{Store: &fakeStore{j: w.j}, Regions: w.regions}, {Store: &fakeStore{j: w.j}, Budget: w.budget}} {
		New(cfg).SizeBudget()
		if got := w.j.take(); len(got) != 0 {
			t.Errorf("a tier without a budget or regions told %q", got)
		}
	}
}

// TestLookupVerdicts: the engine's lookup answers local, then shared, and
// the lookup budget and mirroring may withhold what a level holds; staging,
// the diagnostics and the shared level's admission hear the answer as the
// budget gave it.
func TestLookupVerdicts(t *testing.T) {
	cases := []struct {
		name     string
		local    bool
		shared   bool
		allow    bool // the budget answers present
		mustAsk  bool
		gateDown bool
		want     Verdict
		withheld int64
		// told are the lines past the store's lookup and the budget's answer.
		told []string
	}{
		{name: "present", local: true, allow: true, want: Verdict{Answer: Local},
			told: []string{"staging lookup %s by 7 present=true", "diagnostics lookup %s present=true", "shared looked up %s 4096"}},
		{name: "present, asked each time", local: true, allow: true, mustAsk: true, want: Verdict{Answer: Local, AskEachTime: true},
			told: []string{"staging lookup %s by 7 present=true", "diagnostics lookup %s present=true", "shared looked up %s 4096"}},
		{name: "absent", want: Verdict{Answer: Absent},
			told: []string{"staging lookup %s by 7 present=false", "diagnostics lookup %s present=false"}},
		{name: "withheld by the budget", local: true, want: Verdict{Answer: Withheld},
			told: []string{"staging lookup %s by 7 present=false", "diagnostics lookup %s present=false"}},
		{name: "shared only", shared: true, allow: true, want: Verdict{Answer: InShared},
			told: []string{"staging lookup %s by 7 present=true", "diagnostics lookup %s present=true"}},
		{name: "shared only, withheld by the budget", shared: true, want: Verdict{Answer: Withheld},
			told: []string{"staging lookup %s by 7 present=false", "diagnostics lookup %s present=false"}},
		{name: "mirroring down", local: true, allow: true, gateDown: true, want: Verdict{Answer: Withheld}, withheld: 1,
			told: []string{"staging lookup %s by 7 present=true", "diagnostics lookup %s present=true", "shared looked up %s 4096"}},
		{name: "absent, mirroring down", gateDown: true, want: Verdict{Answer: Absent},
			told: []string{"staging lookup %s by 7 present=false", "diagnostics lookup %s present=false"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := newWorld(t, true)
			a := ref(hashA)
			if c.local {
				w.store.present[a.Rel] = 4096
			}
			w.shared.hold[a.Rel] = c.shared
			w.budget.allow[hashA] = c.allow
			w.budget.mustAsk = c.mustAsk
			w.gate.open = !c.gateDown
			if got := w.tier.Lookup(a, 7); got != c.want {
				t.Errorf("verdict %+v, want %+v", got, c.want)
			}
			want := []string{"store lookup " + a.Rel + " by 7", fmt.Sprintf("budget answer %s found=%v", hashA, c.local || c.shared)}
			for _, line := range c.told {
				want = append(want, fmt.Sprintf(line, a.Rel))
			}
			if got := w.j.take(); !slices.Equal(got, want) {
				t.Errorf("told\n%q\nwant\n%q", got, want)
			}
			if got := w.tier.LookupsWithheld(); got != c.withheld {
				t.Errorf("%d lookups withheld by mirroring, want %d", got, c.withheld)
			}
		})
	}
}

// TestLookupWithoutBudgetOrGate: a tier with neither answers as the levels
// hold the block.
func TestLookupWithoutBudgetOrGate(t *testing.T) {
	store := &fakeStore{j: &journal{}, present: map[string]int64{ref(hashA).Rel: 1}}
	tr := New(Config{Store: store})
	if got := tr.Lookup(ref(hashA), 1); got != (Verdict{Answer: Local}) {
		t.Errorf("a stored block: %+v", got)
	}
	if got := tr.Lookup(ref(hashB), 1); got != (Verdict{Answer: Absent}) {
		t.Errorf("an absent block: %+v", got)
	}
	if !tr.ServesLoads() {
		t.Error("without a gate a load is not served")
	}
}

// TestMatchProbesPastBudget: a match's probes answer what a level holds
// past the lookup budget (which exempts the tier) and are told as lookups;
// with mirroring down nothing is a hit, and nothing counts as withheld.
func TestMatchProbesPastBudget(t *testing.T) {
	w := newWorld(t, true)
	a, b, c := ref(hashA), ref(hashB), ref("00"+hashA[2:])
	w.store.present[a.Rel] = 4096
	w.shared.hold[b.Rel] = true
	request, err := ctlabi.EncodeMatchRequest(ctlabi.MatchRequest{Tier: "t",
		Groups: []ctlabi.GroupSpec{{Group: 0, Kind: ctlabi.KindFull, Keys: []string{hashA, hashB, c.Name.Hash}}}})
	if err != nil {
		t.Fatal(err)
	}
	thread := w.tier.MatchThread()
	if thread&matchThreadBit == 0 || w.tier.MatchThread() == thread {
		t.Errorf("match threads %#x then the same again, want fresh ids with bit 31", thread)
	}
	for _, gateOpen := range []bool{true, false} {
		w.gate.open = gateOpen
		res, err := ctlabi.DecodeMatchResult(w.tier.Match(request, thread))
		if err != nil {
			t.Fatal(err)
		}
		want := 0
		if gateOpen {
			want = 2 // a, then b from the shared level; c is absent
		}
		if res.HitChunks != want {
			t.Errorf("serving %v: %d chunks hit, want %d", gateOpen, res.HitChunks, want)
		}
		got := w.j.take()
		if len(got) == 0 || got[0] != "budget exempts t" || slices.ContainsFunc(got, func(line string) bool { return strings.HasPrefix(line, "budget answer") }) {
			t.Errorf("serving %v: the budget was told %q, want only the exemption", gateOpen, got)
		}
		if !slices.Contains(got, fmt.Sprintf("staging lookup %s by %d present=true", a.Rel, thread)) || !slices.Contains(got, "shared looked up "+a.Rel+" 4096") {
			t.Errorf("serving %v: a probe was not told as a lookup: %q", gateOpen, got)
		}
	}
	if w.tier.Matches() != 2 || w.tier.LookupsWithheld() != 0 {
		t.Errorf("%d matches, %d lookups withheld; want 2 and 0", w.tier.Matches(), w.tier.LookupsWithheld())
	}
	if _, err := ctlabi.DecodeMatchResult(w.tier.Match([]byte("not json"), thread)); err == nil {
		t.Error("a malformed request was answered without an error")
	}
}

// TestLoaded: a block opened for a load is told to the budget (its row and
// the engine's I/O thread) and the diagnostics.
func TestLoaded(t *testing.T) {
	w := newWorld(t, false)
	a := ref(hashA)
	w.tier.Loaded(a, 9, 4096)
	w.tier.NoteIOThread(10)
	want := []string{"budget loaded " + hashA, "budget io thread 9", "diagnostics read " + a.Rel + " 4096", "budget io thread 10"}
	if got := w.j.take(); !slices.Equal(got, want) {
		t.Errorf("told %q, want %q", got, want)
	}
}

// TestMissedDirCountsTheEnginesLayoutMisses: a lookup ending at a missing
// directory of the layout is counted by the store and the diagnostics; the
// primer's own lookups and names outside the layout are not.
func TestMissedDirCountsTheEnginesLayoutMisses(t *testing.T) {
	w := newWorld(t, false)
	prefix := "t/" + hashA[:3]
	group := prefix + "/" + hashA[3:5] + "_g2"
	cases := []struct {
		rel    string
		thread uint32
		want   []string
	}{
		{prefix, 1, []string{"store missed lookup", "diagnostics missed t group -1"}},
		{group, 1, []string{"store missed lookup", "diagnostics missed t group 2"}},
		{group, 99, nil},
		{"t/notlayout", 1, nil},
		{"t", 1, nil},
	}
	for _, c := range cases {
		w.tier.MissedDir(c.rel, c.thread)
		if got := w.j.take(); !slices.Equal(got, c.want) {
			t.Errorf("missed %s by %d: told %q, want %q", c.rel, c.thread, got, c.want)
		}
	}
}

// TestSharedDirMakesWhatTheSharedLevelHolds: a layout directory the shared
// level holds is made in the store; deeper, hidden or unheld names are not,
// and a store that cannot make it answers false.
func TestSharedDirMakesWhatTheSharedLevelHolds(t *testing.T) {
	w := newWorld(t, false)
	for _, rel := range []string{"t", "t/abc", "t/abc/de_g0", "t/abc/de_g0/x", ".hidden"} {
		w.shared.hold[rel] = true
	}
	cases := []struct {
		rel  string
		want bool
	}{{"t", true}, {"t/abc", true}, {"t/abc/de_g0", true}, {"t/abc/de_g0/x", false}, {".hidden", false}, {"u", false}}
	for _, c := range cases {
		if got := w.tier.SharedDir(c.rel); got != c.want {
			t.Errorf("SharedDir(%s) = %v, want %v", c.rel, got, c.want)
		}
		made := slices.Contains(w.j.take(), "store makes "+c.rel)
		if made != c.want {
			t.Errorf("SharedDir(%s): made in the store %v, want %v", c.rel, made, c.want)
		}
	}
	w.store.makeDirsErr = syscall.EACCES
	if w.tier.SharedDir("t/abc") {
		t.Error("a directory the store could not make answered present")
	}
	if New(Config{Store: &fakeStore{j: w.j}}).SharedDir("t") {
		t.Error("a tier without a shared level made a directory")
	}
}
