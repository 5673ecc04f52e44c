package staging

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// chunkKey is the block key of chunk i of a tier's group.
func chunkKey(tier string, group, chunk int) block.Ref {
	return block.Name{Tier: tier, Group: group, Hash: fmt.Sprintf("%064x", chunk+1)}.Ref()
}

func chunkKeys(tier string, group, n int) []block.Ref {
	keys := make([]block.Ref, n)
	for i := range keys {
		keys[i] = chunkKey(tier, group, i)
	}
	return keys
}

// blockBytes is the content of a block: its key and version, then padding
// up to size, so a test can tell which block and which write it got.
func blockBytes(key block.Ref, version int64, size int) []byte {
	data := make([]byte, size)
	copy(data, fmt.Sprintf("%s@%d;", key, version))
	return data
}

// parseVersion returns the version blockBytes wrote for key into data.
func parseVersion(key block.Ref, data []byte) (int64, error) {
	head, _, ok := bytes.Cut(data, []byte(";"))
	name, version, found := strings.Cut(string(head), "@")
	if !ok || !found || name != key.Rel {
		return 0, fmt.Errorf("block %s holds %.80q", key, data)
	}
	return strconv.ParseInt(version, 10, 64)
}

// fakeStore is the caller's store behind Fetch: versioned blocks of one
// size, a count of fetches per key, keys that fail, and optionally a gate
// that holds every fetch until the test lets it go.
type fakeStore struct {
	size     int
	mu       sync.Mutex
	calls    map[block.Ref]int
	failing  map[block.Ref]bool
	versions map[block.Ref]int64
	started  chan block.Ref // if set, receives each key as its fetch starts
	gate     chan struct{}  // if set, each fetch waits for a value from it
}

func newFakeStore(size int) *fakeStore {
	return &fakeStore{size: size, calls: map[block.Ref]int{}, failing: map[block.Ref]bool{}, versions: map[block.Ref]int64{}}
}

func (f *fakeStore) fetch(key block.Ref) ([]byte, error) {
	if f.started != nil {
		f.started <- key
	}
	if f.gate != nil {
		<-f.gate
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[key]++
	if f.failing[key] {
		return nil, errors.New("checksum mismatch")
	}
	return blockBytes(key, f.versions[key], f.size), nil
}

// fetched returns the keys fetched so far, sorted.
func (f *fakeStore) fetched() []block.Ref {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.SortedFunc(maps.Keys(f.calls), byRel)
}

func (f *fakeStore) callsOf(key block.Ref) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[key]
}

// overwrite gives key new bytes in the store.
func (f *fakeStore) overwrite(key block.Ref) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.versions[key]++
	return f.versions[key]
}

// fakeClock is an injectable clock that moves only when told.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func newTestStager(t testing.TB, fetch Fetch, opts Options) *Stager {
	t.Helper()
	if opts.Now == nil {
		opts.Now = newFakeClock().Now
	}
	s, err := NewStager(fetch, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// lookUp has stream look keys up, all present, in order.
func lookUp(s *Stager, thread uint32, keys ...block.Ref) {
	for _, k := range keys {
		s.NoteLookup(k, thread, true)
	}
}

// mustMiss takes key, which must not be staged, and settles the wave.
func mustMiss(t *testing.T, s *Stager, key block.Ref) {
	t.Helper()
	if _, ok := s.Take(key); ok {
		t.Fatalf("Take(%s) served a block that should not be staged", key)
	}
	s.Settle()
}

// mustHit takes key, which must be staged with version's bytes.
func mustHit(t *testing.T, s *Stager, key block.Ref, version int64) {
	t.Helper()
	data, ok := s.Take(key)
	if !ok {
		t.Fatalf("Take(%s) missed, want a staged block", key)
	}
	if got, err := parseVersion(key, data); err != nil || got != version {
		t.Fatalf("Take(%s) served version %d (%v), want %d", key, got, err, version)
	}
}

func wantFetched(t *testing.T, f *fakeStore, want ...block.Ref) {
	t.Helper()
	slices.SortFunc(want, byRel)
	if got := f.fetched(); !slices.Equal(got, want) {
		t.Fatalf("fetched %d blocks:\n%s\nwant %d:\n%s", len(got), keyList(got), len(want), keyList(want))
	}
}

// byRel orders blocks by path.
func byRel(a, b block.Ref) int { return strings.Compare(a.Rel, b.Rel) }

func keyList(keys []block.Ref) string {
	var b strings.Builder
	for _, k := range keys {
		b.WriteString("  " + k.Rel + "\n")
	}
	return b.String()
}

func wantStats(t *testing.T, s *Stager, want Stats) {
	t.Helper()
	if got := s.Stats(); got != want {
		t.Fatalf("stats %+v, want %+v", got, want)
	}
}

const tierA, tierB, tierC = "ModelA_0123456789ab_r0", "ModelB_0123456789ab_r0", "ModelC_0123456789ab_r0"

func TestNewStagerOptions(t *testing.T) {
	f := newFakeStore(1)
	if _, err := NewStager(nil, Options{}); err == nil {
		t.Error("NewStager accepted a nil Fetch")
	}
	if _, err := NewStager(f.fetch, Options{Budget: 1 << 20, QueueDepth: -1}); err == nil {
		t.Error("NewStager accepted a negative queue depth")
	}
	if _, err := NewStager(f.fetch, Options{}); err == nil {
		t.Error("NewStager accepted a budget of 0, which the mount's flag reads as staging off")
	}
	s := newTestStager(t, f.fetch, Options{Budget: 1 << 20})
	if s.opts.QueueDepth != DefaultQueueDepth || s.opts.WaveBlocks != DefaultWaveBlocks ||
		s.opts.BatchGap != DefaultBatchGap || s.opts.MaxKeys != DefaultMaxKeys {
		t.Errorf("defaults not applied: %+v", s.opts)
	}
	wantStats(t, s, Stats{BudgetBytes: 1 << 20})
}

func TestWaveOnRead(t *testing.T) {
	f := newFakeStore(1000)
	s := newTestStager(t, f.fetch, Options{Budget: 1 << 20, WaveBlocks: 4, QueueDepth: 2})
	keys := chunkKeys(tierA, 0, 10)
	lookUp(s, 1, keys...)
	wantFetched(t, f) // lookups never stage
	mustMiss(t, s, keys[0])
	wantFetched(t, f, keys[1:5]...)
	wantStats(t, s, Stats{BudgetBytes: 1 << 20, Bytes: 4000, Chains: 1, Waves: 1, Misses: 1})

	// A read of an unknown key stages nothing.
	mustMiss(t, s, chunkKey(tierB, 0, 0))
	wantFetched(t, f, keys[1:5]...)
	wantStats(t, s, Stats{BudgetBytes: 1 << 20, Bytes: 4000, Chains: 1, Waves: 1, Misses: 2})

	// NoteRead stages like a Take that missed, without counting a load.
	s.NoteRead(keys[5])
	s.Settle()
	wantFetched(t, f, slices.Concat(keys[1:5], keys[6:10])...)
	wantStats(t, s, Stats{BudgetBytes: 1 << 20, Bytes: 8000, Chains: 1, Waves: 1, Misses: 2})
}

func TestTakeRemovesAndTopsUp(t *testing.T) {
	f := newFakeStore(1000)
	s := newTestStager(t, f.fetch, Options{Budget: 1 << 20, WaveBlocks: 3, QueueDepth: 2})
	keys := chunkKeys(tierA, 0, 12)
	lookUp(s, 7, keys...)
	mustMiss(t, s, keys[0])
	wantFetched(t, f, keys[1:4]...)

	mustHit(t, s, keys[1], 0)
	s.Settle()
	wantFetched(t, f, keys[1:5]...)
	wantStats(t, s, Stats{BudgetBytes: 1 << 20, Bytes: 3000, Chains: 1, Waves: 1, Hits: 1, Misses: 1})

	// Taken means gone: a second Take of the same block misses.
	mustMiss(t, s, keys[1])
	for i := 2; i < 12; i++ {
		mustHit(t, s, keys[i], 0)
		s.Settle()
	}
	wantFetched(t, f, keys[1:]...)
	for _, k := range keys[1:] {
		if n := f.callsOf(k); n != 1 {
			t.Errorf("%s fetched %d times, want 1", k, n)
		}
	}
	wantStats(t, s, Stats{BudgetBytes: 1 << 20, Waves: 1, Hits: 11, Misses: 2})
}

func TestTakeWaitsForFetchInFlight(t *testing.T) {
	f := newFakeStore(100)
	f.started, f.gate = make(chan block.Ref, 1), make(chan struct{})
	s := newTestStager(t, f.fetch, Options{Budget: 1 << 20, WaveBlocks: 1, QueueDepth: 1})
	keys := chunkKeys(tierA, 0, 2)
	lookUp(s, 1, keys...)
	if _, ok := s.Take(keys[0]); ok {
		t.Fatal("first Take hit")
	}
	if got := <-f.started; got != keys[1] {
		t.Fatalf("fetch of %s started, want %s", got, keys[1])
	}
	taken := make(chan bool)
	go func() {
		_, ok := s.Take(keys[1]) // the fetch is in flight: Take waits for it
		taken <- ok
	}()
	f.gate <- struct{}{}
	if !<-taken {
		t.Fatal("Take of a block being fetched missed instead of waiting for it")
	}
}

// TestChainsFromInterleavedStreams learns chains from two threads whose
// lookups interleave, over two tiers and two groups.
func TestChainsFromInterleavedStreams(t *testing.T) {
	f := newFakeStore(100)
	s := newTestStager(t, f.fetch, Options{Budget: 1 << 20, WaveBlocks: 3, QueueDepth: 2})
	a0, a1 := chunkKeys(tierA, 0, 8), chunkKeys(tierA, 1, 8) // same hashes, two groups
	b0 := chunkKeys(tierB, 0, 8)
	for i := range 8 {
		lookUp(s, 1, a0[i]) // thread 1: both groups of tier A, chunk by chunk
		lookUp(s, 2, b0[i]) // thread 2: tier B
		lookUp(s, 1, a1[i])
	}
	mustMiss(t, s, a0[2])
	wantFetched(t, f, a0[3:6]...)
	mustMiss(t, s, a1[0])
	wantFetched(t, f, slices.Concat(a0[3:6], a1[1:4])...)
	mustMiss(t, s, b0[4])
	wantFetched(t, f, slices.Concat(a0[3:6], a1[1:4], b0[5:8])...)
}

func TestChainLinks(t *testing.T) {
	keys := chunkKeys(tierA, 0, 6)
	for _, tc := range []struct {
		name  string
		learn func(s *Stager, clock *fakeClock)
		read  block.Ref
		want  []block.Ref
	}{
		{"lookup batch", func(s *Stager, _ *fakeClock) { lookUp(s, 1, keys...) }, keys[0], keys[1:4]},
		{"absent key breaks the link", func(s *Stager, _ *fakeClock) {
			lookUp(s, 1, keys[0], keys[1])
			s.NoteLookup(keys[2], 1, false)
			lookUp(s, 1, keys[3], keys[4])
		}, keys[0], keys[1:2]},
		{"absent key is skipped when linked around", func(s *Stager, _ *fakeClock) {
			lookUp(s, 1, keys...)
			lookUp(s, 2, keys[0])
			s.NoteLookup(keys[1], 2, false)
		}, keys[0], keys[2:5]},
		{"pause ends the batch", func(s *Stager, clock *fakeClock) {
			lookUp(s, 1, keys[0], keys[1])
			clock.Advance(DefaultBatchGap + time.Millisecond)
			lookUp(s, 1, keys[2], keys[3])
		}, keys[0], keys[1:2]},
		{"short pause keeps the batch", func(s *Stager, clock *fakeClock) {
			lookUp(s, 1, keys[0], keys[1])
			clock.Advance(DefaultBatchGap / 2)
			lookUp(s, 1, keys[2], keys[3])
		}, keys[0], keys[1:4]},
		{"listing a key again starts over", func(s *Stager, _ *fakeClock) {
			lookUp(s, 1, keys[0], keys[1], keys[2])
			lookUp(s, 1, keys[0], keys[1])
		}, keys[2], nil},
		{"stores link in order", func(s *Stager, _ *fakeClock) {
			for _, k := range keys {
				s.NoteStore(k)
			}
		}, keys[0], keys[1:4]},
		{"stores far apart are not linked", func(s *Stager, clock *fakeClock) {
			s.NoteStore(keys[0])
			clock.Advance(DefaultBatchGap + time.Millisecond)
			s.NoteStore(keys[1])
		}, keys[0], nil},
		{"lookup order wins over store order", func(s *Stager, _ *fakeClock) {
			lookUp(s, 1, keys[0], keys[2])
			s.NoteStore(keys[0])
			s.NoteStore(keys[1])
		}, keys[0], keys[2:3]},
		{"latest lookup wins", func(s *Stager, clock *fakeClock) {
			lookUp(s, 1, keys[0], keys[1])
			clock.Advance(time.Minute)
			lookUp(s, 1, keys[0], keys[3])
		}, keys[0], keys[3:4]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeStore(100)
			clock := newFakeClock()
			s := newTestStager(t, f.fetch, Options{Budget: 1 << 20, WaveBlocks: 3, Now: clock.Now})
			tc.learn(s, clock)
			mustMiss(t, s, tc.read)
			wantFetched(t, f, tc.want...)
		})
	}
}

// TestFairShare has three chains stream through one budget: each new chain
// takes its share from those over theirs, and none exceeds its share.
func TestFairShare(t *testing.T) {
	const size = 1000
	f := newFakeStore(size)
	s := newTestStager(t, f.fetch, Options{Budget: 12 * size, WaveBlocks: 100, QueueDepth: 3})
	chains := [][]block.Ref{chunkKeys(tierA, 0, 40), chunkKeys(tierB, 0, 40), chunkKeys(tierC, 0, 40)}
	for i, keys := range chains {
		lookUp(s, uint32(i), keys...)
	}
	held := func() []int64 {
		s.mu.Lock()
		defer s.mu.Unlock()
		var blocks []int64
		for _, tier := range []string{tierA, tierB, tierC} {
			if c := s.chains[chainID{tier, 0}]; c != nil {
				blocks = append(blocks, c.held/size)
			}
		}
		return blocks
	}
	for i, want := range [][]int64{{12, 0, 0}, {6, 6, 0}, {4, 4, 4}} {
		mustMiss(t, s, chains[i][0])
		if got := held(); !slices.Equal(got, want) {
			t.Fatalf("after chain %d started: blocks held per chain %v, want %v", i, got, want)
		}
	}
	// Chain A lost its farthest blocks, 5 to 12, and chain B its 5 and 6.
	wantStats(t, s, Stats{BudgetBytes: 12 * size, Bytes: 12 * size, Chains: 3, Waves: 3, Misses: 3, WastedBytes: 10 * size})
	for i := 1; i <= 4; i++ {
		mustHit(t, s, chains[0][i], 0)
		s.Settle()
	}
	if got, want := held(), []int64{4, 4, 4}; !slices.Equal(got, want) {
		t.Fatalf("after chain A read on: blocks held per chain %v, want %v", got, want)
	}
	if n := f.callsOf(chains[0][5]); n != 2 {
		t.Errorf("evicted block fetched %d times, want 2 (staged, evicted, staged again)", n)
	}
	if peak := s.peakUsed; peak > 12*size {
		t.Errorf("peak staged %d bytes, budget %d", peak, 12*size)
	}
}

// TestStreamThroughBudget streams a chain 25 times the budget, one load at
// a time: every block but the first is served from staging, each fetched
// once, and staging never holds more than the budget.
func TestStreamThroughBudget(t *testing.T) {
	const blocks, size, budget = 400, 64 << 10, 1 << 20
	f := newFakeStore(size)
	s := newTestStager(t, f.fetch, Options{Budget: budget, WaveBlocks: 32, QueueDepth: 4})
	keys := chunkKeys(tierA, 0, blocks)
	lookUp(s, 1, keys...)
	mustMiss(t, s, keys[0])
	for _, k := range keys[1:] {
		if st := s.Stats(); st.Bytes > budget {
			t.Fatalf("%d bytes staged, budget %d", st.Bytes, budget)
		}
		mustHit(t, s, k, 0)
		s.Settle()
	}
	for _, k := range keys[1:] {
		if n := f.callsOf(k); n != 1 {
			t.Fatalf("%s fetched %d times, want 1", k, n)
		}
	}
	if s.peakUsed > budget {
		t.Errorf("peak staged %d bytes, budget %d", s.peakUsed, budget)
	}
	wantStats(t, s, Stats{BudgetBytes: budget, Waves: 1, Hits: blocks - 1, Misses: 1})
}

// TestStreamConcurrentReaders has 4 engine threads load a chain 25 times the
// budget in order: each block is either served from staging or read by its
// thread, exactly once, and staging never holds more than the budget.
func TestStreamConcurrentReaders(t *testing.T) {
	const blocks, size, budget = 400, 64 << 10, 1 << 20
	f := newFakeStore(size)
	s := newTestStager(t, f.fetch, Options{Budget: budget, WaveBlocks: 32, QueueDepth: 4})
	keys := chunkKeys(tierA, 0, blocks)
	lookUp(s, 1, keys...)
	var next atomic.Int64
	var served, direct [blocks]atomic.Int32
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < blocks; i = next.Add(1) - 1 {
				if data, ok := s.Take(keys[i]); ok {
					if v, err := parseVersion(keys[i], data); err != nil || v != 0 {
						t.Errorf("%s: version %d, %v", keys[i], v, err)
					}
					served[i].Add(1)
				} else {
					direct[i].Add(1) // the engine's read goes to the store
				}
			}
		})
	}
	wg.Wait()
	s.Settle()
	hits := 0
	for i, k := range keys {
		fetches, fromStaging, fromStore := f.callsOf(k), served[i].Load(), direct[i].Load()
		if fromStaging+fromStore != 1 || int(fromStaging) > fetches || fetches > 1 {
			t.Errorf("%s: served %d, read from the store %d, fetched %d", k, fromStaging, fromStore, fetches)
		}
		hits += int(fromStaging)
	}
	st := s.Stats()
	if st.Hits != int64(hits) || st.Hits+st.Misses != blocks || st.Bytes != 0 || st.WastedBytes != 0 {
		t.Errorf("stats %+v, want %d hits of %d loads, nothing staged or wasted", st, hits, blocks)
	}
	if s.peakUsed > budget {
		t.Errorf("peak staged %d bytes, budget %d", s.peakUsed, budget)
	}
}

func TestInvalidate(t *testing.T) {
	const size = 200
	keys := chunkKeys(tierA, 0, 4)
	setUp := func(t *testing.T, f *fakeStore) *Stager {
		s := newTestStager(t, f.fetch, Options{Budget: 1 << 20, WaveBlocks: 1, QueueDepth: 1})
		lookUp(s, 1, keys...)
		return s
	}

	t.Run("staged", func(t *testing.T) {
		f := newFakeStore(size)
		s := setUp(t, f)
		mustMiss(t, s, keys[0])
		s.Invalidate(keys[1])
		wantStats(t, s, Stats{BudgetBytes: 1 << 20, Waves: 1, Misses: 1, WastedBytes: size})
		mustMiss(t, s, keys[1])
	})

	t.Run("in flight", func(t *testing.T) {
		f := newFakeStore(size)
		f.started, f.gate = make(chan block.Ref, len(keys)), make(chan struct{})
		s := setUp(t, f)
		if _, ok := s.Take(keys[0]); ok {
			t.Fatal("first Take hit")
		}
		<-f.started
		f.overwrite(keys[1])
		s.Invalidate(keys[1]) // the fetch now in flight may have read the old bytes
		close(f.gate)
		s.Settle()
		// The wave goes on past the invalidated block: a second wave stages keys[2].
		wantStats(t, s, Stats{BudgetBytes: 1 << 20, Bytes: size, Chains: 1, Waves: 2, Misses: 1, WastedBytes: size})
		mustMiss(t, s, keys[1])
	})

	t.Run("overwrite restages new bytes", func(t *testing.T) {
		f := newFakeStore(size)
		s := setUp(t, f)
		mustMiss(t, s, keys[0])
		s.Invalidate(keys[1])
		f.overwrite(keys[1])
		s.NoteStore(keys[1])
		mustMiss(t, s, keys[0]) // a new pass over the chain
		mustHit(t, s, keys[1], 1)
	})

	t.Run("store drops the staged copy", func(t *testing.T) {
		f := newFakeStore(size)
		s := setUp(t, f)
		mustMiss(t, s, keys[0])
		f.overwrite(keys[1])
		s.NoteStore(keys[1])
		mustMiss(t, s, keys[1])
	})

	t.Run("absent lookup drops the staged copy", func(t *testing.T) {
		f := newFakeStore(size)
		s := setUp(t, f)
		mustMiss(t, s, keys[0])
		s.NoteLookup(keys[1], 9, false)
		mustMiss(t, s, keys[1])
		wantStats(t, s, Stats{BudgetBytes: 1 << 20, Bytes: size, Chains: 1, Waves: 2, Misses: 2, WastedBytes: size})
	})

	t.Run("removed block is skipped", func(t *testing.T) {
		f := newFakeStore(size)
		s := setUp(t, f)
		s.Invalidate(keys[1])
		mustMiss(t, s, keys[0])
		wantFetched(t, f, keys[2])
	})

	t.Run("failed fetch", func(t *testing.T) {
		f := newFakeStore(size)
		f.failing[keys[1]] = true
		s := setUp(t, f)
		mustMiss(t, s, keys[0])
		mustMiss(t, s, keys[1])
		mustMiss(t, s, keys[0]) // a new pass does not fetch the failed block again
		if n := f.callsOf(keys[1]); n != 1 {
			t.Errorf("failed block fetched %d times, want 1", n)
		}
	})
}

// TestInvalidateRace overwrites blocks while engine threads stream the
// chain: a load that starts after an overwrite completed never gets the
// old bytes. Run with -race.
func TestInvalidateRace(t *testing.T) {
	const blocks, size = 64, 256
	f := newFakeStore(size)
	s := newTestStager(t, f.fetch, Options{Budget: 16 * size, WaveBlocks: 8, QueueDepth: 3})
	keys := chunkKeys(tierA, 0, blocks)
	lookUp(s, 1, keys...)
	var completed [blocks]atomic.Int64 // the version of each finished overwrite
	var stop atomic.Bool
	var wg sync.WaitGroup
	for reader := range 2 {
		wg.Go(func() {
			for pass := 0; !stop.Load(); pass++ {
				for i := reader; i < blocks; i += 2 {
					floor := completed[i].Load()
					if data, ok := s.Take(keys[i]); ok {
						if v, err := parseVersion(keys[i], data); err != nil || v < floor {
							t.Errorf("%s: served version %d (%v) after version %d was written", keys[i], v, err, floor)
						}
					}
				}
			}
		})
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		i := rng.IntN(blocks)
		switch rng.IntN(4) {
		case 0: // removal, then a new store
			s.Invalidate(keys[i])
			s.NoteStore(keys[i])
		default: // overwrite: the rename lands between the two calls
			s.Invalidate(keys[i])
			v := f.overwrite(keys[i])
			s.NoteStore(keys[i])
			completed[i].Store(v)
		}
	}
	stop.Store(true)
	wg.Wait()
	s.Settle()
	if s.peakUsed > 16*size {
		t.Errorf("peak staged %d bytes, budget %d", s.peakUsed, 16*size)
	}
}

func TestClose(t *testing.T) {
	f := newFakeStore(100)
	f.started, f.gate = make(chan block.Ref, 4), make(chan struct{})
	s := newTestStager(t, f.fetch, Options{Budget: 1 << 20, WaveBlocks: 1, QueueDepth: 1})
	keys := chunkKeys(tierA, 0, 4)
	lookUp(s, 1, keys...)
	if _, ok := s.Take(keys[0]); ok {
		t.Fatal("first Take hit")
	}
	<-f.started // the only fetch: one block ahead, and it is in flight
	closed := make(chan struct{})
	go func() {
		s.Close()
		close(closed)
	}()
	f.gate <- struct{}{} // Close waits for the fetch in flight
	<-closed
	s.Settle()
	if _, ok := s.Take(keys[1]); ok {
		t.Error("Take served after Close")
	}
	s.NoteLookup(keys[0], 1, true)
	s.NoteStore(keys[0])
	s.NoteRead(keys[0])
	s.Invalidate(keys[0])
	wantStats(t, s, Stats{BudgetBytes: 1 << 20, Waves: 1, Misses: 1, WastedBytes: 100})
	s.Close()
}

func TestMaxKeysForgets(t *testing.T) {
	f := newFakeStore(10)
	s := newTestStager(t, f.fetch, Options{Budget: 1 << 20, WaveBlocks: 4, MaxKeys: 8})
	keys := chunkKeys(tierA, 0, 12)
	lookUp(s, 1, keys...) // the 9th key forgets the first 8
	mustMiss(t, s, keys[0])
	wantFetched(t, f)
	mustMiss(t, s, keys[8])
	wantFetched(t, f, keys[9:12]...)
	if s.keys > 8 {
		t.Errorf("%d keys remembered, limit 8", s.keys)
	}
}

func TestMemTotal(t *testing.T) {
	for _, tc := range []struct {
		meminfo string
		want    int64
		ok      bool
	}{
		{"MemTotal:       24684084 kB\nMemFree: 1 kB\n", 24684084 << 10, true},
		{"MemFree: 1 kB\nMemTotal: 1024 kB\n", 1 << 20, true},
		{"MemTotal: 1024 MB\n", 0, false},
		{"MemTotal: x kB\n", 0, false},
		{"MemFree: 1 kB\n", 0, false},
	} {
		got, err := memTotal(strings.NewReader(tc.meminfo))
		if got != tc.want || (err == nil) != tc.ok {
			t.Errorf("memTotal(%q) = %d, %v; want %d, ok %v", tc.meminfo, got, err, tc.want, tc.ok)
		}
	}
	if b := DefaultBudget(); b <= 0 || b > MaxDefaultBudget {
		t.Errorf("DefaultBudget() = %d", b)
	}
}

// TestFetchesLeaveDepthToTheEnginesStoreLoads checks that staging keeps its
// fetches plus the engine's own store loads within QueueDepth: with one of
// two slots taken by a load, one fetch runs; when the load ends, a second
// starts.
func TestFetchesLeaveDepthToTheEnginesStoreLoads(t *testing.T) {
	f := newFakeStore(100)
	f.started, f.gate = make(chan block.Ref, 8), make(chan struct{})
	s := newTestStager(t, f.fetch, Options{Budget: 1 << 20, WaveBlocks: 4, QueueDepth: 2})
	t.Cleanup(func() { close(f.gate) }) // runs before s.Close: no fetch stays blocked
	keys := chunkKeys(tierA, 0, 6)
	lookUp(s, 1, keys...)
	s.StoreLoadStarted()
	if _, ok := s.Take(keys[0]); ok {
		t.Fatal("first Take hit")
	}
	// The chain's first fetch runs alone to learn the block size.
	if got := <-f.started; got != keys[1] {
		t.Fatalf("fetch of %s started, want %s", got, keys[1])
	}
	f.gate <- struct{}{}
	if got := <-f.started; got != keys[2] {
		t.Fatalf("fetch of %s started, want %s", got, keys[2])
	}
	select {
	case k := <-f.started:
		t.Fatalf("fetch of %s started while a fetch and a store load filled the depth of 2", k)
	case <-time.After(50 * time.Millisecond):
	}
	s.StoreLoadDone()
	if got := <-f.started; got != keys[3] {
		t.Fatalf("after the store load ended, fetch of %s started, want %s", got, keys[3])
	}
}

// TestFetchesFillTheEnginesIdleTime checks that once the engine opened no
// load for a while (it computes between waves), staging runs up to
// IdleQueueDepth fetches at once, and that a store load of the engine stops
// new ones until fetches and loads fit QueueDepth again.
func TestFetchesFillTheEnginesIdleTime(t *testing.T) {
	f := newFakeStore(100)
	f.started, f.gate = make(chan block.Ref, 16), make(chan struct{})
	s := newTestStager(t, f.fetch, Options{Budget: 1 << 20, WaveBlocks: 12, QueueDepth: 2})
	t.Cleanup(func() { close(f.gate) }) // runs before s.Close: no fetch stays blocked
	if s.opts.IdleQueueDepth != IdleDepthFactor*2 {
		t.Fatalf("IdleQueueDepth %d, want %d", s.opts.IdleQueueDepth, IdleDepthFactor*2)
	}
	keys := chunkKeys(tierA, 0, 14)
	lookUp(s, 1, keys...)
	if _, ok := s.Take(keys[0]); ok {
		t.Fatal("first Take hit")
	}
	<-f.started // the probe that learns the block size
	f.gate <- struct{}{}
	for i := range s.opts.IdleQueueDepth {
		select {
		case <-f.started:
		case <-time.After(5 * time.Second):
			t.Fatalf("%d fetches running with the engine idle, want %d", i, s.opts.IdleQueueDepth)
		}
	}
	select {
	case k := <-f.started:
		t.Fatalf("fetch of %s started beyond IdleQueueDepth", k)
	case <-time.After(50 * time.Millisecond):
	}
	s.StoreLoadStarted()
	f.gate <- struct{}{} // one fetch ends: 7 in flight and a load, over QueueDepth
	select {
	case k := <-f.started:
		t.Fatalf("fetch of %s started while the engine's load read the store", k)
	case <-time.After(50 * time.Millisecond):
	}
	s.StoreLoadDone()
	select {
	case <-f.started:
	case <-time.After(5 * time.Second):
		t.Fatal("no fetch started once the engine's load ended")
	}
}

// TestTakeOfAQueuedBlockIsLate: a load of a block whose fetch is queued
// behind a busy store counts as a miss staging foresaw too late; a load of a
// block nobody foresaw is a miss alone.
func TestTakeOfAQueuedBlockIsLate(t *testing.T) {
	f := newFakeStore(100)
	f.started, f.gate = make(chan block.Ref, 8), make(chan struct{})
	s := newTestStager(t, f.fetch, Options{Budget: 1 << 20, WaveBlocks: 4, QueueDepth: 1, IdleQueueDepth: 1})
	t.Cleanup(func() { close(f.gate) }) // runs before s.Close: no fetch stays blocked
	keys := chunkKeys(tierA, 0, 6)
	lookUp(s, 1, keys...)
	if _, ok := s.Take(keys[0]); ok {
		t.Fatal("first Take hit")
	}
	if got := <-f.started; got != keys[1] {
		t.Fatalf("fetch of %s started, want %s", got, keys[1])
	}
	// The first fetch runs alone to learn the block size; then keys[2]'s
	// holds the one slot and keys[3] waits in the queue.
	f.gate <- struct{}{}
	if got := <-f.started; got != keys[2] {
		t.Fatalf("fetch of %s started, want %s", got, keys[2])
	}
	if _, ok := s.Take(keys[3]); ok {
		t.Fatal("Take of a queued block hit")
	}
	if st := s.Stats(); st.Misses != 2 || st.Late != 1 {
		t.Fatalf("misses %d, late %d; want 2 and 1 (the first load foresaw nothing)", st.Misses, st.Late)
	}
}
