package shared

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/tiers/block"
	"github.com/kvtierfs/kvtierfs/tiers/internal/beneath"
)

// The shared directory is written by others (DESIGN.md "Threat model"):
// these tests put real sparse files, FIFOs, links and forged records there.

// sparseTiB makes rel a sparse file of a tebibyte.
func sparseTiB(t *testing.T, root, rel string) {
	t.Helper()
	p := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(p, 1<<40); err != nil {
		t.Fatal(err)
	}
}

// fifo makes rel a FIFO, replacing what is there.
func fifo(t *testing.T, root, rel string) {
	t.Helper()
	p := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		t.Fatal(err)
	}
	os.Remove(p)
	if err := unix.Mkfifo(p, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestSparseFilesRefused: a sparse tebibyte as the lease, as a block (the
// journal claiming 262,144 bytes for it, or its genuine record another
// size), as a sidecar and as a log is refused without reading it: the level
// takes the lease over, fetches fail as misses, lookups go on.
func TestSparseFilesRefused(t *testing.T) {
	t.Run("lease", func(t *testing.T) {
		root := t.TempDir()
		sparseTiB(t, root, leaseFile)
		l, _, _ := newTestLevel(t, NewOSDir(root), root, func(c *Config) { c.Capacity = 1 << 50 })
		eventually(t, "the lease taken over from a sparse tebibyte", l.holding)
	})
	t.Run("block", func(t *testing.T) {
		root := t.TempDir()
		writer, local, _ := newTestLevel(t, NewOSDir(root), root, nil)
		writtenBehind(t, writer, local, 1)
		// The genuine block's file grown to a tebibyte, its record kept.
		if err := os.Truncate(filepath.Join(root, blockRel(1)), 1<<40); err != nil {
			t.Fatal(err)
		}
		// A block no record covers, which a log line says is 262,144 bytes.
		sparseTiB(t, root, blockRel(2))
		writeLog(t, root, keyHolder(testKey, "other"), journalRecord{true, 262144, blockRel(2)})
		reader, readerLocal, _ := newTestLevel(t, NewOSDir(root), root, func(c *Config) { c.Holder = "node-b" })
		for _, i := range []int{1, 2} {
			if !reader.Lookup(blockRel(i)) {
				t.Fatalf("block %d: the journal's name answered absent", i)
			}
			if _, err := reader.Fetch(blockRel(i)); !errors.Is(err, syscall.ENOENT) {
				t.Fatalf("fetching sparse block %d: %v, want a miss", i, err)
			}
			if _, ok := readerLocal.get(blockRel(i)); ok {
				t.Fatalf("sparse block %d imported", i)
			}
		}
		if st := reader.Stats(); st.CorruptDropped != 1 || !st.Reachable {
			t.Fatalf("after the sparse blocks: %+v; want the grown genuine block dropped", st)
		}
	})
	t.Run("sidecar", func(t *testing.T) {
		root := t.TempDir()
		writer, local, _ := newTestLevel(t, noXattrs{NewOSDir(root)}, root, nil)
		writtenBehind(t, writer, local, 3)
		sparseTiB(t, root, blockRel(3)+sidecarSuffix)
		reader, _, _ := newTestLevel(t, noXattrs{NewOSDir(root)}, root, func(c *Config) { c.Holder = "node-b" })
		if _, err := reader.Fetch(blockRel(3)); !errors.Is(err, syscall.ENOENT) {
			t.Fatalf("fetch with a sparse sidecar: %v, want a miss", err)
		}
	})
	t.Run("log", func(t *testing.T) {
		root := t.TempDir()
		writer, local, _ := newTestLevel(t, NewOSDir(root), root, nil)
		writtenBehind(t, writer, local, 4)
		big := keyHolder(testKey, "big")
		sparseTiB(t, root, big.ownLog())
		reader, _, _ := newTestLevel(t, NewOSDir(root), root, func(c *Config) { c.Holder = "node-b" })
		if !reader.Lookup(blockRel(4)) || reader.Lookup(blockRel(5)) {
			t.Fatal("lookups wrong beside a sparse log")
		}
		if st := reader.Stats(); st.JournalFallbacks != 0 || st.JournalNames != 1 {
			t.Fatalf("a sparse log turned the journal off or added names: %+v", st)
		}
	})
}

// linkModes runs fn with the component walk forced (no openat2) and without.
func linkModes(t *testing.T, fn func(t *testing.T, dir func(root string) Dir)) {
	for _, walk := range []bool{false, true} {
		t.Run(fmt.Sprintf("walk=%v", walk), func(t *testing.T) {
			if walk {
				t.Cleanup(beneath.WithoutOpenat2())
			}
			fn(t, func(root string) Dir { return NewOSDir(root) })
		})
	}
}

// filesUnder lists every name below dir.
func filesUnder(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if p != dir {
			out = append(out, p)
		}
		return nil
	})
	return out
}

// TestLinksNeverFollowed: the tier, a directory below it, a block file and
// .kvtierfs made links to places outside the shared directory: nothing is
// written there (write-behind skips the block, the lease and journal go to
// a real .kvtierfs that replaces the link) and nothing is read from there
// (a genuine block outside, named by a genuine journal line, is a miss),
// with openat2 and with the walk that replaces it.
func TestLinksNeverFollowed(t *testing.T) {
	linkModes(t, func(t *testing.T, dir func(string) Dir) {
		root, outside, outsideCtl := t.TempDir(), t.TempDir(), t.TempDir()
		// Outside: genuine blocks, sealed with the replicas' key.
		hashDirs := strings.TrimPrefix(filepath.Dir(blockRel(1)), "model/")
		for i := range 3 {
			rel := blockRel(i)
			putBlock(t, outside, testKey, strings.TrimPrefix(rel, "model/"), blockData(i, testBlock))
		}
		if err := os.Symlink(outside, filepath.Join(root, "model")); err != nil {
			t.Fatal(err)
		}
		// A second tier whose <h[0:3]> directory is a link, a third whose block file is.
		deep := "deep/" + strings.TrimPrefix(blockRel(1), "model/")
		os.MkdirAll(filepath.Join(root, "deep"), 0o700)
		if err := os.Symlink(filepath.Join(outside, filepath.Dir(hashDirs)), filepath.Join(root, "deep", filepath.Dir(hashDirs))); err != nil {
			t.Fatal(err)
		}
		file := "file/" + strings.TrimPrefix(blockRel(2), "model/")
		os.MkdirAll(filepath.Dir(filepath.Join(root, file)), 0o700)
		if err := os.Symlink(filepath.Join(outside, strings.TrimPrefix(blockRel(2), "model/")), filepath.Join(root, file)); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(outsideCtl, filepath.Join(root, controlDir)); err != nil {
			t.Fatal(err)
		}
		writeLogs := keyHolder(testKey, "other")
		before := filesUnder(t, outside)

		l, local, _ := newTestLevel(t, dir(root), root, func(c *Config) { c.Capacity = 1 << 50 })
		eventually(t, "the lease held", l.holding)
		if info, err := os.Lstat(filepath.Join(root, controlDir)); err != nil || !info.IsDir() {
			t.Fatalf(".kvtierfs is still a link: %v", err)
		}
		if _, err := os.Stat(filepath.Join(root, leaseFile)); err != nil {
			t.Fatalf("no lease in the real .kvtierfs: %v", err)
		}
		if got := filesUnder(t, outsideCtl); len(got) != 0 {
			t.Fatalf("the daemon wrote through .kvtierfs's link: %v", got)
		}
		// Write-behind into the linked tier: skipped, nothing outside.
		local.put(blockRel(7), blockData(7, testBlock))
		l.Published(blockRel(7), testBlock64)
		eventually(t, "the write-behind tried", func() bool { s := l.Stats(); return s.QueueBlocks == 0 && s.BytesBehind == 0 })
		if got := filesUnder(t, outside); len(got) != len(before) || l.Stats().WrittenBlocks != 0 {
			t.Fatalf("the write-behind went through the tier's link: %d written, outside now %v", l.Stats().WrittenBlocks, got)
		}
		// Genuine journal lines name the blocks outside, through each link.
		writeLog(t, root, writeLogs, journalRecord{true, testBlock64, blockRel(0)}, journalRecord{true, testBlock64, deep}, journalRecord{true, testBlock64, file})
		reader, readerLocal, _ := newTestLevel(t, dir(root), root, func(c *Config) { c.Holder = "node-b" })
		for _, rel := range []string{blockRel(0), deep, file} {
			if _, err := reader.Fetch(rel); !errors.Is(err, syscall.ENOENT) {
				t.Fatalf("fetch of %s through a link: %v, want a miss", rel, err)
			}
			if _, ok := readerLocal.get(rel); ok {
				t.Fatalf("%s imported through a link", rel)
			}
		}
		// With no journal (a reader that fell back to the listings), the links are absent too.
		os.RemoveAll(filepath.Join(root, namesDir))
		lister, _, _ := newTestLevel(t, dir(root), root, func(c *Config) { c.Holder = "node-c" })
		for _, rel := range []string{blockRel(0), deep, file} {
			if lister.Lookup(rel) {
				t.Fatalf("%s answered present through a link", rel)
			}
		}
		if got := filesUnder(t, outside); len(got) != len(before) {
			t.Fatalf("files outside changed: %v", got)
		}
	})
}

// TestFIFOsNeverBlock: a FIFO as the lease, as a block, a sidecar and a log
// never blocks a worker: the lease is taken over, fetches are misses, the
// level stays reachable with no call timed out.
func TestFIFOsNeverBlock(t *testing.T) {
	root := t.TempDir()
	fifo(t, root, leaseFile)
	fifo(t, root, blockRel(1))
	fifo(t, root, blockRel(2))
	fifo(t, root, blockRel(2)+sidecarSuffix)
	other := keyHolder(testKey, "other")
	writeLog(t, root, other, journalRecord{true, testBlock64, blockRel(1)}, journalRecord{true, testBlock64, blockRel(2)})
	fifo(t, root, keyHolder(testKey, "piped").ownLog())
	l, _, _ := newTestLevel(t, NewOSDir(root), root, func(c *Config) { c.Capacity = 1 << 50 })
	eventually(t, "the lease taken over from a FIFO", l.holding)
	sidecars, _, _ := newTestLevel(t, noXattrs{NewOSDir(root)}, root, func(c *Config) { c.Holder = "node-b" })
	for _, lv := range []*Level{l, sidecars} {
		for _, i := range []int{1, 2} {
			if !lv.Lookup(blockRel(i)) {
				t.Fatalf("block %d: the journal's name answered absent", i)
			}
			if _, err := lv.Fetch(blockRel(i)); !errors.Is(err, syscall.ENOENT) {
				t.Fatalf("fetch of a FIFO: %v, want a miss", err)
			}
		}
		if st := lv.Stats(); st.Timeouts != 0 || !st.Reachable || st.JournalFallbacks != 0 {
			t.Fatalf("after FIFOs: %+v", st)
		}
	}
}

// stuckDir blocks the lease's reads until released.
type stuckDir struct {
	Dir
	release chan struct{}
}

func (d stuckDir) ReadFile(rel string, limit int64) ([]byte, error) {
	if rel == leaseFile {
		<-d.release
	}
	return d.Dir.ReadFile(rel, limit)
}

// TestStuckCallUnreachable: a call stuck past its bound keeps the level
// unreachable even though the prober finds the directory answering: lookups
// answer absent without waiting for a worker, until the call returns.
func TestStuckCallUnreachable(t *testing.T) {
	root := t.TempDir()
	dir := stuckDir{Dir: NewOSDir(root), release: make(chan struct{})}
	l, _, _ := newTestLevel(t, dir, root, func(c *Config) { c.Capacity = 1 << 50; c.Timeout = 50 * time.Millisecond })
	eventually(t, "the lease's read timed out and the prober succeeded", func() bool {
		return l.Stats().Timeouts > 0 && !l.bound.unreachable.Load()
	})
	if l.Reachable() || l.Stats().Reachable {
		close(dir.release)
		t.Fatal("reachable while a worker is stuck in the lease's read")
	}
	timeouts := l.Stats().Timeouts
	for i := range 100 {
		if l.Lookup(blockRel(i)) {
			t.Fatal("present while unreachable")
		}
	}
	if got := l.Stats().Timeouts; got != timeouts {
		t.Fatalf("lookups waited on the stuck workers: %d more timeouts", got-timeouts)
	}
	close(dir.release)
	eventually(t, "reachable once the stuck call returned", l.Reachable)
}

// TestForgeriesRefused: without the key, a writer to the shared directory
// makes no replica serve its bytes (blocks with no record, the store's
// unsealed record, a record sealed with another key, a genuine block copied
// to another tier), answer present (forged journal lines and log names,
// genuine lines appended again), hide a real block (forged removals), turn
// the journal off (1,025 empty logs) or stall eviction (a lease far in the
// future, forged or signed).
func TestForgeriesRefused(t *testing.T) {
	t.Run("blocks", func(t *testing.T) {
		root := t.TempDir()
		putBlock(t, root, nil, blockRel(0), blockData(0, testBlock))
		putBlock(t, root, nil, blockRel(1), blockData(1, testBlock))
		_, name := block.Parse(blockRel(1))
		rec, err := block.DigestOf(blockData(1, testBlock)).MarshalRecord(name.Binding())
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.Setxattr(filepath.Join(root, blockRel(1)), block.RecordXattr, rec, 0); err != nil {
			t.Fatal(err)
		}
		putBlock(t, root, []byte("a key the replicas do not hold"), blockRel(2), blockData(2, testBlock))
		// A genuine block of tier model_r1 copied, record and all, into model_r0.
		writer, local, _ := newTestLevel(t, NewOSDir(root), root, nil)
		r1 := strings.Replace(blockRel(3), "model/", "model_r1/", 1)
		r0 := strings.Replace(blockRel(3), "model/", "model_r0/", 1)
		local.put(r1, blockData(3, testBlock))
		writer.Published(r1, testBlock64)
		eventually(t, "written", func() bool { return writer.Stats().WrittenBlocks == 1 })
		putBlock(t, root, nil, r0, blockData(3, testBlock))
		setSealed(t, root, r0, mustXattr(t, root, r1))
		os.RemoveAll(filepath.Join(root, namesDir)) // the listings answer
		reader, readerLocal, _ := newTestLevel(t, NewOSDir(root), root, func(c *Config) { c.Holder = "node-b" })
		for _, rel := range []string{blockRel(0), blockRel(1), blockRel(2), r0} {
			if reader.Lookup(rel) {
				t.Fatalf("%s answered present", rel)
			}
			if _, err := reader.Fetch(rel); !errors.Is(err, syscall.ENOENT) {
				t.Fatalf("fetch of forged %s: %v, want a miss", rel, err)
			}
			if _, ok := readerLocal.get(rel); ok {
				t.Fatalf("forged %s imported", rel)
			}
			if _, err := os.Stat(filepath.Join(root, rel)); err != nil {
				t.Fatalf("forged %s removed: a replica holding another key would remove ours", rel)
			}
		}
		if !reader.Lookup(r1) {
			t.Fatal("the genuine block answered absent")
		}
	})
	t.Run("journal", func(t *testing.T) {
		root := t.TempDir()
		a, aLocal, _ := newTestLevel(t, NewOSDir(root), root, nil)
		writtenBehind(t, a, aLocal, 0)
		// A genuine log that added and then removed block 5.
		other := keyHolder(testKey, "other")
		writeLog(t, root, other, journalRecord{true, testBlock64, blockRel(5)})
		added, _ := os.ReadFile(filepath.Join(root, other.ownLog()))
		writeLog(t, root, other, journalRecord{false, 0, blockRel(5)})
		// Forged lines in a log named like one, in the genuine logs, the
		// genuine addition appended again, and 1,025 empty logs.
		forged := fmt.Sprintf("+ 9 %d %s %x\n- 9 %s %x\n", testBlock, blockRel(6), make([]byte, tagSize), blockRel(0), make([]byte, tagSize))
		os.WriteFile(filepath.Join(root, namesDir, "node-x-0123456789abcdef0123456789abcdef.log"), []byte(forged), 0o600)
		appendLog(t, root, other, []byte(forged))
		appendLog(t, root, a, []byte(forged))
		appendLog(t, root, other, added)
		for i := range maxLogs + 1 {
			os.WriteFile(filepath.Join(root, namesDir, fmt.Sprintf("empty-%d.log", i)), nil, 0o600)
		}
		b, _, _ := newTestLevel(t, NewOSDir(root), root, func(c *Config) { c.Holder = "node-b" })
		if b.Lookup(blockRel(6)) || b.Lookup(blockRel(5)) {
			t.Fatal("a forged or replayed line answered present")
		}
		if !b.Lookup(blockRel(0)) {
			t.Fatal("a forged removal hid a real block")
		}
		if st := b.Stats(); st.JournalFallbacks != 0 || st.JournalNames != 1 {
			t.Fatalf("the journal after forgeries: %+v", st)
		}
	})
	t.Run("lease", func(t *testing.T) {
		for name, content := range map[string][]byte{
			"forged": []byte("node-x 9000000000000000000\n"),
			"signed": keyHolder(testKey, "node-x").leaseContent(newFakeClock().Now().Add(time.Hour)),
		} {
			t.Run(name, func(t *testing.T) {
				root := t.TempDir()
				os.MkdirAll(filepath.Join(root, controlDir), 0o700)
				if err := os.WriteFile(filepath.Join(root, leaseFile), content, 0o600); err != nil {
					t.Fatal(err)
				}
				l, _, _ := newTestLevel(t, NewOSDir(root), root, func(c *Config) { c.Capacity = 1 << 50 })
				eventually(t, "the far-future lease taken over", l.holding)
				got, _ := os.ReadFile(filepath.Join(root, leaseFile))
				if !bytes.HasPrefix(got, []byte("node-a ")) {
					t.Fatalf("lease file %q", got)
				}
			})
		}
	})
}

// TestKeyRequired: a level without a key of at least MinKeyBytes does not start.
func TestKeyRequired(t *testing.T) {
	root := t.TempDir()
	for _, key := range [][]byte{nil, make([]byte, MinKeyBytes-1)} {
		if l, err := New(Config{Dir: root, Local: newFakeLocal(), Key: key}); err == nil {
			l.Close()
			t.Fatalf("a level started with a key of %d bytes", len(key))
		}
	}
}

// TestPlantedNamesAndTimes: names a writer could plant ahead of a node (the
// node's lease move-aside and probe under fixed names, as non-empty
// directories) hold up neither the lease's takeover nor the prober's
// recovery, and a block whose modification time was set a year ahead is
// evicted first instead of never.
func TestPlantedNamesAndTimes(t *testing.T) {
	root := t.TempDir()
	clock := newFakeClock()
	for _, name := range []string{leaseFile + ".expired-node-a", controlDir + "/probe-node-a"} {
		if err := os.MkdirAll(filepath.Join(root, name, "planted"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	expired := keyHolder(testKey, "node-x").leaseContent(clock.Now().Add(-time.Second))
	if err := os.WriteFile(filepath.Join(root, leaseFile), expired, 0o600); err != nil {
		t.Fatal(err)
	}
	var size int64
	for i, at := range []time.Time{clock.Now().Add(-time.Hour), clock.Now().AddDate(1, 0, 0), clock.Now().Add(-50 * time.Minute)} {
		putBlock(t, root, testKey, blockRel(i), blockData(i, testBlock))
		if err := os.Chtimes(filepath.Join(root, blockRel(i)), at, at); err != nil {
			t.Fatal(err)
		}
		info, _ := NewOSDir(root).Stat(blockRel(i))
		size = info.Allocated
	}
	hang := newHangingDir(NewOSDir(root))
	l, _, _ := newTestLevel(t, hang, root, func(c *Config) {
		c.Clock, c.Capacity, c.Protect, c.Timeout = clock, 2*size, time.Minute, time.Second
	})
	eventually(t, "the expired lease taken over", l.holding)
	eventually(t, "one block evicted", func() bool { return l.Stats().EvictedBlocks == 1 })
	if _, err := os.Stat(filepath.Join(root, blockRel(1))); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("the block dated a year ahead was spared")
	}
	if _, err := os.Stat(filepath.Join(root, blockRel(0))); err != nil {
		t.Fatal("the oldest genuine block was evicted instead of the one dated ahead")
	}
	hang.hang()
	if l.Lookup(blockRel(5)) || l.Reachable() {
		t.Fatal("reachable while the directory hangs")
	}
	hang.resume()
	eventually(t, "the prober's recovery", l.Reachable)
}

// TestOwnLogReplaced: a node's own log replaced by a FIFO, then by a link,
// is made again at its next record, which other nodes read.
func TestOwnLogReplaced(t *testing.T) {
	root := t.TempDir()
	a, local, _ := newTestLevel(t, NewOSDir(root), root, nil)
	writtenBehind(t, a, local, 0)
	own := filepath.Join(root, a.ownLog())
	replaceWith := []func(){
		1: func() { fifo(t, root, a.ownLog()) },
		2: func() {
			os.Remove(own)
			if err := os.Symlink(t.TempDir(), own); err != nil {
				t.Fatal(err)
			}
		},
	}
	for _, i := range []int{1, 2} {
		replaceWith[i]()
		writtenBehind(t, a, local, i)
		b, _, _ := newTestLevel(t, NewOSDir(root), root, func(c *Config) { c.Holder = fmt.Sprintf("node-b%d", i) })
		if !b.Lookup(blockRel(i)) {
			t.Fatalf("block %d, recorded after the log was replaced, answered absent", i)
		}
		if st := b.Stats(); st.JournalFallbacks != 0 {
			t.Fatalf("the journal fell back: %+v", st)
		}
	}
}

// TestRootSwappedWhileLive: the shared directory's path made to name another
// directory while its filesystem answers (a writer to its parent) changes
// nothing: the level goes on in the directory it opened.
func TestRootSwappedWhileLive(t *testing.T) {
	parent := t.TempDir()
	root := filepath.Join(parent, "shared")
	if err := os.Mkdir(root, 0o700); err != nil {
		t.Fatal(err)
	}
	l, local, _ := newTestLevel(t, NewOSDir(root), root, nil)
	writtenBehind(t, l, local, 0)
	if err := os.Rename(root, root+".opened"); err != nil {
		t.Fatal(err)
	}
	swapped := t.TempDir()
	if err := os.Symlink(swapped, root); err != nil {
		t.Fatal(err)
	}
	time.Sleep(rootCheckEvery) // the descriptor is checked again
	writtenBehind(t, l, local, 1)
	if _, err := os.Stat(filepath.Join(root+".opened", blockRel(1))); err != nil {
		t.Fatalf("the block written after the swap is not in the directory opened: %v", err)
	}
	if got := filesUnder(t, swapped); len(got) != 0 {
		t.Fatalf("the level wrote into the directory swapped in: %v", got)
	}
}
