package disk

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

const protect = 60 * time.Second

// blockFootprint is what a published one-page block occupies on the test
// filesystem, checksum record included: the unit of capacity in these tests.
func blockFootprint(t *testing.T) int64 {
	t.Helper()
	s, err := Open(Config{Dir: t.TempDir(), Capacity: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	putBlock(t, s, evName(0), pageData(0, 1))
	f := s.Stats().PhysicalBytes
	if f < page64 {
		t.Fatalf("a one-page block occupies %d bytes", f)
	}
	return f
}

// evictStore opens a store with room for n one-page blocks and an injected clock.
func evictStore(t *testing.T, n int, cfg Config) (*Store, *fakeClock, *removals) {
	t.Helper()
	clock := newFakeClock()
	cfg.Capacity = int64(n) * blockFootprint(t)
	if cfg.LookupProtect == 0 {
		cfg.LookupProtect = protect
	}
	cfg.Now = clock.Now
	s := openStore(t, cfg)
	return s, clock, watchRemovals(s)
}

// fullEvictStore is an evictStore of four blocks holding keys 0 to 3.
func fullEvictStore(t *testing.T) (*Store, *fakeClock, *removals) {
	t.Helper()
	s, clock, gone := evictStore(t, 4, Config{})
	putRange(t, s, 0, 4)
	return s, clock, gone
}

// putRange stores keys from up to (not including) to, in order.
func putRange(t *testing.T, s *Store, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		put(t, s, i)
	}
}

// name returns the block path used for key i in eviction tests.
func evName(i int) string { return blockRel(testTier, i%2, hashHex(1000+i, 64)) }

// put stores a one-page block for key i and checks that the store never
// holds more than its capacity.
func put(t *testing.T, s *Store, i int) {
	t.Helper()
	putBlock(t, s, evName(i), pageData(i, 1))
	st := s.Stats()
	if st.PhysicalBytes > st.CapacityBytes || usedBytes(s) > st.CapacityBytes {
		t.Fatalf("store holds %d bytes (%d accounted), capacity %d", st.PhysicalBytes, usedBytes(s), st.CapacityBytes)
	}
}

// touch records a completed load of key i (which makes it most recently used).
func touch(t *testing.T, s *Store, i int) {
	t.Helper()
	if got := readBlock(t, s, evName(i)); !bytes.Equal(got, pageData(i, 1)) {
		t.Fatalf("block %d has wrong bytes", i)
	}
}

// expectEvicted checks that exactly the listed keys were evicted, in order,
// and that they are gone from the index and the disk.
func expectEvicted(t *testing.T, s *Store, gone *removals, want ...int) {
	t.Helper()
	for _, i := range want {
		rel := gone.next(t)
		if rel != evName(i) {
			t.Fatalf("evicted %s, want key %d (%s)", rel, i, evName(i))
		}
		if s.Contains(rel) || exists(t, s.Path(rel)) {
			t.Fatalf("evicted block %d still present", i)
		}
	}
	select {
	case rel := <-gone.ch:
		t.Fatalf("unexpected eviction of %s", rel)
	default:
	}
}

func present(t *testing.T, s *Store, keys ...int) {
	t.Helper()
	for _, i := range keys {
		if !s.Contains(evName(i)) || !exists(t, s.Path(evName(i))) {
			t.Fatalf("block %d missing", i)
		}
	}
}

func TestEvictLRUOrder(t *testing.T) {
	s, clock, gone := evictStore(t, 4, Config{})
	for i := 0; i < 4; i++ {
		put(t, s, i)
		clock.Advance(time.Second)
	}
	expectEvicted(t, s, gone)
	touch(t, s, 0) // LRU: 0 3 2 1 (front to back)
	put(t, s, 4)
	expectEvicted(t, s, gone, 1)
	present(t, s, 0, 2, 3, 4)

	// A lookup also counts as a use; once its protection is over, the block is an ordinary LRU entry.
	if !s.Lookup(evName(2), 1) {
		t.Fatal("lookup missed")
	}
	clock.Advance(protect + time.Second) // LRU: 2 4 0 3
	put(t, s, 5)
	expectEvicted(t, s, gone, 3)
	put(t, s, 6)
	expectEvicted(t, s, gone, 0)
	put(t, s, 7)
	expectEvicted(t, s, gone, 4)
	put(t, s, 8)
	expectEvicted(t, s, gone, 2)
	present(t, s, 5, 6, 7, 8)
	if got := s.Counters().Evictions.Load(); got != 5 {
		t.Errorf("Evictions = %d, want 5", got)
	}
	if st := s.Stats(); st.Evictions != 5 || st.Blocks != 4 || st.FreeBytes != 0 {
		t.Errorf("Stats = %+v", st)
	}
	checkAccounting(t, s)
}

func TestEvictNeverTakesBlockWithReadInFlight(t *testing.T) {
	s, _, gone := fullEvictStore(t)
	r, err := s.OpenBlock(evName(0)) // 0 is the least recently used
	if err != nil {
		t.Fatal(err)
	}
	for i := 4; i < 8; i++ {
		put(t, s, i)
	}
	expectEvicted(t, s, gone, 1, 2, 3, 4)
	present(t, s, 0)
	got := make([]byte, block.PageSize)
	if _, err := r.File().ReadAt(got, 0); err != nil || !bytes.Equal(got, pageData(0, 1)) {
		t.Fatalf("load in flight failed: %v", err)
	}
	if err := r.Close(); err != nil { // 0 becomes most recently used
		t.Fatal(err)
	}
	put(t, s, 8)
	expectEvicted(t, s, gone, 5)
	present(t, s, 0)

	// Every block being read: nothing can be evicted.
	var readers []*Reader
	for _, i := range []int{0, 6, 7, 8} {
		r, err := s.OpenBlock(evName(i))
		if err != nil {
			t.Fatal(err)
		}
		readers = append(readers, r)
	}
	rel := evName(9)
	mkdirFor(t, s, rel)
	tmp := tmpRelFor(rel, 1)
	w, err := s.CreateTmp(tmp, engineCreateFlags)
	if err != nil {
		t.Fatal(err)
	}
	n, err := w.WriteAt(pageData(9, 1), 0)
	wantErrno(t, err, syscall.ENOSPC, "write with every block being read")
	if n != 0 {
		t.Errorf("refused write returned n=%d", n)
	}
	expectEvicted(t, s, gone)
	w.Close()
	s.RemoveTmp(tmp)
	// Once one load completes, the next write takes the least recently used closed block.
	readers[2].Close() // 7
	readers[1].Close() // 6: LRU among closed is now 7
	put(t, s, 9)
	expectEvicted(t, s, gone, 7)
	for _, r := range []*Reader{readers[0], readers[3]} {
		r.Close()
	}
	checkAccounting(t, s)
}

func TestEvictRespectsLookupProtection(t *testing.T) {
	for _, ttl := range []time.Duration{0, 30 * time.Second} {
		t.Run(fmt.Sprintf("cacheTTL=%s", ttl), func(t *testing.T) {
			s, clock, gone := evictStore(t, 4, Config{LookupCacheTTL: ttl})
			for i := 0; i < 4; i++ {
				put(t, s, i)
			}
			// Looked up on separate threads (no prefix), then the others used after them.
			if !s.Lookup(evName(0), 1) || !s.Lookup(evName(1), 2) {
				t.Fatal("lookup missed")
			}
			touch(t, s, 2)
			touch(t, s, 3) // LRU: 3 2 1 0, with 0 and 1 protected
			put(t, s, 4)
			expectEvicted(t, s, gone, 2)
			put(t, s, 5)
			expectEvicted(t, s, gone, 3)
			clock.Advance(protect + ttl - time.Second) // still inside the window
			put(t, s, 6)
			expectEvicted(t, s, gone, 4)
			present(t, s, 0, 1)
			clock.Advance(2 * time.Second) // the window has passed
			put(t, s, 7)
			expectEvicted(t, s, gone, 0)
			put(t, s, 8)
			expectEvicted(t, s, gone, 1)
			checkAccounting(t, s)
		})
	}
}

func TestEvictPrefixTailBeforeHead(t *testing.T) {
	s, clock, gone := fullEvictStore(t)
	// One engine thread looks a request's prefix up in order: 0 1 2 3.
	for i := 0; i < 4; i++ {
		if !s.Lookup(evName(i), 7) {
			t.Fatal("lookup missed")
		}
		clock.Advance(10 * time.Millisecond)
	}
	clock.Advance(protect)
	// Plain LRU would take 0 (the head) first.
	putRange(t, s, 10, 14)
	expectEvicted(t, s, gone, 3, 2, 1, 0)
	checkAccounting(t, s)
}

func TestEvictPrefixSkipsTailWithReadInFlight(t *testing.T) {
	s, clock, gone := fullEvictStore(t)
	for i := 0; i < 4; i++ {
		s.Lookup(evName(i), 7)
		clock.Advance(10 * time.Millisecond)
	}
	clock.Advance(protect)
	r, err := s.OpenBlock(evName(3))
	if err != nil {
		t.Fatal(err)
	}
	put(t, s, 10)
	expectEvicted(t, s, gone, 2)
	put(t, s, 11)
	expectEvicted(t, s, gone, 1)
	r.Close()
	put(t, s, 12)
	expectEvicted(t, s, gone, 3)
	put(t, s, 13)
	expectEvicted(t, s, gone, 0)
	checkAccounting(t, s)
}

func TestEvictPrefixesPerStream(t *testing.T) {
	s, clock, gone := fullEvictStore(t)
	// Two threads interleave: thread 1 looks up 0 then 2, thread 2 looks up 1 then 3.
	for _, l := range []struct {
		key    int
		thread uint32
	}{{0, 1}, {1, 2}, {2, 1}, {3, 2}} {
		s.Lookup(evName(l.key), l.thread)
		clock.Advance(10 * time.Millisecond)
	}
	clock.Advance(protect)
	// LRU back is 0: its prefix (0, 2) loses 2 then 0; then prefix (1, 3) loses 3 then 1.
	putRange(t, s, 10, 14)
	expectEvicted(t, s, gone, 2, 0, 3, 1)
}

func TestEvictPrefixGapStartsNewPrefix(t *testing.T) {
	s, clock, gone := fullEvictStore(t)
	s.Lookup(evName(0), 5)
	s.Lookup(evName(1), 5)
	clock.Advance(2 * time.Second) // a pause: the next lookups are another request
	s.Lookup(evName(2), 5)
	s.Lookup(evName(3), 5)
	clock.Advance(protect)
	putRange(t, s, 10, 14)
	expectEvicted(t, s, gone, 1, 0, 3, 2)
}

func TestEvictPrefixRestartsWhenLookedUpAgain(t *testing.T) {
	s, clock, gone := fullEvictStore(t)
	// Step 1 looks up 0 1 2 3; step 2 looks up 0 1 again (a new prefix 0 1);
	// 2 and 3 stay on the first prefix.
	for _, k := range []int{0, 1, 2, 3, 0, 1} {
		s.Lookup(evName(k), 9)
		clock.Advance(10 * time.Millisecond)
	}
	clock.Advance(protect)
	// LRU: 1 0 3 2. Back 2: its prefix's last live member is 3, then 2.
	// Then back 0: prefix (0 1) loses 1 then 0.
	putRange(t, s, 10, 14)
	expectEvicted(t, s, gone, 3, 2, 1, 0)
}

func TestENOSPCWhenEverythingIsProtected(t *testing.T) {
	f := blockFootprint(t)
	// Room for two blocks plus one page.
	clock := newFakeClock()
	s := openStore(t, Config{Capacity: 2*f + page64, LookupProtect: protect, Now: clock.Now})
	gone := watchRemovals(s)
	put(t, s, 0)
	put(t, s, 1)
	s.Lookup(evName(0), 1)
	s.Lookup(evName(1), 2)
	before := s.Stats()
	if before.FreeBytes != page64 {
		t.Fatalf("FreeBytes = %d, want %d", before.FreeBytes, block.PageSize)
	}
	usedBefore := usedBytes(s)
	rel := evName(2)
	mkdirFor(t, s, rel)
	tmp := tmpRelFor(rel, 1)
	w, err := s.CreateTmp(tmp, engineCreateFlags)
	if err != nil {
		t.Fatal(err)
	}
	n, err := w.WriteAt(pageData(2, 2), 0) // two pages, one free
	wantErrno(t, err, syscall.ENOSPC, "two-page write with one page free and everything protected")
	if n != 0 {
		t.Errorf("refused write returned n=%d", n)
	}
	if got := s.Counters().NoSpace.Load(); got != 1 {
		t.Errorf("NoSpace = %d, want 1", got)
	}
	if got := s.Counters().WriteBytes.Load(); got != 2*page64 {
		t.Errorf("WriteBytes = %d, want %d (the two published pages only)", got, 2*block.PageSize)
	}
	after := s.Stats()
	if after.FreeBytes != before.FreeBytes || after.PhysicalBytes != before.PhysicalBytes || after.Blocks != 2 || usedBytes(s) != usedBefore {
		t.Errorf("refused write changed the accounting:\nbefore %+v used %d\nafter  %+v used %d", before, usedBefore, after, usedBytes(s))
	}
	if fi, err := os.Stat(s.Path(tmp)); err != nil || fi.Size() != 0 {
		t.Errorf("tmp after a refused write: %v, %v; want 0 bytes", fi, err)
	}
	expectEvicted(t, s, gone)
	present(t, s, 0, 1)
	checkAccounting(t, s)

	// One page still fits; the next one does not.
	if _, err := w.WriteAt(pageData(2, 1), 0); err != nil {
		t.Fatalf("one-page write into one free page: %v", err)
	}
	_, err = w.WriteAt(pageData(3, 1), page64)
	wantErrno(t, err, syscall.ENOSPC, "write past capacity")
	if fi, _ := os.Stat(s.Path(tmp)); fi.Size() != page64 {
		t.Errorf("tmp has %d bytes, want %d", fi.Size(), block.PageSize)
	}
	if st := s.Stats(); st.FreeBytes != 0 {
		t.Errorf("FreeBytes = %d, want 0", st.FreeBytes)
	}
	if got := s.Counters().NoSpace.Load(); got != 2 {
		t.Errorf("NoSpace = %d, want 2", got)
	}
	w.Close()
	if err := s.RemoveTmp(tmp); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.FreeBytes != before.FreeBytes || usedBytes(s) != usedBefore {
		t.Errorf("FreeBytes = %d, used %d after RemoveTmp, want %d, %d", st.FreeBytes, usedBytes(s), before.FreeBytes, usedBefore)
	}
	expectEvicted(t, s, gone)
	checkAccounting(t, s)
}

// When the protection ends, the refused write succeeds by evicting.
func TestENOSPCUntilProtectionEnds(t *testing.T) {
	s, clock, gone := evictStore(t, 2, Config{})
	put(t, s, 0)
	put(t, s, 1)
	s.Lookup(evName(0), 1)
	s.Lookup(evName(1), 2)
	rel := evName(2)
	mkdirFor(t, s, rel)
	tmp := tmpRelFor(rel, 1)
	w, err := s.CreateTmp(tmp, engineCreateFlags)
	if err != nil {
		t.Fatal(err)
	}
	_, err = w.WriteAt(pageData(2, 1), 0)
	wantErrno(t, err, syscall.ENOSPC, "write into a full store with everything looked up")
	clock.Advance(protect - time.Second)
	_, err = w.WriteAt(pageData(2, 1), 0)
	wantErrno(t, err, syscall.ENOSPC, "write just before the protection ends")
	expectEvicted(t, s, gone)
	clock.Advance(time.Second)
	if _, err := w.WriteAt(pageData(2, 1), 0); err != nil {
		t.Fatalf("write after the protection ended: %v", err)
	}
	expectEvicted(t, s, gone, 0)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Publish(tmp, rel); err != nil {
		t.Fatal(err)
	}
	present(t, s, 1, 2)
	if st := s.Stats(); st.PhysicalBytes > st.CapacityBytes {
		t.Errorf("store holds %d bytes, capacity %d", st.PhysicalBytes, st.CapacityBytes)
	}
	checkAccounting(t, s)
}

// A write larger than the whole capacity is refused.
func TestENOSPCWriteLargerThanCapacity(t *testing.T) {
	s, _, _ := evictStore(t, 2, Config{})
	put(t, s, 0)
	capacity := s.Stats().CapacityBytes
	rel := evName(1)
	mkdirFor(t, s, rel)
	tmp := tmpRelFor(rel, 1)
	w, err := s.CreateTmp(tmp, engineCreateFlags)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	before := usedBytes(s)
	_, err = w.WriteAt(pageData(1, int(capacity/page64)+1), 0)
	wantErrno(t, err, syscall.ENOSPC, "write larger than the capacity")
	if usedBytes(s) > before {
		t.Errorf("used grew from %d to %d on a refused write", before, usedBytes(s))
	}
}

// The LRU order survives a restart: it is rebuilt from the blocks' mtimes.
func TestEvictOrderAfterRebuild(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Config{Dir: dir, Capacity: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		putBlock(t, s, evName(i), pageData(i, 1))
	}
	s.Close()
	base := time.Now().Add(-time.Hour)
	for i, age := range []time.Duration{3, 1, 4, 2} { // oldest: 2, then 0, 3, 1
		tm := base.Add(-age * time.Minute)
		if err := os.Chtimes(filepath.Join(dir, evName(i)), tm, tm); err != nil {
			t.Fatal(err)
		}
	}
	s, _, gone := evictStore(t, 4, Config{Dir: dir})
	putRange(t, s, 10, 14)
	expectEvicted(t, s, gone, 2, 0, 3, 1)
}
