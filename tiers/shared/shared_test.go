package shared

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

var (
	testBlock   = 4 * block.PageSize
	testBlock64 = int64(testBlock)
)

// TestWriteBehindDrains: published blocks reach the shared directory in the
// local layout, with their record in the xattr and their zero page a hole,
// and a second node reads them back verified.
func TestWriteBehindDrains(t *testing.T) {
	root := t.TempDir()
	l, local, _ := newTestLevel(t, NewOSDir(root), root, nil)
	for i := range 5 {
		local.put(blockRel(i), blockData(i, testBlock))
		l.Published(blockRel(i), testBlock64)
	}
	eventually(t, "5 blocks written", func() bool { s := l.Stats(); return s.WrittenBlocks == 5 && s.QueueBlocks == 0 })
	for i := range 5 {
		got, err := os.ReadFile(filepath.Join(root, blockRel(i)))
		if err != nil || !bytes.Equal(got, blockData(i, testBlock)) {
			t.Fatalf("block %d in the shared dir: %v", i, err)
		}
		if _, err := NewOSDir(root).GetXattr(blockRel(i), recordXattr); err != nil {
			t.Fatalf("block %d has no record xattr: %v", i, err)
		}
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(root, blockRel(0)), &st); err != nil || st.Blocks*512 >= int64(testBlock+block.PageSize) {
		// (ext4 may give the record xattr a block of its own.)
		t.Errorf("zero page not left as a hole: %d bytes allocated for %d and a record", st.Blocks*512, testBlock)
	}
	other, otherLocal, _ := newTestLevel(t, NewOSDir(root), root, func(c *Config) { c.Holder = "node-b" })
	if !other.Lookup(blockRel(3)) {
		t.Fatal("node B does not find a written block")
	}
	fetched, err := other.Fetch(blockRel(3))
	if err != nil || !bytes.Equal(fetched, blockData(3, testBlock)) {
		t.Fatalf("fetch: %v, or other bytes handed back", err)
	}
	if got, _ := otherLocal.get(blockRel(3)); !bytes.Equal(got, blockData(3, testBlock)) {
		t.Fatal("node B imported other bytes")
	}
	if s := other.Stats(); s.FetchedBlocks != 1 || s.FetchedBytes != testBlock64 || s.LookupHits != 1 {
		t.Errorf("node B stats %+v", s)
	}
}

// TestAdmissionLookedUp: under looked-up admission a published block waits
// for its first local lookup, and is queued once.
func TestAdmissionLookedUp(t *testing.T) {
	root := t.TempDir()
	l, local, _ := newTestLevel(t, NewOSDir(root), root, func(c *Config) { c.Admit = AdmitLookedUp })
	local.put(blockRel(1), blockData(1, testBlock))
	local.put(blockRel(2), blockData(2, testBlock))
	l.Published(blockRel(1), testBlock64)
	l.Published(blockRel(2), testBlock64)
	l.LookedUp(blockRel(2), testBlock64)
	l.LookedUp(blockRel(2), testBlock64)
	eventually(t, "the looked-up block written", func() bool { return l.Stats().WrittenBlocks >= 1 })
	time.Sleep(50 * time.Millisecond)
	if s := l.Stats(); s.WrittenBlocks != 1 || s.QueueBlocks != 0 {
		t.Fatalf("written %d, queued %d; want only the looked-up block once", s.WrittenBlocks, s.QueueBlocks)
	}
	if _, err := os.Stat(filepath.Join(root, blockRel(1))); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("a block never looked up was written behind")
	}
}

// TestRateBudget: with a budget of one block per second and a clock that
// does not move, one block is written; each second of budget writes one more.
func TestRateBudget(t *testing.T) {
	root := t.TempDir()
	l, local, clock := newTestLevel(t, NewOSDir(root), root, func(c *Config) { c.Rate = testBlock64 })
	for i := range 3 {
		local.put(blockRel(i), blockData(i, testBlock))
		l.Published(blockRel(i), testBlock64)
	}
	eventually(t, "first block written", func() bool { return l.Stats().WrittenBlocks == 1 })
	time.Sleep(50 * time.Millisecond)
	if s := l.Stats(); s.WrittenBlocks != 1 || s.BytesBehind != 2*testBlock64 {
		t.Fatalf("before the budget refills: written %d, behind %d", s.WrittenBlocks, s.BytesBehind)
	}
	clock.Advance(time.Second)
	eventually(t, "second block written", func() bool { return l.Stats().WrittenBlocks == 2 })
	clock.Advance(time.Second)
	eventually(t, "third block written", func() bool { s := l.Stats(); return s.WrittenBlocks == 3 && s.BytesBehind == 0 })
}

// TestQueueBoundDropsOldest: beyond the queue's bytes the oldest blocks are dropped and counted.
func TestQueueBoundDropsOldest(t *testing.T) {
	root := t.TempDir()
	hang := newHangingDir(NewOSDir(root))
	l, local, _ := newTestLevel(t, hang, root, func(c *Config) { c.QueueBytes = 3 * testBlock64; c.Timeout = time.Hour })
	hang.hang()
	for i := range 6 {
		local.put(blockRel(i), blockData(i, testBlock))
		l.Published(blockRel(i), testBlock64)
	}
	// One block may be in flight (stuck); the queue holds three; the rest dropped.
	eventually(t, "queue full", func() bool { s := l.Stats(); return s.QueueBlocks+s.DroppedBlocks >= 5 })
	s := l.Stats()
	if s.QueueBytes > 3*testBlock64 || s.DroppedBlocks < 2 {
		t.Fatalf("queue %d bytes (bound %d), dropped %d", s.QueueBytes, 3*testBlock, s.DroppedBlocks)
	}
	hang.resume()
	eventually(t, "drained", func() bool { return l.Stats().BytesBehind == 0 })
	// The newest three survived; the writer may have taken one older block
	// before the queue filled, the others were dropped.
	written := 0
	for i := range 6 {
		if _, err := os.Stat(filepath.Join(root, blockRel(i))); err == nil {
			written++
		} else if i >= 3 {
			t.Fatalf("block %d, among the newest, was dropped", i)
		}
	}
	if dropped := l.Stats().DroppedBlocks; dropped < 2 || int64(written)+dropped != 6 {
		t.Fatalf("%d blocks written, %d dropped; want every block either", written, dropped)
	}
}

// TestSidecarWhenNoXattrs: a filesystem refusing xattrs gets sidecar records,
// which fetches read and verify.
func TestSidecarWhenNoXattrs(t *testing.T) {
	root := t.TempDir()
	l, local, _ := newTestLevel(t, noXattrs{NewOSDir(root)}, root, nil)
	local.put(blockRel(1), blockData(1, testBlock))
	l.Published(blockRel(1), testBlock64)
	eventually(t, "written", func() bool { return l.Stats().WrittenBlocks == 1 })
	if _, err := os.Stat(filepath.Join(root, blockRel(1)+sidecarSuffix)); err != nil {
		t.Fatalf("no sidecar: %v", err)
	}
	other, otherLocal, _ := newTestLevel(t, noXattrs{NewOSDir(root)}, root, func(c *Config) { c.Holder = "node-b" })
	if _, err := other.Fetch(blockRel(1)); err != nil {
		t.Fatal(err)
	}
	if got, _ := otherLocal.get(blockRel(1)); !bytes.Equal(got, blockData(1, testBlock)) {
		t.Fatal("wrong bytes through the sidecar path")
	}
}

// TestCorruptDropped: a shared block whose bytes fail their record is refused
// (ENOENT), removed from the shared store and counted; a block without a
// record is refused but left alone.
func TestCorruptDropped(t *testing.T) {
	root := t.TempDir()
	l, local, _ := newTestLevel(t, NewOSDir(root), root, nil)
	local.put(blockRel(1), blockData(1, testBlock))
	l.Published(blockRel(1), testBlock64)
	eventually(t, "written", func() bool { return l.Stats().WrittenBlocks == 1 })
	p := filepath.Join(root, blockRel(1))
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte{0xff}, 100)
	f.Close()
	other, otherLocal, _ := newTestLevel(t, NewOSDir(root), root, func(c *Config) { c.Holder = "node-b" })
	if _, err := other.Fetch(blockRel(1)); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("corrupt fetch: %v, want ENOENT", err)
	}
	if _, ok := otherLocal.get(blockRel(1)); ok {
		t.Fatal("corrupt bytes imported")
	}
	if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("corrupt block left in the shared store")
	}
	if s := other.Stats(); s.CorruptDropped != 1 {
		t.Fatalf("corrupt_dropped %d", s.CorruptDropped)
	}
	if other.Lookup(blockRel(1)) {
		t.Fatal("a dropped block answers present")
	}
	// No record at all: refused, not removed.
	plain := blockRel(9)
	os.MkdirAll(filepath.Dir(filepath.Join(root, plain)), 0o700)
	os.WriteFile(filepath.Join(root, plain), blockData(9, testBlock), 0o600)
	if _, err := other.Fetch(plain); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("unproven fetch: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, plain)); err != nil {
		t.Fatal("a block without a record was removed")
	}
	// Gone from the shared store: a miss, not an error.
	if _, err := other.Fetch(blockRel(7)); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("absent fetch: %v", err)
	}
}

// TestNegativeCacheExpiry: an absent answer is trusted for NegativeTTL, then
// the shared store is asked again.
func TestNegativeCacheExpiry(t *testing.T) {
	root := t.TempDir()
	l, _, clock := newTestLevel(t, NewOSDir(root), root, func(c *Config) { c.NegativeTTL = 2 * time.Second })
	rel := blockRel(1)
	if l.Lookup(rel) {
		t.Fatal("present before written")
	}
	putBlock(t, root, testKey, rel, blockData(1, testBlock))
	clock.Advance(time.Second)
	if l.Lookup(rel) {
		t.Fatal("negative answer not cached")
	}
	if s := l.Stats(); s.NegativeHits != 1 {
		t.Fatalf("negative_hits %d", s.NegativeHits)
	}
	clock.Advance(time.Second)
	if !l.Lookup(rel) {
		t.Fatal("negative answer outlived its TTL")
	}
	// Directories of the layout are looked up too.
	if !l.Lookup(filepath.Dir(rel)) || l.Lookup("model/zzz") {
		t.Fatal("directory lookups")
	}
}

// TestUnreachable: a shared directory that hangs makes calls time out, marks
// the level unreachable, lookups answer absent without asking it, and the
// queue drains once it answers again.
func TestUnreachable(t *testing.T) {
	root := t.TempDir()
	hang := newHangingDir(NewOSDir(root))
	l, local, _ := newTestLevel(t, hang, root, func(c *Config) { c.Timeout = 50 * time.Millisecond; c.Workers = 2 })
	hang.hang()
	if l.Lookup(blockRel(1)) {
		t.Fatal("present from a hung directory")
	}
	if s := l.Stats(); s.Reachable || s.Timeouts == 0 {
		t.Fatalf("after a timeout: reachable %v, timeouts %d", s.Reachable, s.Timeouts)
	}
	timeouts := l.Stats().Timeouts
	for range 100 {
		if l.Lookup(blockRel(2)) {
			t.Fatal("present while unreachable")
		}
	}
	if s := l.Stats(); s.Timeouts > timeouts+2 {
		t.Fatalf("lookups kept calling the hung directory: %d timeouts", s.Timeouts)
	}
	for i := range 3 {
		local.put(blockRel(i), blockData(i, testBlock))
		l.Published(blockRel(i), testBlock64)
	}
	if _, err := l.Fetch(blockRel(1)); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("fetch while unreachable: %v", err)
	}
	hang.resume()
	eventually(t, "reachable again and drained", func() bool {
		s := l.Stats()
		return s.Reachable && s.WrittenBlocks == 3 && s.QueueBlocks == 0
	})
	if !l.Lookup(blockRel(2)) {
		t.Fatal("written block not found after recovery")
	}
}

// TestDisconnectedKeepsQueue: a filesystem answering ENOTCONN (servers gone)
// marks the level unreachable and keeps the blocks queued, not dropped; they
// are written once it answers again.
func TestDisconnectedKeepsQueue(t *testing.T) {
	root := t.TempDir()
	dir := &downDir{Dir: NewOSDir(root)}
	l, local, _ := newTestLevel(t, dir, root, func(c *Config) { c.Timeout = 50 * time.Millisecond })
	dir.down.Store(true)
	for i := range 2 {
		local.put(blockRel(i), blockData(i, testBlock))
		l.Published(blockRel(i), testBlock64)
	}
	eventually(t, "unreachable", func() bool { return !l.Stats().Reachable })
	if l.Lookup(blockRel(0)) {
		t.Fatal("present while disconnected")
	}
	if s := l.Stats(); s.WrittenBlocks != 0 || s.DroppedBlocks != 0 || s.BytesBehind != 2*testBlock64 {
		t.Fatalf("while disconnected: %+v", s)
	}
	dir.down.Store(false)
	eventually(t, "drained after reconnect", func() bool {
		s := l.Stats()
		return s.Reachable && s.WrittenBlocks == 2 && s.BytesBehind == 0
	})
}

// TestStartsWhileUnreachable: a shared directory that hangs at start does
// not keep the level from starting; it joins once the directory answers.
func TestStartsWhileUnreachable(t *testing.T) {
	root := t.TempDir()
	hang := newHangingDir(NewOSDir(root))
	hang.hang()
	l, local, _ := newTestLevel(t, hang, root, func(c *Config) { c.Timeout = 50 * time.Millisecond })
	if l.Reachable() {
		t.Fatal("reachable while the directory hangs")
	}
	local.put(blockRel(1), blockData(1, testBlock))
	l.Published(blockRel(1), testBlock64)
	hang.resume()
	eventually(t, "joined and drained", func() bool { s := l.Stats(); return s.Reachable && s.WrittenBlocks == 1 && s.BytesBehind == 0 })
	if _, err := New(Config{Dir: filepath.Join(root, "missing"), Local: local, Key: testKey}); err == nil {
		t.Fatal("a missing shared directory accepted")
	}
}

// vanishingDir removes a block as it is read, as another node's evictor may.
type vanishingDir struct{ Dir }

func (d vanishingDir) ReadBlock(rel string, size int64, chunk func([]byte)) ([]byte, error) {
	d.Dir.Remove(rel)
	return d.Dir.ReadBlock(rel, size, chunk)
}

// TestRemovedMidReadIsAMiss: a block removed while it is fetched is a miss
// (ENOENT), not corruption, and answers absent afterwards.
func TestRemovedMidReadIsAMiss(t *testing.T) {
	root := t.TempDir()
	writer, local, _ := newTestLevel(t, NewOSDir(root), root, nil)
	local.put(blockRel(1), blockData(1, testBlock))
	writer.Published(blockRel(1), testBlock64)
	eventually(t, "written", func() bool { return writer.Stats().WrittenBlocks == 1 })
	reader, readerLocal, _ := newTestLevel(t, vanishingDir{NewOSDir(root)}, root, func(c *Config) { c.Holder = "node-b" })
	if !reader.Lookup(blockRel(1)) {
		t.Fatal("not found before the read")
	}
	_, err := reader.Fetch(blockRel(1))
	if !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("fetch of a block removed mid-read: %v, want ENOENT", err)
	}
	if _, ok := readerLocal.get(blockRel(1)); ok || reader.Stats().CorruptDropped != 0 || reader.Lookup(blockRel(1)) {
		t.Fatal("a block removed mid-read was imported, counted corrupt or still answers present")
	}
}

// slowDir delivers a block's chunks with a pause after each, as a slow but
// answering store does; with stall set it never delivers past the first
// chunk until released.
type slowDir struct {
	Dir
	pause   time.Duration
	stall   bool
	release chan struct{}
}

func (d slowDir) ReadBlock(rel string, size int64, chunk func([]byte)) ([]byte, error) {
	first := true
	return d.Dir.ReadBlock(rel, size, func(p []byte) {
		if d.stall && !first {
			<-d.release
		}
		first = false
		chunk(p)
		time.Sleep(d.pause)
	})
}

// TestFetchBoundIsProgress: a fetch whose chunks keep arriving runs past
// --shared-timeout in all and succeeds; one that stalls for the bound fails
// as a miss and counts a timeout.
func TestFetchBoundIsProgress(t *testing.T) {
	root := tempDirOutlivingAbandonedCalls(t)
	size := 5*fetchChunk + block.PageSize
	// The writer's calls get time to spare: under qemu-user writing 20 MiB
	// behind takes longer than the helpers' 200 ms bound.
	writer, local, _ := newTestLevel(t, NewOSDir(root), root, func(c *Config) { c.Timeout = 30 * time.Second })
	for i := range 2 {
		local.put(blockRel(i), blockData(i, size))
		writer.Published(blockRel(i), int64(size))
	}
	eventually(t, "written", func() bool { return writer.Stats().WrittenBlocks == 2 })

	// Each chunk (6 in all) comes a fifth of the bound after the last, so
	// the fetch outlasts one bound while a chunk's own read, on a machine
	// busy with other work, has four fifths of it to spare (at 1 s and two
	// fifths, a busy CI machine took more than the 0.6 s left).
	const timeout = 3 * time.Second
	slow := slowDir{Dir: NewOSDir(root), pause: timeout / 5}
	reader, readerLocal, _ := newTestLevel(t, slow, root, func(c *Config) { c.Holder = "node-b"; c.Timeout = timeout })
	start := time.Now()
	if _, err := reader.Fetch(blockRel(0)); err != nil {
		t.Fatalf("a slow but progressing fetch failed: %v", err)
	}
	if got, _ := readerLocal.get(blockRel(0)); !bytes.Equal(got, blockData(0, size)) {
		t.Fatal("the slow fetch imported other bytes")
	}
	if time.Since(start) < timeout {
		t.Fatal("the slow fetch did not outlast one bound: the test proves nothing")
	}

	stalled := slowDir{Dir: NewOSDir(root), stall: true, release: make(chan struct{})}
	defer close(stalled.release)
	stuck, stuckLocal, _ := newTestLevel(t, stalled, root, func(c *Config) { c.Holder = "node-c"; c.Timeout = timeout })
	if _, err := stuck.Fetch(blockRel(1)); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("a stalled fetch: %v, want a miss", err)
	}
	if _, ok := stuckLocal.get(blockRel(1)); ok || stuck.Stats().Timeouts == 0 {
		t.Fatal("a stalled fetch was imported or counted no timeout")
	}
}

// tempDirOutlivingAbandonedCalls is a t.TempDir for a test whose levels
// abandon calls at their bound: Close does not wait for such a call (it may
// never return), so one that returns after the test may still write or
// remove a file while the directory is removed. Its removal is retried
// until it holds, for up to 10 s.
func tempDirOutlivingAbandonedCalls(t *testing.T) string {
	root, err := os.MkdirTemp("", "kvtierfs-shared-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for range 1000 {
			if err = os.RemoveAll(root); err == nil {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Errorf("removing %s: %v", root, err)
	})
	return root
}
