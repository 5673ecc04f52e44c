package core

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/tiers/disk"
)

// newMemoryFixture is a fixture whose store lies on a tmpfs of its own,
// unmounted after the test, where loads serve the store's pages in place.
func newMemoryFixture(t *testing.T) *fixture {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("kvtier-test", dir, "tmpfs", 0, "size=256m"); err != nil {
		t.Fatalf("mounting a tmpfs for the store: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmounting the store's tmpfs: %v", err)
		}
	})
	return newFixtureIn(t, dir)
}

// putCheckedAtLoad stores block i, then reads its file as anyone may: the
// read's open breaks the write lease of its store, so its first load maps
// and checks it. It returns once the store closed the descriptor it wrote
// the block through (waitLeasable).
func (f *fixture) putCheckedAtLoad(t *testing.T, i int) (string, []byte) {
	t.Helper()
	rel, data := f.put(t, i)
	if _, err := os.ReadFile(f.store.Path(rel)); err != nil {
		t.Fatal(err)
	}
	f.waitLeasable(t, rel)
	return rel, data
}

// waitLeasable waits until no one holds rel's store file open for writing
// (a read lease is granted): the store closes the descriptor it wrote a
// block through soon after another open broke its write lease, and a load
// maps the file only under a read lease.
func (f *fixture) waitLeasable(t *testing.T, rel string) {
	t.Helper()
	p := f.store.Path(rel)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		r, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		_, err = unix.FcntlInt(r.Fd(), unix.F_SETLEASE, unix.F_RDLCK)
		r.Close()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s is still open for writing: %v", p, err)
		}
	}
}

// loadWhole opens block rel, reads it as the engine does, closes it and
// checks that it got want.
func loadWhole(t *testing.T, loads *Loads, rel string, want []byte) {
	t.Helper()
	l, err := loads.Open(context.Background(), refOf(rel))
	if err != nil {
		t.Fatal(err)
	}
	row := make([]byte, rowBytes)
	err = engineRead(context.Background(), l, row, 1<<20)
	if err == nil {
		err = l.Flush()
	}
	l.Release()
	if err != nil || !bytes.Equal(row, want) {
		t.Fatalf("load of %s: %v, bytes equal %v", rel, err, bytes.Equal(row, want))
	}
}

// TestLoadFromAStoreInMemoryIsServedInPlace loads a block of a tmpfs store
// twice: both are served from the mapped file, not a copy, and the second
// finds the mapping the first proved, with the block's bytes each time.
func TestLoadFromAStoreInMemoryIsServedInPlace(t *testing.T) {
	f := newMemoryFixture(t)
	rel, data := f.putCheckedAtLoad(t, 1)
	loads := NewLoads(Config{Store: f.store})
	loadWhole(t, loads, rel, data)
	loadWhole(t, loads, rel, data)
	c := &loads.Counters
	if c.InPlace.Load() != 2 || c.Remapped.Load() != 1 || c.FromStore.Load() != 2 || c.Completed.Load() != 2 {
		t.Fatalf("in place %d, remapped %d, from the store %d, completed %d; want 2, 1, 2, 2", c.InPlace.Load(), c.Remapped.Load(), c.FromStore.Load(), c.Completed.Load())
	}
	if c.ProvenAtStore.Load() != 0 {
		t.Fatalf("%d loads proven at store, of a block whose store's lease broke; want 0", c.ProvenAtStore.Load())
	}
}

// TestBlockStoredThroughTheDaemonIsServedWithoutACheck loads a block that a
// tmpfs store wrote through the daemon twice: both loads, the first too, are
// served from the mapping kept from its store, proven by its write lease.
func TestBlockStoredThroughTheDaemonIsServedWithoutACheck(t *testing.T) {
	f := newMemoryFixture(t)
	rel, data := f.put(t, 1)
	loads := NewLoads(Config{Store: f.store})
	loadWhole(t, loads, rel, data)
	loadWhole(t, loads, rel, data)
	c := &loads.Counters
	if c.InPlace.Load() != 2 || c.Remapped.Load() != 2 || c.ProvenAtStore.Load() != 2 || c.Completed.Load() != 2 {
		t.Fatalf("in place %d, remapped %d, proven at store %d, completed %d; want 2, 2, 2, 2", c.InPlace.Load(), c.Remapped.Load(), c.ProvenAtStore.Load(), c.Completed.Load())
	}
}

// TestWriterUnderAKeptMappingFailsTheLoad opens the store file of a block
// for writing while a load serves it from the mapping an earlier load
// proved, or its store: the load's next read and its close fail with EIO,
// the writer goes on once the load is released, and the next load, which
// must check the file again, finds it changed and drops the block.
func TestWriterUnderAKeptMappingFailsTheLoad(t *testing.T) {
	for _, keptBy := range []string{"load", "store"} {
		t.Run(keptBy, func(t *testing.T) {
			f := newMemoryFixture(t)
			loads := NewLoads(Config{Store: f.store})
			var rel string
			var data []byte
			if keptBy == "load" {
				rel, data = f.putCheckedAtLoad(t, 1)
				loadWhole(t, loads, rel, data)
			} else {
				rel, data = f.put(t, 1)
			}
			l, err := loads.Open(context.Background(), refOf(rel))
			if err != nil {
				t.Fatal(err)
			}
			remapped := loads.Counters.Remapped.Load()
			if remapped != 1 || loads.Counters.ProvenAtStore.Load() != map[string]int64{"load": 0, "store": 1}[keptBy] {
				t.Fatalf("remapped %d, proven at store %d: the load did not find the block mapped by its %s", remapped, loads.Counters.ProvenAtStore.Load(), keptBy)
			}
			breakLeaseDuringLoad(t, f, l, rel, data)
			if l, err = loads.Open(context.Background(), refOf(rel)); err != nil {
				t.Fatal(err)
			}
			_, err = l.Read(context.Background(), 0, 1<<20)
			l.Release()
			if disk.Errno(err) != syscall.EIO || loads.Counters.Remapped.Load() != remapped || f.store.Lookup(rel, 0) {
				t.Fatalf("load of the changed block: %v, remapped %d, still indexed %v; want EIO, %d, false", err, loads.Counters.Remapped.Load(), f.store.Lookup(rel, 0), remapped)
			}
		})
	}
}

// breakLeaseDuringLoad opens rel's store file for writing while l serves its
// first MiB and changes it: the open waits for l's lease, l's next read and
// its close fail with EIO, and the writer goes on once l is released.
func breakLeaseDuringLoad(t *testing.T, f *fixture, l *Load, rel string, data []byte) {
	t.Helper()
	if got, err := l.Read(context.Background(), 0, 1<<20); err != nil || !bytes.Equal(got, data[:1<<20]) {
		t.Fatalf("first read: %v", err)
	}
	l.Delivered(0, 1<<20)
	opened := make(chan error, 1)
	go func() {
		w, err := os.OpenFile(f.store.Path(rel), os.O_WRONLY, 0)
		if err == nil {
			_, err = w.WriteAt([]byte("changed"), 0)
			w.Close()
		}
		opened <- err
	}()
	// The writer's open breaks the lease; reads fail from then on.
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := l.Read(context.Background(), 1<<20, 1<<20)
		if disk.Errno(err) == syscall.EIO {
			break
		}
		if err != nil || time.Now().After(deadline) {
			t.Fatalf("read while a writer waits for the file: %v, want EIO", err)
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case err := <-opened:
		t.Fatalf("the writer's open returned (%v) while the load still holds the file", err)
	default:
	}
	if err := l.Flush(); disk.Errno(err) != syscall.EIO {
		t.Fatalf("close: %v, want EIO", err)
	}
	l.Release()
	if err := <-opened; err != nil {
		t.Fatalf("the writer after the load's release: %v", err)
	}
}

// TestDamagedBlockInPlaceFailsItsChunk damages the second MiB of a block of a
// tmpfs store: the first MiB is served once proven, the read of the damaged
// one fails with EIO, and the block is dropped.
func TestDamagedBlockInPlaceFailsItsChunk(t *testing.T) {
	f := newMemoryFixture(t)
	rel, data := f.put(t, 1)
	f.corrupt(t, rel, 1<<20+4096)
	f.waitLeasable(t, rel)
	loads := NewLoads(Config{Store: f.store})
	l, err := loads.Open(context.Background(), refOf(rel))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	first, err := l.Read(context.Background(), 0, 1<<20)
	if err != nil && disk.Errno(err) != syscall.EIO || err == nil && !bytes.Equal(first, data[:1<<20]) {
		t.Fatalf("first MiB, intact: %v, bytes equal %v; want its bytes or EIO", err, bytes.Equal(first, data[:1<<20]))
	}
	if _, err := l.Read(context.Background(), 1<<20, 1<<20); disk.Errno(err) != syscall.EIO {
		t.Fatalf("damaged MiB: %v, want EIO", err)
	}
	if err := l.Flush(); disk.Errno(err) != syscall.EIO {
		t.Fatalf("close: %v, want EIO", err)
	}
	if f.store.Lookup(rel, 0) || loads.Counters.InPlace.Load() != 1 {
		t.Fatalf("still indexed %v, in place %d; want false, 1", f.store.Lookup(rel, 0), loads.Counters.InPlace.Load())
	}
}

// TestWriterOfABlockServedInPlaceFailsTheLoad opens the store file of a block
// being served in place for the first time for writing, as the engine's uid
// may: the open waits for the load's lease, the load's next read and its
// close fail with EIO, and the writer goes on once the load is released.
func TestWriterOfABlockServedInPlaceFailsTheLoad(t *testing.T) {
	f := newMemoryFixture(t)
	rel, data := f.put(t, 1)
	loads := NewLoads(Config{Store: f.store})
	l, err := loads.Open(context.Background(), refOf(rel))
	if err != nil {
		t.Fatal(err)
	}
	breakLeaseDuringLoad(t, f, l, rel, data)
	if loads.Counters.Completed.Load() != 0 {
		t.Fatal("a load whose file was opened for writing counts as completed")
	}
}

// TestBlockOpenForWritingIsCopied loads a block of a tmpfs store whose file
// someone holds open for writing: no lease is granted, so the load copies
// and checks the block instead of serving it in place.
func TestBlockOpenForWritingIsCopied(t *testing.T) {
	f := newMemoryFixture(t)
	rel, data := f.put(t, 1)
	w, err := os.OpenFile(f.store.Path(rel), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	loads := NewLoads(Config{Store: f.store})
	l, err := loads.Open(context.Background(), refOf(rel))
	if err != nil {
		t.Fatal(err)
	}
	row := make([]byte, rowBytes)
	err = engineRead(context.Background(), l, row, 1<<20)
	l.Release()
	if err != nil || !bytes.Equal(row, data) || loads.Counters.InPlace.Load() != 0 {
		t.Fatalf("load of a file open for writing: %v, bytes equal %v, in place %d; want nil, true, 0", err, bytes.Equal(row, data), loads.Counters.InPlace.Load())
	}
}

// TestSparseBlockInMemoryIsCopied loads a block of a tmpfs store stored with
// a hole (its zero pages): the load copies it, since faulting the mapping
// would allocate the hole, and the file stays as sparse as it was stored.
func TestSparseBlockInMemoryIsCopied(t *testing.T) {
	f := newMemoryFixture(t)
	rel, data := testBlock(1)
	clear(data[1<<20 : 2<<20])
	tmp := rel + "_1.tmp"
	if err := os.MkdirAll(filepath.Dir(f.store.Path(rel)), 0o755); err != nil {
		t.Fatal(err)
	}
	w, err := f.store.CreateTmp(tmp, syscall.O_CREAT|syscall.O_EXCL|syscall.O_WRONLY)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.store.Publish(tmp, rel); err != nil {
		t.Fatal(err)
	}
	allocated := func() int64 {
		var st syscall.Stat_t
		if err := syscall.Stat(f.store.Path(rel), &st); err != nil {
			t.Fatal(err)
		}
		return st.Blocks * 512
	}
	before := allocated()
	if before >= int64(len(data)) {
		t.Fatalf("the stored block takes %d bytes of %d: no hole to keep", before, len(data))
	}
	loads := NewLoads(Config{Store: f.store})
	l, err := loads.Open(context.Background(), refOf(rel))
	if err != nil {
		t.Fatal(err)
	}
	row := make([]byte, rowBytes)
	err = engineRead(context.Background(), l, row, 1<<20)
	l.Release()
	if err != nil || !bytes.Equal(row, data) || loads.Counters.InPlace.Load() != 0 {
		t.Fatalf("load of a sparse block: %v, bytes equal %v, in place %d; want nil, true, 0", err, bytes.Equal(row, data), loads.Counters.InPlace.Load())
	}
	if after := allocated(); after != before {
		t.Fatalf("the load changed the file's allocation from %d to %d bytes", before, after)
	}
}

// TestMirroredLoadFromAStoreInMemoryIsCopied loads a block of a tmpfs store
// on a multi-node group twice: the mirror and the row's search read the
// block's bytes in the daemon, which a mapping cut short under them would
// crash, so neither serves it in place and both reach the peers.
func TestMirroredLoadFromAStoreInMemoryIsCopied(t *testing.T) {
	f := newMemoryFixture(t)
	rel, data := f.put(t, 1)
	m := f.mirror(nil)
	for i := range 2 {
		loads, l := f.open(t, Config{Mirror: m}, rel)
		if err := engineRead(context.Background(), l, f.region.Row(1), 1<<20); err != nil {
			t.Fatal(err)
		}
		err := l.Flush()
		if err != nil || !bytes.Equal(f.region.Row(1), data) || loads.Counters.InPlace.Load() != 0 || len(m.rows) != i+1 {
			t.Fatalf("mirrored load %d: %v, bytes equal %v, in place %d, rows mirrored %d; want nil, true, 0, %d",
				i, err, bytes.Equal(f.region.Row(1), data), loads.Counters.InPlace.Load(), len(m.rows), i+1)
		}
	}
}
