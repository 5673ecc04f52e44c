package shared

import (
	"fmt"
	"io/fs"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// countingDir counts the listings of each directory and the stats.
type countingDir struct {
	Dir
	mu       sync.Mutex
	listings map[string]int
	stats    int
}

func (c *countingDir) ReadDir(rel string, limit int, keep func(string) bool) ([]fs.DirEntry, error) {
	c.mu.Lock()
	c.listings[rel]++
	c.mu.Unlock()
	return c.Dir.ReadDir(rel, limit, keep)
}

func (c *countingDir) Stat(rel string) (FileInfo, error) {
	c.mu.Lock()
	c.stats++
	c.mu.Unlock()
	return c.Dir.Stat(rel)
}

func (c *countingDir) counts() (map[string]int, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := make(map[string]int, len(c.listings))
	for k, v := range c.listings {
		m[k] = v
	}
	return m, c.stats
}

// TestLookupsListOnce: N cold lookups under one directory of the layout list
// it once and stat nothing but the one block it holds; keys under a missing
// directory are answered absent from its parent's listing; a block another
// node writes is seen once the listing is NegativeTTL old.
func TestLookupsListOnce(t *testing.T) {
	root := t.TempDir()
	write := func(rel string, i int) { putBlock(t, root, testKey, rel, blockData(i, testBlock)) }
	held := blockRel(0)
	write(held, 0)
	dir := &countingDir{Dir: NewOSDir(root), listings: map[string]int{}}
	l, _, clock := newTestLevel(t, dir, root, func(c *Config) { c.NegativeTTL = 2 * time.Second })
	_, statsAtStart := dir.counts()

	const n = 100
	groupDir := filepath.Dir(held)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if l.Lookup(fmt.Sprintf("%s/%032x.bin", groupDir, i)) {
				t.Errorf("absent key %d answered present", i)
			}
		}()
	}
	wg.Wait()
	// Keys under a directory the store lacks, and under a tier it lacks.
	for i := range n {
		if l.Lookup(fmt.Sprintf("model/fff/%02x_g0/%032x.bin", i, i)) || l.Lookup(fmt.Sprintf("other/abc/%02x_g0/%032x.bin", i, i)) {
			t.Fatalf("key %d under a missing directory answered present", i)
		}
	}
	if !l.Lookup(held) {
		t.Fatal("held block answered absent")
	}
	listings, stats := dir.counts()
	want := map[string]int{".": 1, "model": 1, filepath.Dir(groupDir): 1, groupDir: 1, namesDir: 1}
	for d, c := range listings {
		if c != want[d] {
			t.Errorf("%q listed %d times, want %d (all: %v)", d, c, want[d], listings)
		}
	}
	if stats-statsAtStart != 1 {
		t.Errorf("%d stats for %d lookups, want 1 (the held block's)", stats-statsAtStart, 3*n+1)
	}

	// Visibility: another node's block under a listed directory.
	other := fmt.Sprintf("%s/%032x.bin", groupDir, 7)
	write(other, 7)
	clock.Advance(time.Second)
	if l.Lookup(other) {
		t.Fatal("listing not cached for NegativeTTL")
	}
	clock.Advance(time.Second)
	if !l.Lookup(other) {
		t.Fatal("a block written by another node not seen after NegativeTTL")
	}
}

// TestListingsBounded: however many directories are listed, the cached
// listings keep at most maxCached names (absent directories counting one).
func TestListingsBounded(t *testing.T) {
	var r readThrough
	r.init()
	now := time.Unix(1_800_000_000, 0)
	names := make(map[string]fs.FileMode, 1000)
	for i := range 1000 {
		names[fmt.Sprintf("%04x", i)] = 0
	}
	for i := range 3 * maxCached / 1000 {
		r.keepListing(fmt.Sprintf("dir%d", i), listing{at: now, names: names}, now, time.Minute)
		r.keepListing(fmt.Sprintf("absent%d", i), listing{at: now, absent: true}, now, time.Minute)
		if r.listedNames > maxCached {
			t.Fatalf("%d names cached after %d listings", r.listedNames, 2*(i+1))
		}
	}
	sum := 0
	for _, ls := range r.listings {
		sum += len(ls.names) + 1
	}
	if sum != r.listedNames || len(r.listings) == 0 {
		t.Fatalf("%d names counted, %d cached in %d listings", r.listedNames, sum, len(r.listings))
	}
}
