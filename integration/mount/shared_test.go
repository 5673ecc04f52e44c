package mount_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
	"github.com/kvtierfs/kvtierfs/integration/engineio"
	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

// sharedPair mounts two daemons ("replicas" on other nodes) sharing one plain
// directory as --shared, and returns them with that directory.
func sharedPair(t *testing.T) (a, b *mounttest.Daemon, sharedDir string) {
	t.Helper()
	sharedDir = t.TempDir()
	args := []string{"--shared", sharedDir, "--shared-key-file", mounttest.SharedKeyFile(t), "--shared-negative-ttl", "400ms", "--shared-timeout", "5s"}
	a = mounttest.Start(t, mounttest.Options{Args: args})
	b = mounttest.Start(t, mounttest.Options{Args: args})
	return a, b, sharedDir
}

// waitWrittenBehind polls a daemon's stats until its write-behind queue is
// empty and at least n blocks were written (the contract's wait).
func waitWrittenBehind(t *testing.T, d *mounttest.Daemon, n int64) {
	t.Helper()
	for range 1000 {
		sh := d.Stats().Shared
		if sh == nil {
			t.Fatal("stats.json has no \"shared\" object with --shared")
		}
		if sh.QueueBlocks == 0 && sh.WrittenBlocks >= n {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("write-behind did not drain: %+v", d.Stats().Shared)
}

// TestSharedCrossReplica: replica A stores a chain; it is written behind to
// the shared directory in the tier layout; replica B, whose store never saw
// it, finds every block and loads it byte-exact, then loads it again from
// its own store.
func TestSharedCrossReplica(t *testing.T) {
	a, b, sharedDir := sharedPair(t)
	const n = 4
	region := newRegion(t, n)
	tierA := openTier(t, a)
	tierB := openTier(t, b)
	// B asks before A stores: the absent answer is cached, in the kernel and the daemon.
	if tierB.Exists(tierB.BlockPath(tierDir, 0, hashOf(0))) {
		t.Fatal("B finds a block nobody stored")
	}
	for i := range n {
		storeBlock(t, tierA, region.Row(i), i)
	}
	waitWrittenBehind(t, a, n)
	rel, err := filepath.Rel(a.Mountpoint, tierA.BlockPath(tierDir, 0, hashOf(0)))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(sharedDir, rel)); err != nil || !bytes.Equal(got, expectedRow(0)) {
		t.Fatalf("the shared directory does not hold block 0 in the tier layout: %v", err)
	}
	// Visible on B within --shared-negative-ttl (400ms: 200ms of kernel
	// negative entry, 200ms of the daemon's cache), not the kernel's default 5s.
	time.Sleep(500 * time.Millisecond)
	var fetched int64
	for round := range 2 {
		for i := range n {
			path := tierB.BlockPath(tierDir, 0, hashOf(i))
			if !tierB.Exists(path) {
				t.Fatalf("round %d: B does not find block %d stored by A", round, i)
			}
			row := region.Row(i)
			clear(row)
			if err := tierB.LoadIgnoringClose(path, row); err != nil {
				t.Fatalf("round %d: B loading block %d: %v", round, i, err)
			}
			if !bytes.Equal(row, expectedRow(i)) {
				t.Fatalf("round %d: B loaded other bytes for block %d", round, i)
			}
		}
		// Every block was fetched in the first round (by the load, or by
		// staging ahead of it); the second round reads B's own store.
		sh := b.Stats().Shared
		if round == 0 && (sh.FetchedBlocks < n || sh.CorruptDropped != 0) {
			t.Fatalf("B fetched %d blocks of %d, %d corrupt", sh.FetchedBlocks, n, sh.CorruptDropped)
		}
		if round == 1 && sh.FetchedBlocks != fetched {
			t.Fatalf("B fetched again on its second load: %d fetches, then %d", fetched, sh.FetchedBlocks)
		}
		fetched = sh.FetchedBlocks
	}
	if st := b.Stats(); st.Disk.Blocks != n {
		t.Fatalf("B's store holds %d blocks after fetching %d", st.Disk.Blocks, n)
	}
	// A key nobody stored is absent on B.
	absent := tierB.BlockPath(tierDir, 0, hashOf(99))
	if tierB.Exists(absent) {
		t.Fatal("an absent key answered present")
	}
}

// TestSharedCorruptRefused: bytes changed in the shared store are refused at
// B's load (a miss, ENOENT, never EIO), removed from the shared store and counted.
func TestSharedCorruptRefused(t *testing.T) {
	a, b, sharedDir := sharedPair(t)
	region := newRegion(t, 1)
	tierA := openTier(t, a)
	pathA := storeBlock(t, tierA, region.Row(0), 7)
	waitWrittenBehind(t, a, 1)
	rel, _ := filepath.Rel(a.Mountpoint, pathA)
	sharedPath := filepath.Join(sharedDir, rel)
	f, err := os.OpenFile(sharedPath, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("corrupt"), 4096); err != nil {
		t.Fatal(err)
	}
	f.Close()
	tierB := openTier(t, b)
	pathB := tierB.BlockPath(tierDir, 0, hashOf(7))
	if !tierB.Exists(pathB) {
		t.Fatal("B does not see the block in the shared store")
	}
	err = tierB.LoadIgnoringClose(pathB, region.Row(0))
	if !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("loading corrupt shared bytes: %v, want ENOENT", err)
	}
	if _, err := os.Stat(sharedPath); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("the corrupt block is still in the shared store")
	}
	if sh := b.Stats().Shared; sh.CorruptDropped != 1 || sh.FetchedBlocks != 0 {
		t.Fatalf("B: %d corrupt dropped, %d fetched", sh.CorruptDropped, sh.FetchedBlocks)
	}
	if !strings.Contains(b.Log(), "corrupt block in the shared store refused") {
		t.Fatal("the refusal is not logged")
	}
}

// TestSharedChainStaged: a chain B matched (.kvtier/match) but holds only in
// the shared store is found whole, and streamed ahead of its loads by
// staging, as from the disk: loads are served from memory, every byte right.
func TestSharedChainStaged(t *testing.T) {
	const blocks = 16
	a, b, _ := sharedPair(t)
	region := newRegion(t, 2)
	tierA := openTier(t, a)
	for i := range blocks {
		storeBlock(t, tierA, region.Row(0), i)
	}
	waitWrittenBehind(t, a, blocks)
	tierB := openTier(t, b)
	time.Sleep(500 * time.Millisecond) // --shared-negative-ttl after the probe above
	// A batched match on B finds the whole chain in the shared store (and
	// teaches staging the chain, as the lookups would).
	full := ctlabi.GroupSpec{Group: 0, Kind: ctlabi.KindFull}
	for i := range blocks + 2 {
		full.Keys = append(full.Keys, hashOf(i))
	}
	body, err := ctlabi.EncodeMatchRequest(ctlabi.MatchRequest{Tier: tierDir, Groups: []ctlabi.GroupSpec{full}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := ctlabi.DecodeMatchResult(matchThroughMount(t, b, body))
	if err != nil || got.HitChunks != blocks {
		t.Fatalf("B's match: %d hit chunks, want %d (%v)", got.HitChunks, blocks, err)
	}
	for i := range blocks {
		row := region.Row(1)
		if err := tierB.Load(tierB.BlockPath(tierDir, 0, hashOf(i)), row); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(row, expectedRow(i)) {
			t.Fatalf("block %d loaded with wrong bytes", i)
		}
	}
	st := b.Stats()
	if st.Staging == nil || st.Staging.Hits == 0 || st.Shared.FetchedBlocks < blocks {
		t.Fatalf("staging %+v, %d fetched: want loads served from blocks staged from the shared store", st.Staging, st.Shared.FetchedBlocks)
	}
}

// TestSharedUnreachable: the shared filesystem hangs (its requests block in
// the kernel). A's stores go on locally and wait to be written behind; both
// replicas mark the level unreachable and answer shared lookups absent; B's
// own blocks still store and load. When it answers again, A's queue drains
// and B finds and loads what A stored meanwhile.
func TestSharedUnreachable(t *testing.T) {
	sharedDir := filepath.Join(t.TempDir(), "shared")
	hung := mountHangFS(t, sharedDir)
	args := []string{"--shared", sharedDir, "--shared-key-file", mounttest.SharedKeyFile(t), "--shared-negative-ttl", "400ms", "--shared-timeout", "300ms"}
	a := mounttest.Start(t, mounttest.Options{Args: args})
	b := mounttest.Start(t, mounttest.Options{Args: args})
	t.Cleanup(hung.resume) // before the daemons stop
	region := newRegion(t, 2)
	tierA, tierB := openTier(t, a), openTier(t, b)
	storeBlock(t, tierA, region.Row(0), 0)
	waitWrittenBehind(t, a, 1)

	hung.hang()
	storeBlock(t, tierA, region.Row(0), 1)
	waitShared(t, a, "A unreachable with a block behind", func(sh *ctlabi.Shared) bool { return !sh.Reachable && sh.BytesBehind > 0 })
	if !hasWarning(a.Stats().Warnings, "shared_unreachable") {
		t.Fatal("no shared_unreachable warning while the shared store hangs")
	}
	// B: shared lookups answer absent (the first one within the bound, then at once).
	for i := range 3 {
		if tierB.Exists(tierB.BlockPath(tierDir, 0, hashOf(i))) {
			t.Fatalf("B finds block %d while the shared store hangs", i)
		}
	}
	waitShared(t, b, "B unreachable", func(sh *ctlabi.Shared) bool { return !sh.Reachable })
	// B's own blocks are served as always.
	pathB := storeBlock(t, tierB, region.Row(0), 9)
	if err := tierB.Load(pathB, region.Row(1)); err != nil || !bytes.Equal(region.Row(1), expectedRow(9)) {
		t.Fatalf("B's own block while the shared store hangs: %v", err)
	}

	hung.resume()
	waitShared(t, a, "A's queue drained", func(sh *ctlabi.Shared) bool { return sh.Reachable && sh.WrittenBlocks >= 2 && sh.BytesBehind == 0 })
	waitShared(t, b, "B reachable", func(sh *ctlabi.Shared) bool { return sh.Reachable })
	time.Sleep(500 * time.Millisecond) // --shared-negative-ttl
	path := tierB.BlockPath(tierDir, 0, hashOf(1))
	if !tierB.Exists(path) {
		t.Fatal("B does not find the block A stored while the shared store hung")
	}
	if err := tierB.Load(path, region.Row(1)); err != nil || !bytes.Equal(region.Row(1), expectedRow(1)) {
		t.Fatalf("B loading it: %v", err)
	}
}

// waitShared polls a daemon's "shared" stats until cond holds.
func waitShared(t *testing.T, d *mounttest.Daemon, what string, cond func(*ctlabi.Shared) bool) {
	t.Helper()
	for range 1000 {
		if sh := d.Stats().Shared; sh != nil && cond(sh) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("never: %s: %+v", what, d.Stats().Shared)
}

// TestSharedLeaseAndCapacity: two replicas with a shared capacity; exactly
// one holds the eviction lease and both name it; the holder brings the
// shared store down to its capacity; when the holder goes, the other
// takes the lease over.
func TestSharedLeaseAndCapacity(t *testing.T) {
	sharedDir := t.TempDir()
	const blocks, capacityBlocks = 8, 4
	args := []string{"--shared", sharedDir, "--shared-key-file", mounttest.SharedKeyFile(t), "--shared-capacity", strconv.Itoa(capacityBlocks * rowBytes),
		"--shared-lease-ttl", "1s", "--shared-negative-ttl", "400ms"}
	a := mounttest.Start(t, mounttest.Options{Args: args})
	b := mounttest.Start(t, mounttest.Options{Args: args})
	var holder *mounttest.Daemon
	for range 1000 {
		sa, sb := a.Stats().Shared, b.Stats().Shared
		if sa.LeaseHeld && sb.LeaseHeld {
			t.Fatal("both replicas hold the eviction lease")
		}
		if sa.LeaseHeld && sb.LeaseHolder == sa.LeaseHolder {
			holder = a
		} else if sb.LeaseHeld && sa.LeaseHolder == sb.LeaseHolder {
			holder = b
		}
		if holder != nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if holder == nil {
		t.Fatalf("no replica holds the lease: %+v / %+v", a.Stats().Shared, b.Stats().Shared)
	}
	other := map[*mounttest.Daemon]*mounttest.Daemon{a: b, b: a}[holder]
	region := newRegion(t, 1)
	tierA := openTier(t, a)
	for i := range blocks {
		storeBlock(t, tierA, region.Row(0), i)
	}
	waitWrittenBehind(t, a, blocks)
	// The holder evicts once the blocks are older than the protection.
	waitShared(t, holder, "shared store within its capacity", func(sh *ctlabi.Shared) bool {
		return sh.EvictedBlocks >= blocks-capacityBlocks && sh.UsedBytes <= capacityBlocks*rowBytes
	})
	if ev := other.Stats().Shared.EvictedBlocks; ev != 0 {
		t.Fatalf("the replica without the lease evicted %d blocks", ev)
	}
	left := 0
	for i := range blocks {
		if _, err := os.Stat(filepath.Join(sharedDir, relOf(t, tierA, a, i))); err == nil {
			left++
		}
	}
	if left > capacityBlocks {
		t.Fatalf("%d blocks left in the shared store, capacity %d", left, capacityBlocks)
	}
	holder.Stop()
	waitShared(t, other, "the other replica takes the lease over", func(sh *ctlabi.Shared) bool { return sh.LeaseHeld })
}

// relOf is block i's path relative to the tier root.
func relOf(t *testing.T, tier *engineio.Tier, d *mounttest.Daemon, i int) string {
	t.Helper()
	rel, err := filepath.Rel(d.Mountpoint, tier.BlockPath(tierDir, 0, hashOf(i)))
	if err != nil {
		t.Fatal(err)
	}
	return rel
}
