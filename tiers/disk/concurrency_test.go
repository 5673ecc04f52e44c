package disk

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// Many goroutines storing, looking up, loading and removing a small key space
// in a store that is too small for it, so eviction runs all the time. Run with
// -race. Every load must return the exact bytes of its key or ENOENT.
func TestConcurrentStoreLookupLoadRemove(t *testing.T) {
	const (
		workers = 8
		ops     = 150
		keys    = 40
		pages   = 2
	)
	capacity := int64(24 * pages * block.PageSize)
	s := openStore(t, Config{Capacity: capacity, LookupProtect: time.Millisecond})
	var removedCalls atomic.Int64
	s.Listen(func(e Event) {
		if e.Kind == Removed {
			removedCalls.Add(1)
		}
	})
	rel := func(k int) string { return blockRel(testTier, k%3, hashHex(5000+k, 64)) }
	for k := 0; k < keys; k++ {
		mkdirFor(t, s, rel(k))
	}
	var (
		stores, loads, noSpace atomic.Int64
		seq                    atomic.Int64
		wg                     sync.WaitGroup
		errMu                  sync.Mutex
		errs                   []string
	)
	fail := func(format string, args ...any) {
		errMu.Lock()
		errs = append(errs, fmt.Sprintf(format, args...))
		errMu.Unlock()
	}
	store := func(k int, abandon bool) {
		tmp := tmpRelFor(rel(k), int(seq.Add(1)))
		w, err := s.CreateTmp(tmp, engineCreateFlags)
		if err != nil {
			fail("CreateTmp: %v", err)
			return
		}
		data := pageData(k, pages)
		half := len(data) / 2
		_, err = w.WriteAt(data[:half], 0)
		if err == nil {
			_, err = w.WriteAt(data[half:], int64(half))
		}
		if abandon {
			// The engine unlinks a tmp that failed; sometimes before its close.
			if err := s.RemoveTmp(tmp); err != nil {
				fail("RemoveTmp(open): %v", err)
			}
			w.Close()
			return
		}
		if cerr := w.Close(); cerr != nil {
			fail("Close: %v", cerr)
		}
		if err != nil {
			if Errno(err) != syscall.ENOSPC {
				fail("WriteAt: %v", err)
			}
			noSpace.Add(1)
			if err := s.RemoveTmp(tmp); err != nil {
				fail("RemoveTmp: %v", err)
			}
			return
		}
		if err := s.Publish(tmp, rel(k)); err != nil {
			fail("Publish: %v", err)
			s.RemoveTmp(tmp)
			return
		}
		stores.Add(1)
	}
	load := func(k int) {
		r, err := s.OpenBlock(rel(k))
		if err != nil {
			if Errno(err) != syscall.ENOENT && !errors.Is(err, fs.ErrNotExist) {
				fail("OpenBlock(%d): %v", k, err)
			}
			return
		}
		buf := make([]byte, r.Size())
		_, err = r.File().ReadAt(buf, 0)
		r.Close()
		if err != nil {
			fail("read %d: %v", k, err)
		} else if !bytes.Equal(buf, pageData(k, pages)) {
			fail("load of %d returned wrong bytes", k)
		}
		s.CountRead(int64(len(buf)))
		loads.Add(1)
	}
	for g := 0; g < workers; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 42))
			for i := 0; i < ops; i++ {
				k := rng.IntN(keys)
				switch op := rng.IntN(20); {
				case op < 8:
					store(k, op == 0)
				case op < 12:
					// A lookup batch in prefix order.
					for j := k; j < min(k+4, keys); j++ {
						s.Lookup(rel(j), uint32(g))
					}
				case op < 17:
					load(k)
				case op < 19:
					if err := s.Remove(rel(k)); err != nil && !errors.Is(err, fs.ErrNotExist) {
						fail("Remove: %v", err)
					}
				default:
					// (PhysicalBytes <= capacity is checked by the deterministic
					// eviction tests; here it races with publishes in flight.)
					st := s.Stats()
					if st.FreeBytes < 0 || st.FreeBytes > capacity || st.Blocks < 0 || st.LogicalBytes > st.PhysicalBytes {
						fail("Stats out of bounds: %+v", st)
					}
				}
			}
		}(g)
	}
	wg.Wait()
	for _, e := range errs {
		t.Error(e)
	}
	if stores.Load() == 0 || loads.Load() == 0 {
		t.Errorf("workload did nothing: %d stores, %d loads", stores.Load(), loads.Load())
	}
	c := s.Counters()
	if c.ChecksumFailures.Load() != 0 {
		t.Errorf("ChecksumFailures = %d", c.ChecksumFailures.Load())
	}
	if c.Writes.Load() != stores.Load() || c.Reads.Load() != loads.Load() {
		t.Errorf("Writes=%d (want %d) Reads=%d (want %d)", c.Writes.Load(), stores.Load(), c.Reads.Load(), loads.Load())
	}
	if c.NoSpace.Load() != noSpace.Load() {
		t.Errorf("NoSpace = %d, want %d", c.NoSpace.Load(), noSpace.Load())
	}
	t.Logf("%d stores, %d loads, %d evictions, %d ENOSPC", stores.Load(), loads.Load(), c.Evictions.Load(), noSpace.Load())

	st := s.Stats()
	if st.InFlightTmp != 0 {
		t.Errorf("%d tmps still tracked", st.InFlightTmp)
	}
	if usedBytes(s) != st.PhysicalBytes {
		t.Errorf("used = %d with no tmp, blocks occupy %d", usedBytes(s), st.PhysicalBytes)
	}
	checkAccounting(t, s)
	filepath.WalkDir(s.Root(), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(d.Name(), ".tmp") {
			t.Errorf("tmp left on disk: %s", p)
		}
		return nil
	})
	for k := 0; k < keys; k++ {
		if s.Contains(rel(k)) {
			if got := readBlock(t, s, rel(k)); !bytes.Equal(got, pageData(k, pages)) {
				t.Errorf("block %d has wrong bytes at the end", k)
			}
		} else if _, err := os.Stat(s.Path(rel(k))); err == nil {
			t.Errorf("block %d on disk but not indexed", k)
		}
	}
	// Every eviction is told to the listeners (asynchronously: wait for it).
	for deadline := time.Now().Add(20 * time.Second); removedCalls.Load() < c.Evictions.Load(); {
		if time.Now().After(deadline) {
			t.Fatalf("Removed told %d times for %d evictions", removedCalls.Load(), c.Evictions.Load())
		}
		time.Sleep(time.Millisecond)
	}
	if removedCalls.Load() != c.Evictions.Load() {
		t.Errorf("Removed told %d times for %d evictions", removedCalls.Load(), c.Evictions.Load())
	}
}

// Loads of one block from many goroutines while it is replaced with the same
// bytes (the engine stores a key again after an eviction race) never fail.
func TestConcurrentLoadsDuringReplacement(t *testing.T) {
	s := openStore(t, Config{Capacity: 1 << 30})
	rel := blockRel(testTier, 0, hashHex(1, 64))
	data := pageData(1, 4)
	putBlock(t, s, rel, data)
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, len(data))
			for i := 0; i < 100; i++ {
				r, err := s.OpenBlock(rel)
				if err != nil {
					t.Errorf("OpenBlock during replacement: %v", err)
					return
				}
				if _, err := r.File().ReadAt(buf, 0); err != nil || !bytes.Equal(buf, data) {
					t.Errorf("load during replacement: %v, equal=%v", err, bytes.Equal(buf, data))
				}
				r.Close()
			}
		}()
	}
	for i := 0; i < 50; i++ {
		putBlock(t, s, rel, data)
	}
	wg.Wait()
	if s.Counters().ChecksumFailures.Load() != 0 {
		t.Errorf("ChecksumFailures = %d", s.Counters().ChecksumFailures.Load())
	}
	checkAccounting(t, s)
}

// Loads of a block republished with other bytes, and removed, while they
// open it: the descriptor a load gets is always the file of the digest it
// checks against (PinBlock opens outside the lock and looks again when the
// block changed meanwhile), so no load fails verification and none drops a
// block that was fine.
func TestLoadsWhileTheBlockChangesUnderTheirOpen(t *testing.T) {
	s := openStore(t, Config{Capacity: 1 << 30})
	rel := blockRel(testTier, 0, hashHex(1, 64))
	versions := [][]byte{pageData(1, 16), pageData(2, 16)}
	putBlock(t, s, rel, versions[0])
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var loaded atomic.Int64
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				r, err := s.PinBlock(rel)
				if errors.Is(err, syscall.ENOENT) {
					continue // removed between publications
				}
				if err != nil {
					t.Errorf("PinBlock: %v", err)
					return
				}
				buf := s.Buffer(int(r.Size()))
				err = r.ReadInto(buf, nil)
				r.Close()
				if err != nil {
					t.Errorf("a load of a block republished under it failed: %v", err)
					return
				}
				if !bytes.Equal(buf, versions[0]) && !bytes.Equal(buf, versions[1]) {
					t.Errorf("a load returned bytes of no publication")
					return
				}
				s.RecycleBlock(buf)
				loaded.Add(1)
			}
		})
	}
	for i := range 200 {
		if i%10 == 9 {
			if err := s.Remove(rel); err != nil {
				t.Fatalf("Remove: %v", err)
			}
		}
		putBlock(t, s, rel, versions[i%2])
	}
	close(stop)
	wg.Wait()
	if got := s.Counters().ChecksumFailures.Load(); got != 0 {
		t.Errorf("ChecksumFailures = %d, want 0", got)
	}
	if loaded.Load() == 0 {
		t.Errorf("no load completed while the block changed")
	}
	checkAccounting(t, s)
}
