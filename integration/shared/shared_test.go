package shared_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
	"github.com/kvtierfs/kvtierfs/integration/engineio"
	"github.com/kvtierfs/kvtierfs/integration/gluster"
	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

// opBound is the generous bound on one engine operation (a store, a load, a
// lookup) while the shared filesystem is unreachable: far above the
// --shared-timeout of 2 s given to the daemons, far below a hang.
const opBound = 10 * time.Second

// TestSharedOverGluster brings one volume up for every case; each case has
// its own --shared directory on it.
func TestSharedOverGluster(t *testing.T) {
	c := gluster.Start(t, gluster.Options{})
	for _, tc := range []struct {
		name string
		run  func(*testing.T, *gluster.Cluster, string)
	}{
		{"cross-replica", crossReplica},
		{"unreachable", sharedUnreachable},
		{"corrupt", corruptSharedBlockRefused},
		{"removed-while-read", removedWhileRead},
		{"mirrored-fetch", mirroredFetch},
		{"lease-capacity", evictionLeaseAndCapacity},
		{"hostile", hostileSharedDir},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, c, tc.name) })
	}
}

// crossReplica: replica A stores a chain; it is written
// behind to the volume in the tier layout, digests in xattrs, readable by
// vLLM straight from the volume; replica B on the other node, whose store
// never saw it, finds every block and loads it byte-exact, the second time
// from its own store.
func crossReplica(t *testing.T, c *gluster.Cluster, sub string) {
	a, b := startReplica(t, c.Nodes[0], sub), startReplica(t, c.Nodes[1], sub)
	const n = 12
	for i := range n {
		a.store(t, i)
	}
	a.waitWrittenBehind(t, n, time.Minute)

	onBrick := blockFiles(t, filepath.Join(c.Brick(), sub))
	for i := range n {
		if size, ok := onBrick[a.rel(i)]; !ok || size != rowBytes {
			t.Fatalf("the brick holds block %d at %s as %d bytes (present %v), want %d", i, a.rel(i), size, ok, rowBytes)
		}
		brickPath := a.onBrick(c, i)
		if _, err := os.Stat(brickPath + ".kvdigest"); err == nil {
			t.Fatalf("block %d has a digest sidecar on a volume that keeps xattrs", i)
		}
		if !hasXattrPrefix(t, brickPath, "user.kvtierfs.") {
			t.Fatalf("block %d carries no digest xattr on the brick", i)
		}
	}
	// The shared directory is also a valid vLLM tier root: the engine reads
	// a block straight from the volume.
	vllm := &engineio.Tier{Root: filepath.Join(b.node.Mount, sub)}
	row := b.region.Row(2)
	if err := vllm.Load(vllm.BlockPath(tierDir, 0, hashOf(0)), row); err != nil || string(row) != string(expectedRow(0)) {
		t.Fatalf("vLLM-style load straight from B's volume mount: %v", err)
	}

	if st := b.daemon.Stats(); st.Disk.Blocks != 0 {
		t.Fatalf("B's own store holds %d blocks before any lookup", st.Disk.Blocks)
	}
	for round := range 2 {
		for i := range n {
			if !b.tier.Exists(b.path(i)) {
				t.Fatalf("round %d: B does not find block %d stored by A", round, i)
			}
			exact, err := b.load(i)
			if err != nil || !exact {
				t.Fatalf("round %d: B loading block %d: exact %v, %v", round, i, exact, err)
			}
		}
	}
	sh := b.stats(t)
	if sh.FetchedBlocks != n || sh.FetchedBytes != n*rowBytes || sh.CorruptDropped != 0 || sh.LookupHits < n || !sh.Reachable {
		t.Fatalf("B's shared stats after two rounds (the second from its own store): %+v", sh)
	}
	if st := b.daemon.Stats(); st.Disk.Blocks != n {
		t.Fatalf("B's store holds %d blocks after fetching %d", st.Disk.Blocks, n)
	}
	if b.tier.Exists(b.tier.BlockPath(tierDir, 0, hashOf(1000))) {
		t.Fatal("a key nobody stored answers present on B")
	}
}

// hasXattrPrefix reports whether a file carries an xattr whose name begins
// with prefix.
func hasXattrPrefix(t *testing.T, path, prefix string) bool {
	t.Helper()
	buf := make([]byte, 4096)
	n, err := unix.Listxattr(path, buf)
	if err != nil {
		t.Fatalf("listxattr %s: %v", path, err)
	}
	for _, name := range strings.Split(string(buf[:n]), "\x00") {
		if strings.HasPrefix(name, prefix) {
			return true
		}
	}
	return false
}

// sharedUnreachable makes the volume unreachable — its brick process
// killed, or both nodes' links cut — after replica A wrote some blocks
// behind. Meanwhile A stores and loads its own blocks as before, B's lookups
// of blocks that are only in the shared store answer absent within a bound,
// and both report the level unreachable. Once the volume is back, A's queue
// drains and B finds and loads every block.
func sharedUnreachable(t *testing.T, c *gluster.Cluster, sub string) {
	faults := []struct {
		name         string
		cut, restore func() error
	}{
		{"brick stopped", c.StopBrick, c.StartBrick},
		{"links cut", func() error {
			for _, n := range c.Nodes {
				if err := c.CutLink(n); err != nil {
					return err
				}
			}
			return nil
		}, func() error {
			for _, n := range c.Nodes {
				if err := c.RestoreLink(n); err != nil {
					return err
				}
			}
			return nil
		}},
	}
	for f, fault := range faults {
		t.Run(fault.name, func(t *testing.T) {
			first := 100 * (f + 1)
			const before, during = 4, 4
			a, b := startReplica(t, c.Nodes[0], sub), startReplica(t, c.Nodes[1], sub)
			for i := first; i < first+before; i++ {
				a.store(t, i)
			}
			a.waitWrittenBehind(t, before, time.Minute)

			if err := fault.cut(); err != nil {
				t.Fatal(err)
			}
			restored := false
			defer func() {
				if !restored {
					fault.restore()
				}
			}()
			for i := first + before; i < first+before+during; i++ {
				if d := timed(func() { a.store(t, i) }); d > opBound {
					t.Fatalf("A's store of block %d took %s with the shared store unreachable", i, d)
				}
			}
			for i := first; i < first+before+during; i++ {
				var exact bool
				var err error
				if d := timed(func() { exact, err = a.load(i) }); err != nil || !exact || d > opBound {
					t.Fatalf("A's load of its own block %d with the shared store unreachable: exact %v, %v, %s", i, exact, err, d)
				}
			}
			for i := first; i < first+before; i++ {
				var present bool
				d := timed(func() { present = b.tier.Exists(b.path(i)) })
				if present || d > opBound {
					t.Fatalf("B's lookup of block %d, only in the unreachable shared store: present %v after %s", i, present, d)
				}
				t.Logf("B's lookup %d answered absent in %s", i-first, d.Round(time.Millisecond))
			}
			unreachable := func(st ctlabi.Shared) bool { return !st.Reachable }
			b.waitStats(t, 30*time.Second, "unreachable", unreachable)
			sa := a.waitStats(t, 30*time.Second, "unreachable", unreachable)
			if out, _ := mounttest.Run("stat", a.daemon.Mountpoint); !strings.Contains(out, "shared_unreachable") {
				t.Fatalf("kvtierfs stat does not warn while the shared store is unreachable:\n%s", out)
			}
			if sa.WrittenBlocks != before || sa.BytesBehind < during*rowBytes {
				t.Fatalf("A's write-behind while unreachable: %+v", sa)
			}

			restored = true
			if err := fault.restore(); err != nil {
				t.Fatal(err)
			}
			a.waitWrittenBehind(t, before+during, 2*time.Minute)
			b.waitStats(t, time.Minute, "reachable again", func(st ctlabi.Shared) bool { return st.Reachable })
			for i := first; i < first+before+during; i++ {
				deadline := time.Now().Add(30 * time.Second)
				for !b.tier.Exists(b.path(i)) {
					if time.Now().After(deadline) {
						t.Fatalf("B does not find block %d after the shared store returned: %+v", i, b.stats(t))
					}
					time.Sleep(200 * time.Millisecond)
				}
				if exact, err := b.load(i); err != nil || !exact {
					t.Fatalf("B loading block %d after the shared store returned: exact %v, %v", i, exact, err)
				}
			}
		})
	}
}

// corruptSharedBlockRefused changes bytes of a block in the shared store
// — behind the filesystem's back on the brick, or through a client mount —
// and checks that B's load is refused (never served), the block is dropped
// from the shared store, the key answers absent on B and nothing of it stays
// in B's store.
func corruptSharedBlockRefused(t *testing.T, c *gluster.Cluster, sub string) {
	for k, where := range []string{"brick", "mount"} {
		t.Run(where, func(t *testing.T) {
			i := 200 + k
			a, b := startReplica(t, c.Nodes[0], sub), startReplica(t, c.Nodes[1], sub)
			a.store(t, i)
			a.waitWrittenBehind(t, 1, time.Minute)
			target := a.onBrick(c, i)
			if where == "mount" {
				target = a.shared(i)
			}
			f, err := os.OpenFile(target, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt([]byte("not the KV that was stored"), rowBytes/2); err != nil {
				t.Fatal(err)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}

			if !b.tier.Exists(b.path(i)) {
				t.Fatal("B does not see the block in the shared store")
			}
			exact, err := b.load(i)
			if err == nil {
				t.Fatalf("B's load of corrupt shared bytes succeeded (bytes exact: %v)", exact)
			}
			t.Logf("B's load refused: %v", err)
			deadline := time.Now().Add(3 * time.Second)
			for b.tier.Exists(b.path(i)) {
				if time.Now().After(deadline) {
					t.Fatal("the refused key still answers present on B")
				}
				time.Sleep(50 * time.Millisecond)
			}
			if _, err := os.Stat(a.onBrick(c, i)); !os.IsNotExist(err) {
				t.Fatalf("the corrupt block is still in the shared store: %v", err)
			}
			if sh := b.stats(t); sh.CorruptDropped != 1 || sh.FetchedBlocks != 0 {
				t.Fatalf("B's shared stats: %+v", sh)
			}
			if st := b.daemon.Stats(); st.Disk.Blocks != 0 {
				t.Fatalf("B's store holds %d blocks after refusing the only one", st.Disk.Blocks)
			}
			if exact, err := a.load(i); err != nil || !exact {
				t.Fatalf("A's own copy of the block: exact %v, %v", exact, err)
			}
		})
	}
}

// removedWhileRead removes a block from the shared store (as another node's
// evictor does) after B's lookup found it and before B loads it: the load is
// a miss (ENOENT, the engine prefills the block again), never an I/O error,
// and the key then answers absent (at once on kernel 6.18; within the
// kernel's entry timeout at worst).
func removedWhileRead(t *testing.T, c *gluster.Cluster, sub string) {
	const i = 250
	a, b := startReplica(t, c.Nodes[0], sub), startReplica(t, c.Nodes[1], sub)
	a.store(t, i)
	a.waitWrittenBehind(t, 1, time.Minute)
	if !b.tier.Exists(b.path(i)) {
		t.Fatal("B does not see the block in the shared store")
	}
	if err := os.Remove(a.shared(i)); err != nil {
		t.Fatal(err)
	}
	_, err := b.load(i)
	if !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("B's load of a block removed from the shared store after its lookup: %v, want ENOENT", err)
	}
	// The kernel could keep the positive entry of B's earlier lookup until
	// its entry timeout; 6.18 drops it at the failed open.
	began := time.Now()
	for b.tier.Exists(b.path(i)) {
		if time.Since(began) > 3*time.Second {
			t.Fatal("the removed block still answers present on B")
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("the removed block answered absent %s after the miss", time.Since(began).Round(time.Millisecond))
	if sh := b.stats(t); sh.CorruptDropped != 0 || sh.FetchedBlocks != 0 {
		t.Fatalf("B's shared stats: %+v", sh)
	}
}

// mirroredFetch: a tensor-parallel group on node 2 (a head mirroring its
// loaded rows to a peer, both with --shared) loads blocks that replica A on
// node 1 stored and that are only in the shared store: the head fetches
// them, and every loaded row is still mirrored to the peer before the read
// returns, so the peer's row holds the same bytes.
func mirroredFetch(t *testing.T, c *gluster.Cluster, sub string) {
	const first, n = 400, 3
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte(strings.Repeat("a1b2c3d4", 8)), 0o600); err != nil {
		t.Fatal(err)
	}
	const addr = "127.0.0.1:7411" // the loopback of node 2's own namespace
	a := startReplica(t, c.Nodes[0], sub)
	// The group has stored nothing itself, so --replicated-kv auto would
	// have no store-time samples and withhold every lookup: a replica that
	// only reuses others' blocks declares its KV replicated (MLA).
	peer := startReplica(t, c.Nodes[1], sub, "--listen", addr, "--row-bytes", strconv.Itoa(rowBytes), "--secret-file", secret)
	head := startReplica(t, c.Nodes[1], sub, "--peer", addr, "--secret-file", secret, "--replicated-kv", "on")
	for i := first; i < first+n; i++ {
		a.store(t, i)
	}
	a.waitWrittenBehind(t, n, time.Minute)
	for i := first; i < first+n; i++ {
		row := 1 + (i-first)%3
		clear(head.region.Row(row))
		if err := head.tier.LoadIgnoringClose(head.path(i), head.region.Row(row)); err != nil {
			st := head.daemon.Stats()
			t.Fatalf("the head loading block %d from the shared store: %v (withheld %d, replication %+v)", i, err, st.Counters.LookupsWithheld, st.Replication)
		}
		if string(head.region.Row(row)) != string(expectedRow(i)) {
			t.Fatalf("the head loaded other bytes for block %d", i)
		}
		if string(peer.region.Row(row)) != string(head.region.Row(row)) {
			t.Fatalf("block %d: the peer's row differs from the head's after the load returned", i)
		}
	}
	if st := head.daemon.Stats(); st.Counters.RowsMirrored != n || st.Shared == nil || st.Shared.FetchedBlocks != n {
		t.Fatalf("the head mirrored %d rows and fetched %+v, want %d each", st.Counters.RowsMirrored, st.Shared, n)
	}
}

// evictionLeaseAndCapacity runs two replicas with --shared-capacity:
// exactly one holds the eviction lease, that one alone brings the shared
// store down to the capacity (tail of the chain first), and when it crashes
// the other takes the lease over once it expires and holds the capacity in
// its turn.
func evictionLeaseAndCapacity(t *testing.T, c *gluster.Cluster, sub string) {
	const capacityBlocks, ttl = 6, 3 * time.Second
	args := []string{"--shared-capacity", fmt.Sprint(capacityBlocks * rowBytes), "--shared-lease-ttl", ttl.String()}
	reps := []*replica{startReplica(t, c.Nodes[0], sub, args...), startReplica(t, c.Nodes[1], sub, args...)}

	holder, other := waitOneHolder(t, reps, 30*time.Second)
	for range 20 {
		s0, s1 := reps[0].stats(t), reps[1].stats(t)
		if s0.LeaseHeld && s1.LeaseHeld {
			t.Fatalf("both replicas hold the lease: %+v / %+v", s0, s1)
		}
		time.Sleep(ttl / 10)
	}

	// A chain of twice the capacity, stored half by each replica.
	const n = 2 * capacityBlocks
	for i := range n {
		reps[i%2].store(t, i)
	}
	for _, r := range reps {
		r.waitWrittenBehind(t, n/2, time.Minute)
	}
	ageChain(t, reps[0], 0, n)
	holdsCapacity(t, c, sub, capacityBlocks, 0, n)
	if sh := other.stats(t); sh.EvictedBlocks != 0 {
		t.Fatalf("the replica without the lease evicted %d blocks", sh.EvictedBlocks)
	}
	// The brick may show an eviction's unlink a moment before the holder
	// counts it.
	sh := holder.waitStats(t, 10*time.Second, "the tail's evictions counted", func(st ctlabi.Shared) bool {
		return st.EvictedBlocks >= n-capacityBlocks
	})
	if sh.EvictedBlocks != n-capacityBlocks || sh.CapacityBytes != capacityBlocks*rowBytes {
		t.Fatalf("the lease holder's shared stats: %+v", sh)
	}

	crashed := time.Now()
	holder.daemon.Kill9()
	other.waitStats(t, 3*ttl+20*time.Second, "lease taken over", func(st ctlabi.Shared) bool { return st.LeaseHeld })
	t.Logf("lease taken over %s after the holder crashed (TTL %s)", time.Since(crashed).Round(time.Millisecond), ttl)

	const more = 300
	for i := more; i < more+capacityBlocks; i++ {
		other.store(t, i)
	}
	other.waitWrittenBehind(t, n/2+capacityBlocks, time.Minute)
	ageChain(t, other, more, more+capacityBlocks)
	deadline := time.Now().Add(time.Minute)
	for {
		used := int64(0)
		for _, size := range blockFiles(t, filepath.Join(c.Brick(), sub)) {
			used += size
		}
		if used <= capacityBlocks*rowBytes {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the new holder does not hold the capacity: %d bytes in the shared store: %+v", used, other.stats(t))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitOneHolder waits until exactly one replica holds the lease and both
// name the same holder.
func waitOneHolder(t *testing.T, reps []*replica, within time.Duration) (holder, other *replica) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		s0, s1 := reps[0].stats(t), reps[1].stats(t)
		if s0.LeaseHeld != s1.LeaseHeld && s0.LeaseHolder != "" && s0.LeaseHolder == s1.LeaseHolder {
			if s0.LeaseHeld {
				return reps[0], reps[1]
			}
			return reps[1], reps[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no single lease holder within %s: %+v / %+v", within, s0, s1)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ageChain sets the modification times of blocks [from, to) in the shared
// store ten minutes back, 100 ms apart in chain order, through a client
// mount: the evictor spares blocks used within the last minute, and a test
// does not wait that long.
func ageChain(t *testing.T, r *replica, from, to int) {
	t.Helper()
	base := time.Now().Add(-10 * time.Minute)
	for i := from; i < to; i++ {
		at := base.Add(time.Duration(i-from) * 100 * time.Millisecond)
		if err := os.Chtimes(r.shared(i), at, at); err != nil {
			t.Fatal(err)
		}
	}
}

// holdsCapacity waits until the shared store holds at most capacity and
// checks that the chain [from, to) lost its tail, not its head.
func holdsCapacity(t *testing.T, c *gluster.Cluster, sub string, capacityBlocks, from, to int) {
	t.Helper()
	var files map[string]int64
	deadline := time.Now().Add(time.Minute)
	for {
		files = blockFiles(t, filepath.Join(c.Brick(), sub))
		used := int64(0)
		for _, size := range files {
			used += size
		}
		if used <= int64(capacityBlocks)*rowBytes {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the shared store holds %d bytes, capacity %d", used, capacityBlocks*rowBytes)
		}
		time.Sleep(200 * time.Millisecond)
	}
	layout := &engineio.Tier{}
	for i := from; i < to; i++ {
		_, kept := files[layout.BlockPath(tierDir, 0, hashOf(i))]
		if head := i-from < capacityBlocks; kept != head {
			t.Errorf("block %d of the chain: kept %v, want the head kept and the tail evicted", i-from, kept)
		}
	}
}

// hostileSharedDir: another writer prepared the shared directory on the
// volume: the eviction lease a FIFO, the engine's tier a link to a
// directory outside the volume, and in another tier blocks put there
// without the key (no record, a sparse tebibyte). The holder takes the
// lease over and stays reachable, nothing is written through the link, and
// the other node answers the forged blocks absent and fails their loads as
// misses.
func hostileSharedDir(t *testing.T, c *gluster.Cluster, sub string) {
	root := filepath.Join(c.Nodes[0].Mount, sub)
	outside := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, ".kvtierfs"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(root, ".kvtierfs", "evict.lease"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(root, tierDir)); err != nil {
		t.Fatal(err)
	}
	const forgedTier = "Forged_0123456789ab_r0"
	forged := func(i int) string {
		h := hashOf(i)
		return filepath.Join(forgedTier, h[:3], h[3:5]+"_g0", h+".bin")
	}
	for _, i := range []int{301, 302} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, forged(i))), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, forged(301)), expectedRow(301), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, forged(302)), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(root, forged(302)), 1<<40); err != nil {
		t.Fatal(err)
	}

	a := startReplica(t, c.Nodes[0], sub, "--shared-capacity", "1GiB", "--shared-lease-ttl", "3s")
	a.waitStats(t, time.Minute, "the lease taken over from the FIFO", func(st ctlabi.Shared) bool { return st.LeaseHeld })
	a.store(t, 300)
	st := a.waitStats(t, time.Minute, "the write-behind tried", func(st ctlabi.Shared) bool { return st.QueueBlocks == 0 && st.BytesBehind == 0 })
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Fatalf("the daemon wrote through the tier's link: %v", entries)
	}
	if st.WrittenBlocks != 0 || !st.Reachable || st.Timeouts != 0 {
		t.Fatalf("A beside the FIFO and the link: %+v", st)
	}
	b := startReplica(t, c.Nodes[1], sub)
	for _, i := range []int{301, 302} {
		path := filepath.Join(b.daemon.Mountpoint, forged(i))
		if b.tier.Exists(path) {
			t.Fatalf("forged block %d answers present", i)
		}
		if err := b.tier.LoadIgnoringClose(path, b.region.Row(1)); !errors.Is(err, syscall.ENOENT) {
			t.Fatalf("loading forged block %d: %v, want ENOENT", i, err)
		}
	}
	if sh := b.stats(t); sh.FetchedBlocks != 0 || !sh.Reachable {
		t.Fatalf("B after the forged blocks: %+v", sh)
	}
}
