package shared

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestLeaseExclusive: of two nodes one holds the lease; the other takes it
// over only once it expired, and the first, cut off meanwhile, stops
// evicting and sees the new holder when it is back.
func TestLeaseExclusive(t *testing.T) {
	root := t.TempDir()
	clock := newFakeClock()
	hangA := newHangingDir(NewOSDir(root))
	a, _, _ := newTestLevel(t, hangA, root, func(c *Config) {
		c.Clock, c.Capacity, c.LeaseTTL, c.Timeout = clock, 1<<40, 9*time.Second, 50*time.Millisecond
	})
	eventually(t, "A holds the lease", a.holding)
	b, _, _ := newTestLevel(t, NewOSDir(root), root, func(c *Config) {
		c.Clock, c.Capacity, c.LeaseTTL, c.Holder = clock, 1<<40, 9*time.Second, "node-b"
	})
	if b.tryLease() {
		t.Fatal("B took a live lease")
	}
	if holder, held := b.leaseState(); holder != "node-a" || held {
		t.Fatalf("B sees holder %q, held %v", holder, held)
	}
	// A is cut off from the shared directory; its lease runs out.
	hangA.hang()
	clock.Advance(10 * time.Second)
	if a.holding() {
		t.Fatal("A still evicts past its lease's expiry")
	}
	if !b.tryLease() {
		t.Fatal("B could not take over an expired lease")
	}
	hangA.resume()
	eventually(t, "A reachable", a.Reachable)
	if a.tryLease() {
		t.Fatal("A took B's lease back")
	}
	if holder, held := a.leaseState(); holder != "node-b" || held {
		t.Fatalf("A sees holder %q, held %v", holder, held)
	}
	// B renews at a third of the lifetime; A still cannot take it.
	clock.Advance(3 * time.Second)
	if !b.tryLease() || a.tryLease() {
		t.Fatal("renewal")
	}
	content, _ := os.ReadFile(filepath.Join(root, leaseFile))
	if holder, _, err := b.parseLease(content, clock.Now()); err != nil || holder != "node-b" {
		t.Fatalf("lease file %q", content)
	}
}

// TestEvictionOrder: the holder evicts the least recently used run first,
// tail before head, and spares recently used blocks.
func TestEvictionOrder(t *testing.T) {
	root := t.TempDir()
	clock := newFakeClock()
	now := clock.Now()
	old := now.Add(-time.Hour)
	write := func(i int, at time.Time) int64 {
		p := filepath.Join(root, blockRel(i))
		os.MkdirAll(filepath.Dir(p), 0o700)
		if err := os.WriteFile(p, blockData(i, testBlock), 0o600); err != nil {
			t.Fatal(err)
		}
		os.Chtimes(p, at, at)
		info, _ := NewOSDir(root).Stat(blockRel(i))
		return info.Allocated
	}
	// A chain of three written in one burst, a later single block, and a
	// block the oldest of all but fetched a moment ago (recent mtime).
	size := write(0, old)
	write(1, old.Add(100*time.Millisecond))
	write(2, old.Add(200*time.Millisecond))
	write(3, old.Add(10*time.Minute))
	write(4, now.Add(-time.Second))
	l, _, _ := newTestLevel(t, NewOSDir(root), root, func(c *Config) {
		c.Clock, c.Capacity, c.Protect = clock, 3*size, time.Minute
	})
	eventually(t, "evicted to capacity", func() bool { return l.Stats().EvictedBlocks == 2 })
	gone := func(i int) bool {
		_, err := os.Stat(filepath.Join(root, blockRel(i)))
		return errors.Is(err, os.ErrNotExist)
	}
	if !gone(2) || !gone(1) || gone(0) || gone(3) || gone(4) {
		t.Fatalf("evicted %v %v %v %v %v; want the chain's tail (2, 1) only", gone(0), gone(1), gone(2), gone(3), gone(4))
	}
	if s := l.Stats(); s.UsedBytes != 3*size || !s.LeaseHeld {
		t.Fatalf("used %d of %d, held %v", s.UsedBytes, 3*size, s.LeaseHeld)
	}
}

// TestLoserStopsEvicting: a node whose lease was taken over evicts nothing.
func TestLoserStopsEvicting(t *testing.T) {
	root := t.TempDir()
	clock := newFakeClock()
	l, _, _ := newTestLevel(t, NewOSDir(root), root, func(c *Config) {
		c.Clock, c.Capacity, c.Protect = clock, 1, time.Nanosecond
	})
	eventually(t, "lease held", l.holding)
	// Another node's lease replaces ours behind our back.
	other := keyHolder(testKey, "node-x").leaseContent(clock.Now().Add(DefaultLeaseTTL))
	os.WriteFile(filepath.Join(root, leaseFile), other, 0o600)
	p := filepath.Join(root, blockRel(1))
	os.MkdirAll(filepath.Dir(p), 0o700)
	os.WriteFile(p, blockData(1, testBlock), 0o600)
	// Its own view still says held: the lease read before the removal stops it.
	if !l.holding() {
		t.Fatal("lease given up before its expiry")
	}
	l.evict()
	if _, err := os.Stat(p); err != nil {
		t.Fatal("a node whose lease was taken over evicted")
	}
	if l.holding() {
		t.Fatal("still holding after seeing another holder")
	}
	l.tryLease()
	l.evict()
	if _, err := os.Stat(p); err != nil {
		t.Fatal("a node that lost the lease evicted")
	}
	if holder, held := l.leaseState(); held || holder != "node-x" {
		t.Fatalf("holder %q held %v", holder, held)
	}
}

// staleDir answers the reads of the lease, and of the lease moved aside,
// with ESTALE, as a distributed filesystem's client may while another node
// replaces the lease.
type staleDir struct{ Dir }

func (d staleDir) ReadFile(rel string, limit int64) ([]byte, error) {
	if strings.HasPrefix(rel, leaseFile) {
		return nil, syscall.ESTALE
	}
	return d.Dir.ReadFile(rel, limit)
}

// TestLeaseReadFailureTakesNothing: a lease read that fails for another
// reason than the file (ESTALE while its holder renews it) never takes a
// live lease over.
func TestLeaseReadFailureTakesNothing(t *testing.T) {
	root := t.TempDir()
	clock := newFakeClock()
	a, _, _ := newTestLevel(t, NewOSDir(root), root, func(c *Config) { c.Clock, c.Capacity = clock, 1<<40 })
	eventually(t, "A holds the lease", a.holding)
	b, _, _ := newTestLevel(t, staleDir{NewOSDir(root)}, root, func(c *Config) { c.Clock, c.Capacity, c.Holder = clock, 1<<40, "node-b" })
	if b.tryLease() || b.holding() {
		t.Fatal("B took the lease over on a failed read")
	}
	if !a.tryLease() {
		t.Fatal("A lost its lease to B's failed read")
	}
}
