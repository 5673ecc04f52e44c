package disk

// Regression tests for store bugs found in review: each asserts a requirement
// an earlier version of the store did not meet.

import (
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// A: the checksum record's xattr block is accounted at Publish but never reserved.
func TestRegressionCapacityExceededByRecordFootprint(t *testing.T) {
	f := blockFootprint(t)
	s := openStore(t, Config{Capacity: 3*f + page64})
	for i := 0; i < 6; i++ {
		putBlock(t, s, evName(i), pageData(i, 1))
		if st := s.Stats(); st.PhysicalBytes > st.CapacityBytes {
			t.Fatalf("after %d blocks: store holds %d bytes, capacity %d", i+1, st.PhysicalBytes, st.CapacityBytes)
		}
	}
}

// B: adoption writes the record (an xattr block on ext4) without updating the accounting.
func TestRegressionAdoptionLeavesPhysicalStale(t *testing.T) {
	dir := t.TempDir()
	rel := evName(0)
	p := filepath.Join(dir, rel)
	os.MkdirAll(filepath.Dir(p), 0o755)
	os.WriteFile(p, pageData(0, 1), 0o644)
	unix.Setxattr(p, block.VLLMChecksumXattr, vllmXattr(crcOf(pageData(0, 1))), 0)
	s := openStore(t, Config{Dir: dir, Capacity: 1 << 30})
	readBlock(t, s, rel)
	if got, want := s.Stats().PhysicalBytes, physicalOf(t, p); got != want {
		t.Fatalf("after adoption Stats.PhysicalBytes = %d, the file occupies %d", got, want)
	}
}

// C: a store reopened with a smaller capacity is not brought under it.
func TestRegressionReopenWithSmallerCapacity(t *testing.T) {
	dir := t.TempDir()
	s, _ := Open(Config{Dir: dir, Capacity: 1 << 30})
	for i := 0; i < 8; i++ {
		putBlock(t, s, evName(i), pageData(i, 1))
	}
	s.Close()
	s = openStore(t, Config{Dir: dir, Capacity: 4 * page64})
	if st := s.Stats(); st.PhysicalBytes > st.CapacityBytes {
		t.Fatalf("after Open: store holds %d bytes, capacity %d", st.PhysicalBytes, st.CapacityBytes)
	}
}

// D: a stray zero-length block file found at Open sets the tier's row size to 0.
func TestRegressionStrayEmptyBlockBricksTier(t *testing.T) {
	dir := t.TempDir()
	s, _ := Open(Config{Dir: dir, Capacity: 1 << 30})
	for i := 0; i < 3; i++ {
		putBlock(t, s, evName(i), pageData(i, 2))
	}
	s.Close()
	p := filepath.Join(dir, evName(3))
	os.MkdirAll(filepath.Dir(p), 0o755)
	os.WriteFile(p, nil, 0o644)
	future := time.Now().Add(time.Hour)
	os.Chtimes(p, future, future)
	s = openStore(t, Config{Dir: dir, Capacity: 1 << 30})
	if s.Contains(evName(3)) {
		t.Errorf("zero-length block indexed")
	}
	tmp := writeTmp(t, s, evName(4), pageData(4, 2))
	if err := s.Publish(tmp, evName(4)); err != nil {
		t.Fatalf("Publish of a valid row: %v (RowBytes %v)", err, s.RowBytes())
	}
}

// E: a load racing a replacement with different bytes fails with EIO and counts a checksum failure.
func TestRegressionOpenRacingReplacementGivesSpuriousEIO(t *testing.T) {
	s := openStore(t, Config{Capacity: 1 << 30})
	rel := blockRel(testTier, 0, hashHex(1, 64))
	putBlock(t, s, rel, pageData(0, 1))
	var stop atomic.Bool
	var wg sync.WaitGroup
	var eio atomic.Int64
	for g := 0; g < 2; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				r, err := s.OpenBlock(rel)
				if err != nil {
					if Errno(err) == syscall.EIO {
						eio.Add(1)
					}
					continue
				}
				r.Close()
			}
		}()
	}
	for i := 1; i < 3000; i++ {
		putBlock(t, s, rel, pageData(i, 1))
	}
	stop.Store(true)
	wg.Wait()
	if eio.Load() != 0 || s.Counters().ChecksumFailures.Load() != 0 {
		t.Fatalf("%d loads of intact blocks failed with EIO; ChecksumFailures = %d", eio.Load(), s.Counters().ChecksumFailures.Load())
	}
}

// F: re-storing a block that answered a lookup drops its protection.
func TestRegressionReplacementDropsLookupProtection(t *testing.T) {
	s, clock, gone := evictStore(t, 5, Config{})
	for i := 0; i < 4; i++ {
		put(t, s, i)
	}
	clock.Advance(time.Second)
	s.Lookup(evName(0), 1)
	putBlock(t, s, evName(0), pageData(0, 1)) // stored again within the window
	touch(t, s, 1)
	touch(t, s, 2)
	touch(t, s, 3)
	put(t, s, 4)
	put(t, s, 5)
	if rel := gone.next(t); rel == evName(0) {
		t.Fatalf("block looked up 1s ago (window %s) was evicted after being re-stored", protect)
	}
}

// G: a write that cannot fit evicts blocks before it is refused.
func TestRegressionNeedlessEvictionBeforeENOSPC(t *testing.T) {
	f := blockFootprint(t)
	clock := newFakeClock()
	s := openStore(t, Config{Capacity: 2 * f, LookupProtect: protect, Now: clock.Now})
	put(t, s, 0)
	put(t, s, 1)
	s.Lookup(evName(0), 1)
	rel := evName(2)
	mkdirFor(t, s, rel)
	w, _ := s.CreateTmp(tmpRelFor(rel, 1), engineCreateFlags)
	defer w.Close()
	_, err := w.WriteAt(pageData(2, int(2*f/page64)), 0)
	if Errno(err) != syscall.ENOSPC {
		t.Fatalf("err = %v", err)
	}
	if !s.Contains(evName(1)) {
		t.Fatalf("block 1 evicted (Evictions=%d) for a write that was refused anyway", s.Counters().Evictions.Load())
	}
}

// H: a tmp whose write was refused can still be published (with its prefix).
func TestRegressionPublishAfterRefusedWrite(t *testing.T) {
	s := openStore(t, Config{Capacity: 1 << 30})
	rel := blockRel(testTier, 0, hashHex(1, 64))
	mkdirFor(t, s, rel)
	tmp := tmpRelFor(rel, 1)
	w, _ := s.CreateTmp(tmp, engineCreateFlags)
	w.WriteAt(pageData(1, 2)[:block.PageSize], 0)
	pwriteAt = func(int, []byte, int64) (int, error) { return 0, syscall.EIO }
	_, err := w.WriteAt(pageData(1, 2)[page64:], page64)
	pwriteAt = unix.Pwrite
	if Errno(err) != syscall.EIO {
		t.Fatal(err)
	}
	w.Close()
	if err := s.Publish(tmp, rel); err == nil {
		t.Fatal("a tmp with a refused write was published (1 of 2 pages)")
	}
}

// I: a block file deleted behind the store's back stays indexed after OpenBlock fails.
func TestRegressionVanishedBlockStaysIndexed(t *testing.T) {
	s := openStore(t, Config{Capacity: 1 << 30})
	rel := blockRel(testTier, 0, hashHex(2, 64))
	putBlock(t, s, rel, pageData(2, 1))
	os.Remove(s.Path(rel))
	if _, err := s.OpenBlock(rel); err == nil {
		t.Fatal("opened a vanished block")
	}
	if s.Contains(rel) || s.Lookup(rel, 1) {
		t.Fatal("vanished block still answers lookups after its open failed with ENOENT")
	}
}
