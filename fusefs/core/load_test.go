package core

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvtierfs/kvtierfs/integration/engineio"
	"github.com/kvtierfs/kvtierfs/tiers/block"
	"github.com/kvtierfs/kvtierfs/tiers/disk"
	"github.com/kvtierfs/kvtierfs/tiers/shm"
)

// rowBytes is a row of 2 MiB + 12 KiB, a size the engine uses.
const rowBytes = 2<<20 + 12<<10

// fixture is a store and an engine region of 4 rows in temporary directories.
type fixture struct {
	store   *disk.Store
	region  *engineio.Region
	regions *shm.Set
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	return newFixtureIn(t, t.TempDir())
}

// newFixtureIn is a fixture whose store is the directory dir.
func newFixtureIn(t *testing.T, dir string) *fixture {
	t.Helper()
	store, err := disk.Open(disk.Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	path := filepath.Join(t.TempDir(), "vllm_offload_test.mmap")
	region, err := engineio.CreateRegion(path, 4, rowBytes)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { region.Close() })
	regions, err := shm.NewSet(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(regions.Close)
	if err := regions.Refresh(); err != nil {
		t.Fatal(err)
	}
	return &fixture{store: store, region: region, regions: regions}
}

// testBlock is the store-relative path and bytes of test block i.
func testBlock(i int) (string, []byte) {
	h := fmt.Sprintf("%064x", i+1)
	data := make([]byte, rowBytes)
	engineio.FillPattern(data, uint64(i))
	return fmt.Sprintf("m_0123456789ab_r0/%s/%s_g0/%s.bin", h[:3], h[3:5], h), data
}

// refOf is the block.Ref of a test block's path, as the adapter hands it on.
func refOf(rel string) block.Ref {
	ref, _ := block.ParseRef(rel)
	return ref
}

// put stores block i as the engine does: a tmp file written once, then renamed.
func (f *fixture) put(t *testing.T, i int) (string, []byte) {
	t.Helper()
	rel, data := testBlock(i)
	f.putData(t, rel, data)
	return rel, data
}

// putData stores data as block rel, as put does.
func (f *fixture) putData(t *testing.T, rel string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(f.store.Path(rel)), 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := rel + "_1.tmp"
	w, err := f.store.CreateTmp(tmp, syscall.O_CREAT|syscall.O_EXCL|syscall.O_WRONLY)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := w.WriteAt(data, 0); err != nil || n != len(data) {
		t.Fatalf("write: %d, %v", n, err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.store.Publish(tmp, rel); err != nil {
		t.Fatal(err)
	}
}

// corrupt flips 64 bytes of the block file in the store at off, keeping its size.
func (f *fixture) corrupt(t *testing.T, rel string, off int64) {
	t.Helper()
	file, err := os.OpenFile(f.store.Path(rel), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	var before, after syscall.Stat_t
	if err := syscall.Fstat(int(file.Fd()), &before); err != nil {
		t.Fatal(err)
	}
	// Written again until the change time moved: before Linux 6.13 a write
	// within the coarse clock's tick of the publish leaves it as it was.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, err := file.WriteAt(bytes.Repeat([]byte{0xa5}, 64), off); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Fstat(int(file.Fd()), &after); err != nil {
			t.Fatal(err)
		}
		if after.Ctim != before.Ctim {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the change time of %s stayed at %v through 10 s of writes", rel, before.Ctim)
		}
	}
}

// engineRead replays the engine's one read of a block into a row, as the
// kernel splits it into requests of reqBytes, delivering each reply into row.
func engineRead(ctx context.Context, l *Load, row []byte, reqBytes int) error {
	for off := 0; off < len(row); off += reqBytes {
		data, err := l.Read(ctx, int64(off), reqBytes)
		if err != nil {
			return err
		}
		copy(row[off:], data)
		l.Delivered(int64(off), int64(off+len(data)))
	}
	return nil
}

// fakeMirror records the rows it mirrors, or fails with err. With called
// set, it announces each row there and then waits for release.
type fakeMirror struct {
	mu   sync.Mutex
	err  error
	rows []shm.RowRef
	// seen is what the destination row held when the mirror was asked.
	seen [][]byte
	row  func(shm.RowRef) []byte

	called  chan shm.RowRef
	release chan struct{}
}

func (m *fakeMirror) Mirrors() bool { return true }

func (m *fakeMirror) MirrorRow(ctx context.Context, ref shm.RowRef, data []byte, crc uint32, nonZero []block.Run) error {
	if block.CRC32C(data) != crc {
		return errors.New("block does not match its checksum")
	}
	if want := block.NonZeroRuns(data, 0); !slices.Equal(nonZero, want) {
		return fmt.Errorf("non-zero runs %v, want %v", nonZero, want)
	}
	m.mu.Lock()
	m.rows = append(m.rows, ref)
	m.seen = append(m.seen, bytes.Clone(m.row(ref)))
	m.mu.Unlock()
	if m.called != nil {
		m.called <- ref
		<-m.release
	}
	return m.err
}

// mirror is a fakeMirror over the fixture's region that fails with err.
func (f *fixture) mirror(err error) *fakeMirror {
	return &fakeMirror{err: err, row: func(ref shm.RowRef) []byte { return f.region.Row(ref.Row) }}
}

// open opens rel through loads built from cfg over the fixture; the load is
// released when the test ends.
func (f *fixture) open(t *testing.T, cfg Config, rel string) (*Loads, *Load) {
	t.Helper()
	cfg.Store, cfg.Regions = f.store, f.regions
	loads := NewLoads(cfg)
	l, err := loads.Open(context.Background(), refOf(rel))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Release() })
	return loads, l
}

func TestLoadFromStoreVerifiesAtOpen(t *testing.T) {
	f := newFixture(t)
	rel, data := f.put(t, 1)
	loads := NewLoads(Config{Store: f.store, Regions: f.regions})
	l, err := loads.Open(context.Background(), refOf(rel))
	if err != nil {
		t.Fatal(err)
	}
	row := f.region.Row(2)
	if err := engineRead(context.Background(), l, row, 1<<20); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(row, data) || l.Source != FromStore {
		t.Fatalf("loaded bytes equal: %v, source %d; want equal, from the store", bytes.Equal(row, data), l.Source)
	}
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	if got := loads.Counters.Completed.Load(); got != 1 {
		t.Fatalf("%d loads completed, want 1", got)
	}
}

// TestCorruptBlockFailsTheLastRead corrupts the block's second MiB in the
// store tree: the open and the first read succeed (their bytes are not proven
// yet), the read that reaches the end fails with EIO, the block is dropped
// and nothing counts as loaded.
func TestCorruptBlockFailsTheLastRead(t *testing.T) {
	f := newFixture(t)
	rel, _ := f.put(t, 1)
	f.corrupt(t, rel, 1<<20+4096)
	loads, l := f.open(t, Config{}, rel)
	// The first MiB may be served before the whole block is read, or fail
	// if the proof already failed (which READ fails first is a race here;
	// TestCorruptBlockLandingInStepsFailsOnlyAtTheEnd orders it).
	if _, err := l.Read(context.Background(), 0, 1<<20); err != nil && disk.Errno(err) != syscall.EIO {
		t.Fatalf("first read of a block corrupt further on: %v, want its bytes or EIO", err)
	}
	l.Delivered(0, 1<<20)
	if _, err := l.Read(context.Background(), 1<<20, rowBytes); disk.Errno(err) != syscall.EIO {
		t.Fatalf("last read of a corrupt block: %v, want EIO", err)
	}
	if _, err := l.Read(context.Background(), 0, 1<<20); disk.Errno(err) != syscall.EIO {
		t.Fatalf("a read after the failure: %v, want EIO", err)
	}
	if err := l.Flush(); disk.Errno(err) != syscall.EIO {
		t.Fatalf("close of a corrupt block: %v, want EIO", err)
	}
	if f.store.Lookup(rel, 0) {
		t.Fatal("the corrupt block is still in the store")
	}
	if _, err := os.Stat(f.store.Path(rel)); !os.IsNotExist(err) {
		t.Fatalf("the corrupt block file is still there: %v", err)
	}
	st := f.store.Counters()
	if loads.Counters.Completed.Load() != 0 || loads.Counters.Refused.Load() != 1 || st.Reads.Load() != 0 || st.ChangedOutside.Load() != 1 {
		t.Fatalf("completed %d, refused %d, store loads %d, changed outside %d; want 0, 1, 0, 1",
			loads.Counters.Completed.Load(), loads.Counters.Refused.Load(), st.Reads.Load(), st.ChangedOutside.Load())
	}
	if n := loads.Counters.FromStore.Load(); n != 0 {
		t.Fatalf("%d loads counted as read from the store and verified, want 0", n)
	}
}

// gatedRead replaces the loads' store read with one that lands the block's
// bytes a MiB at a time, each once the test sends on step; the block holds
// data, and a checksum that does not match fails the read.
type gatedRead struct {
	data []byte
	step chan struct{}
}

func (g *gatedRead) install(loads *Loads) *gatedRead {
	loads.readInto = func(r *disk.Reader, buf []byte, landed func(int)) error {
		for off := 0; off < len(buf); off += disk.ReadChunk {
			<-g.step
			end := min(off+disk.ReadChunk, len(buf))
			copy(buf[off:end], g.data[off:end])
			landed(end)
		}
		d := r.Digest()
		if block.CRC32C(buf) != d.CRC {
			return r.Corrupt("checksum mismatch")
		}
		return nil
	}
	return g
}

// async runs fn in a goroutine and returns its result's channel.
func async[T any](fn func() T) chan T {
	ch := make(chan T, 1)
	go func() { ch <- fn() }()
	return ch
}

type readResult struct {
	data []byte
	err  error
}

// TestReadsAreServedAsTheBlockLands holds the store read between its chunks:
// the open returns before any byte was read, a read waits until its bytes
// landed and gets them, and the read that reaches the end waits for the
// whole block.
func TestReadsAreServedAsTheBlockLands(t *testing.T) {
	f := newFixture(t)
	rel, data := f.put(t, 1)
	loads := NewLoads(Config{Store: f.store, Regions: f.regions})
	g := (&gatedRead{data: data, step: make(chan struct{})}).install(loads)
	l, err := loads.Open(context.Background(), refOf(rel))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	read := func(off int64, n int) chan readResult {
		return async(func() readResult {
			b, err := l.Read(context.Background(), off, n)
			return readResult{bytes.Clone(b), err}
		})
	}
	second, last := read(1<<20, 1<<20), read(2<<20, 1<<20)
	g.step <- struct{}{} // the first MiB lands
	first := <-read(0, 1<<20)
	if first.err != nil || !bytes.Equal(first.data, data[:1<<20]) {
		t.Fatalf("first MiB once landed: %v, bytes equal %v", first.err, bytes.Equal(first.data, data[:1<<20]))
	}
	select {
	case r := <-second:
		t.Fatalf("the second MiB was served before it landed: %v", r.err)
	default:
	}
	g.step <- struct{}{} // the second MiB lands
	if r := <-second; r.err != nil || !bytes.Equal(r.data, data[1<<20:2<<20]) {
		t.Fatalf("second MiB once landed: %v, bytes equal %v", r.err, bytes.Equal(r.data, data[1<<20:2<<20]))
	}
	select {
	case r := <-last:
		t.Fatalf("the end of the block was served before the block was proven: %v", r.err)
	default:
	}
	g.step <- struct{}{} // the rest lands and the block is proven
	if r := <-last; r.err != nil || !bytes.Equal(r.data, data[2<<20:]) {
		t.Fatalf("last read: %v, bytes equal %v", r.err, bytes.Equal(r.data, data[2<<20:]))
	}
	l.Delivered(0, rowBytes)
	if err := l.Flush(); err != nil || loads.Counters.Completed.Load() != 1 {
		t.Fatalf("close: %v, completed %d; want nil, 1", err, loads.Counters.Completed.Load())
	}
}

// TestCorruptBlockLandingInStepsFailsOnlyAtTheEnd serves the first MiBs of a
// block whose last MiB is wrong: the earlier reads succeed, the one that
// reaches the end and every later one fail, and nothing counts as loaded.
func TestCorruptBlockLandingInStepsFailsOnlyAtTheEnd(t *testing.T) {
	f := newFixture(t)
	rel, data := f.put(t, 1)
	wrong := bytes.Clone(data)
	wrong[rowBytes-1] ^= 1
	loads := NewLoads(Config{Store: f.store, Regions: f.regions})
	g := (&gatedRead{data: wrong, step: make(chan struct{})}).install(loads)
	l, err := loads.Open(context.Background(), refOf(rel))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	for off := int64(0); off < 2<<20; off += 1 << 20 {
		g.step <- struct{}{}
		if b, err := l.Read(context.Background(), off, 1<<20); err != nil || !bytes.Equal(b, data[off:off+1<<20]) {
			t.Fatalf("read at %d before the end: %v", off, err)
		}
		l.Delivered(off, off+1<<20)
	}
	g.step <- struct{}{}
	if _, err := l.Read(context.Background(), 2<<20, 1<<20); disk.Errno(err) != syscall.EIO {
		t.Fatalf("the read that reaches the end of a wrong block: %v, want EIO", err)
	}
	if _, err := l.Read(context.Background(), 0, 1<<20); disk.Errno(err) != syscall.EIO {
		t.Fatalf("a read after the failure: %v, want EIO", err)
	}
	if err := l.Flush(); disk.Errno(err) != syscall.EIO || loads.Counters.Completed.Load() != 0 || f.store.Lookup(rel, 0) {
		t.Fatalf("close: %v, completed %d, block present %v; want EIO, 0, false", err, loads.Counters.Completed.Load(), f.store.Lookup(rel, 0))
	}
}

// TestConcurrentReadsOfOneLoad answers a block's requests in any order from
// many goroutines while the store read runs (go test -race).
func TestConcurrentReadsOfOneLoad(t *testing.T) {
	f := newFixture(t)
	rel, data := f.put(t, 1)
	loads := NewLoads(Config{Store: f.store, Regions: f.regions})
	for round := range 8 {
		l, err := loads.Open(context.Background(), refOf(rel))
		if err != nil {
			t.Fatal(err)
		}
		const req = 128 << 10
		row := make([]byte, rowBytes)
		var wg sync.WaitGroup
		errs := make(chan error, rowBytes/req+1)
		for off := (rowBytes - 1) / req * req; off >= 0; off -= req {
			wg.Go(func() {
				b, err := l.Read(context.Background(), int64(off), req)
				if err != nil {
					errs <- err
					return
				}
				copy(row[off:], b)
				l.Delivered(int64(off), int64(off+len(b)))
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("round %d: %v", round, err)
		}
		if !bytes.Equal(row, data) {
			t.Fatalf("round %d: wrong bytes", round)
		}
		if err := l.Flush(); err != nil {
			t.Fatal(err)
		}
		if err := l.Release(); err != nil {
			t.Fatal(err)
		}
	}
	if got := loads.Counters.Completed.Load(); got != 8 {
		t.Fatalf("%d loads completed, want 8", got)
	}
}

// TestReloadFromARowThatHoldsTheBlock corrupts the block on disk after it
// was stored: a load that copies it from a row of the engine's region never
// reads the disk, so it succeeds with the right bytes.
func TestReloadFromARowThatHoldsTheBlock(t *testing.T) {
	f := newFixture(t)
	rel, data := f.put(t, 1)
	copy(f.region.Row(0), data) // the row the engine stored it from
	f.corrupt(t, rel, 4096)
	loads := NewLoads(Config{Store: f.store, Regions: f.regions})
	l, err := loads.Open(context.Background(), refOf(rel))
	if err != nil {
		t.Fatalf("reload of a block a row holds: %v", err)
	}
	defer l.Release()
	row := f.region.Row(0)
	if err := engineRead(context.Background(), l, row, 1<<20); err != nil {
		t.Fatal(err)
	}
	if l.Source != FromRow || !bytes.Equal(row, data) || loads.Counters.FromStore.Load() != 0 {
		t.Fatalf("source %d, bytes equal %v, %d store reads; want from the row, equal, none", l.Source, bytes.Equal(row, data), loads.Counters.FromStore.Load())
	}
}

// TestRowWithOtherBytesIsNotTrusted changes one bit of a row that matches
// the block's samples, at the edges of the pieces the copy is checked in and
// at the row's ends: the copy fails its checksum, and the load reads the
// store and serves the block's bytes.
func TestRowWithOtherBytesIsNotTrusted(t *testing.T) {
	for _, off := range []int{0, block.CachePiece - 1, block.CachePiece, rowBytes/2 + 1, rowBytes - 1} {
		f := newFixture(t)
		rel, data := f.put(t, 1)
		copy(f.region.Row(0), data)
		f.region.Row(0)[off] ^= 1
		loads := NewLoads(Config{Store: f.store, Regions: f.regions})
		l, err := loads.Open(context.Background(), refOf(rel))
		if err != nil {
			t.Fatal(err)
		}
		row := make([]byte, rowBytes)
		err = engineRead(context.Background(), l, row, 1<<20)
		l.Release()
		if l.Source != FromStore || err != nil || !bytes.Equal(row, data) {
			t.Fatalf("bit at %d flipped in the row: source %d, %v, bytes equal %v; want the store's bytes", off, l.Source, err, bytes.Equal(row, data))
		}
	}
}

func TestMirrorBeforeTheLastReadReturns(t *testing.T) {
	f := newFixture(t)
	rel, data := f.put(t, 1)
	copy(f.region.Row(1), bytes.Repeat([]byte{7}, rowBytes)) // stale bytes of another block
	m := f.mirror(nil)
	loads, l := f.open(t, Config{Mirror: m}, rel)
	if err := engineRead(context.Background(), l, f.region.Row(1), 1<<20); err != nil {
		t.Fatal(err)
	}
	if len(m.rows) != 1 || m.rows[0].Row != 1 {
		t.Fatalf("mirrored rows %v, want row 1", m.rows)
	}
	if bytes.Equal(m.seen[0], data) {
		t.Fatal("the mirror ran after the last read had delivered: it must run before")
	}
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := loads.Counters.Mirrored.Load(); got != 1 {
		t.Fatalf("%d loads mirrored, want 1", got)
	}
}

// TestMirrorGetsTheNonZeroPagesFoundAsTheBlockLanded loads a block whose
// zero and non-zero pages alternate across its read chunks: the runs the
// load found behind the store read and hands the mirror must be those of
// the whole block (the fake mirror fails the load otherwise).
func TestMirrorGetsTheNonZeroPagesFoundAsTheBlockLanded(t *testing.T) {
	f := newFixture(t)
	rel, data := testBlock(1)
	page := block.PageSize
	for _, zero := range [][2]int{{0, 25 * page}, {40 * page, 41 * page}, {disk.ReadChunk + 2*page, 2 * disk.ReadChunk}, {rowBytes - 2*page, rowBytes - page}} {
		clear(data[zero[0]:zero[1]])
	}
	runs := block.NonZeroRuns(data, 0)
	if len(runs) != 4 || runs[1].Start != 41*page || runs[1].End != disk.ReadChunk+2*page {
		t.Fatalf("test block's non-zero runs %v, want 4, the second across the first chunk's end", runs)
	}
	f.putData(t, rel, data)
	copy(f.region.Row(1), bytes.Repeat([]byte{7}, rowBytes)) // stale bytes of another block
	m := f.mirror(nil)
	loads := NewLoads(Config{Store: f.store, Regions: f.regions, Mirror: m})
	g := (&gatedRead{data: data, step: make(chan struct{})}).install(loads)
	l, err := loads.Open(context.Background(), refOf(rel))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	go func() {
		for range 3 { // the first MiB, the second, the rest
			g.step <- struct{}{}
		}
	}()
	if err := engineRead(context.Background(), l, f.region.Row(1), 1<<20); err != nil {
		t.Fatal(err)
	}
	if err := l.Flush(); err != nil || loads.Counters.Mirrored.Load() != 1 || len(m.rows) != 1 {
		t.Fatalf("close: %v, mirrored %d, rows %v; want nil, 1, one row", err, loads.Counters.Mirrored.Load(), m.rows)
	}
	if l.Source != FromStore || l.scanned == nil {
		t.Fatalf("source %v, scanned behind the read %v; want a store read scanned as it landed", l.Source, l.scanned != nil)
	}
}

// TestMirrorOverlapsTheRead delivers every request of a row but the last:
// the row goes to the peers meanwhile, the load's other requests go on while
// the peers have not answered, and the last request returns only after they
// did.
func TestMirrorOverlapsTheRead(t *testing.T) {
	f := newFixture(t)
	rel, data := f.put(t, 1)
	m := f.mirror(nil)
	m.called, m.release = make(chan shm.RowRef), make(chan struct{})
	loads, l := f.open(t, Config{Mirror: m}, rel)
	const req = 128 << 10
	last := int64((rowBytes - 1) / req * req)
	row := f.region.Row(2)
	if err := engineRead(context.Background(), l, row[:last], req); err != nil {
		t.Fatal(err)
	}
	var ref shm.RowRef
	select {
	case ref = <-m.called:
	case <-time.After(30 * time.Second):
		t.Fatal("the row did not start to the peers before the last request")
	}
	if ref.Row != 2 {
		t.Fatalf("mirrored row %d, want 2", ref.Row)
	}
	// The peers have not answered: the load's other requests still go on.
	if b, err := l.Read(context.Background(), 0, req); err != nil || !bytes.Equal(b, data[:req]) {
		t.Fatalf("a read while the peers are busy: %v", err)
	}
	l.Delivered(0, req)
	end := async(func() readResult { b, err := l.Read(context.Background(), last, req); return readResult{b, err} })
	select {
	case r := <-end:
		t.Fatalf("the last request returned before the peers answered: %v", r.err)
	default:
	}
	close(m.release)
	r := <-end
	if r.err != nil {
		t.Fatalf("last request: %v", r.err)
	}
	copy(row[last:], r.data)
	l.Delivered(last, rowBytes)
	if err := l.Flush(); err != nil || loads.Counters.Mirrored.Load() != 1 || len(m.rows) != 1 {
		t.Fatalf("close: %v, mirrored %d, rows %v; want nil, 1, one row", err, loads.Counters.Mirrored.Load(), m.rows)
	}
}

func TestFailedMirrorFailsTheRead(t *testing.T) {
	f := newFixture(t)
	rel, _ := f.put(t, 1)
	m := f.mirror(errors.New("peer answered another checksum"))
	loads, l := f.open(t, Config{Mirror: m}, rel)
	if err := engineRead(context.Background(), l, f.region.Row(1), 1<<20); disk.Errno(err) != syscall.EIO {
		t.Fatalf("read with a failing peer: %v, want EIO", err)
	}
	if err := l.Flush(); disk.Errno(err) != syscall.EIO {
		t.Fatalf("close after the failed read: %v, want EIO", err)
	}
	if loads.Counters.Completed.Load() != 0 || loads.Counters.MirrorFailures.Load() != 1 {
		t.Fatalf("completed %d, mirror failures %d; want 0 and 1", loads.Counters.Completed.Load(), loads.Counters.MirrorFailures.Load())
	}
}

// TestLastReadWaitsForTheEarlierOnes answers the last READ first, as the
// kernel may when it sends a row's requests together: it waits until the
// earlier replies were delivered, then mirrors the row they filled.
func TestLastReadWaitsForTheEarlierOnes(t *testing.T) {
	f := newFixture(t)
	rel, data := f.put(t, 1)
	m := f.mirror(nil)
	_, l := f.open(t, Config{Mirror: m}, rel)
	const req = 1 << 20
	last := int64(rowBytes / req * req)
	done := make(chan error, 1)
	go func() {
		_, err := l.Read(context.Background(), last, req)
		done <- err
	}()
	row := f.region.Row(3)
	if err := engineRead(context.Background(), l, row[:last], req); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("last read: %v", err)
	}
	if len(m.rows) != 1 || m.rows[0].Row != 3 || !bytes.Equal(row[:last], data[:last]) {
		t.Fatalf("mirrored rows %v, want row 3", m.rows)
	}
}

func TestLastReadFailsWhenEarlierOnesNeverArrive(t *testing.T) {
	f := newFixture(t)
	rel, _ := f.put(t, 1)
	m := f.mirror(nil)
	_, l := f.open(t, Config{Mirror: m, Deadline: 50 * time.Millisecond}, rel)
	if _, err := l.Read(context.Background(), 2<<20, 1<<20); disk.Errno(err) != syscall.EIO {
		t.Fatalf("last read without the earlier ones: %v, want EIO", err)
	}
	if len(m.rows) != 0 {
		t.Fatalf("mirrored %v without knowing the row", m.rows)
	}
}

func TestOneRequestRowCannotBeMirrored(t *testing.T) {
	f := newFixture(t)
	rel, _ := f.put(t, 1)
	m := f.mirror(nil)
	_, l := f.open(t, Config{Mirror: m}, rel)
	if err := engineRead(context.Background(), l, f.region.Row(1), 4<<20); disk.Errno(err) != syscall.EIO {
		t.Fatalf("a row read in one request with mirroring on: %v, want EIO", err)
	}
}

// TestReloadIntoTheRowThatHoldsItIsMirrored reloads a block into the one row
// that already holds it: that row is the destination and goes to the peers.
func TestReloadIntoTheRowThatHoldsItIsMirrored(t *testing.T) {
	f := newFixture(t)
	rel, data := f.put(t, 1)
	copy(f.region.Row(2), data)
	m := f.mirror(nil)
	_, l := f.open(t, Config{Mirror: m}, rel)
	if err := engineRead(context.Background(), l, f.region.Row(2), 1<<20); err != nil {
		t.Fatal(err)
	}
	if l.Source != FromRow || len(m.rows) != 1 || m.rows[0].Row != 2 {
		t.Fatalf("source %d, mirrored %v; want from the row, row 2", l.Source, m.rows)
	}
}

func TestOpenLoadsAreBounded(t *testing.T) {
	f := newFixture(t)
	rel, _ := f.put(t, 1)
	loads := NewLoads(Config{Store: f.store, MaxBytes: rowBytes, OpenWait: 20 * time.Millisecond})
	l, err := loads.Open(context.Background(), refOf(rel))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := loads.Open(context.Background(), refOf(rel)); disk.Errno(err) != syscall.EBUSY {
		t.Fatalf("open beyond the bound: %v, want EBUSY", err)
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	l, err = loads.Open(context.Background(), refOf(rel))
	if err != nil {
		t.Fatalf("open after a release: %v", err)
	}
	l.Release()
}

func TestSpans(t *testing.T) {
	var s spans
	s.add(10, 20)
	s.add(0, 5)
	if s.covers(0, 20) || !s.covers(10, 20) || !s.covers(0, 5) {
		t.Fatalf("spans %v", s)
	}
	s.add(5, 10)
	if !s.covers(0, 20) || len(s) != 1 {
		t.Fatalf("after filling the gap: %v, want one span [0,20)", s)
	}
	s.add(30, 40)
	if s.covers(0, 40) || !s.covers(30, 35) {
		t.Fatalf("spans %v", s)
	}
}

// importingFetcher stands for the shared level: it publishes stored in the
// store and hands back handed (the bytes it claims to have read).
type importingFetcher struct {
	store          *disk.Store
	stored, handed []byte
}

func (f importingFetcher) Fetch(rel string) ([]byte, error) {
	if err := f.store.Import(rel, f.stored); err != nil {
		return nil, err
	}
	return bytes.Clone(f.handed), nil
}

// TestLoadFromSharedFetch: a block only the shared level holds is loaded
// from the bytes its fetch read, not read from the store again; bytes that
// are not the pinned block's are refused and the store is read instead.
func TestLoadFromSharedFetch(t *testing.T) {
	for _, tc := range []struct {
		name   string
		handed func(data []byte) []byte
		want   Source
	}{
		{"the fetched bytes", func(data []byte) []byte { return data }, FromShared},
		{"other bytes", func(data []byte) []byte { b := bytes.Clone(data); b[5]++; return b }, FromStore},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			rel, data := testBlock(1)
			loads := NewLoads(Config{Store: f.store, Regions: f.regions,
				Shared: importingFetcher{store: f.store, stored: data, handed: tc.handed(data)}})
			l, err := loads.Open(context.Background(), refOf(rel))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Release() })
			row := f.region.Row(2)
			if err := engineRead(context.Background(), l, row, 1<<20); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(row, data) || l.Source != tc.want {
				t.Fatalf("loaded bytes equal: %v, source %d; want equal, source %d", bytes.Equal(row, data), l.Source, tc.want)
			}
		})
	}
}

// TestReadsBeforeTheEndCarryOnlyProvenChunks reads the real store: a read
// that stops before the block's end, in any chunk, fails (EIO) and drops the
// block when a chunk it needs was damaged on disk, and is never answered
// with bytes that did not match their chunk CRC.
func TestReadsBeforeTheEndCarryOnlyProvenChunks(t *testing.T) {
	for _, c := range []struct {
		name     string
		damageAt int64
		readAt   int64
		mayPass  bool
	}{
		{"damage in the chunk read", 1<<20 + 100, 1 << 20, false},
		{"damage in an earlier chunk, read out of order", 100, 1 << 20, false},
		{"damage in a later chunk", 1<<20 + 100, 0, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t)
			rel, data := f.put(t, 1)
			f.corrupt(t, rel, c.damageAt)
			_, l := f.open(t, Config{}, rel)
			got, err := l.Read(context.Background(), c.readAt, 1<<20)
			switch {
			case err == nil && c.mayPass:
				// The intact chunk was proven before the damage was read.
				if !bytes.Equal(got, data[c.readAt:c.readAt+1<<20]) {
					t.Fatal("a read returned bytes that are not the block's")
				}
			case disk.Errno(err) != syscall.EIO:
				t.Fatalf("read at %d: %v, want EIO", c.readAt, err)
			}
			if _, err := l.Read(context.Background(), int64(rowBytes)-4096, 4096); disk.Errno(err) != syscall.EIO {
				t.Fatalf("the read that reaches the end: %v, want EIO", err)
			}
			if f.store.Lookup(rel, 0) {
				t.Fatal("the damaged block is still in the store")
			}
		})
	}
}

// TestFlushFailsWhenTheMirroredRowChanged changes the head's row at one of
// the block's samples between the last read and the close: the close fails
// with EIO and the load is not counted as completed.
func TestFlushFailsWhenTheMirroredRowChanged(t *testing.T) {
	f := newFixture(t)
	rel, _ := f.put(t, 1)
	loads, l := f.open(t, Config{Mirror: f.mirror(nil)}, rel)
	row := f.region.Row(2)
	if err := engineRead(context.Background(), l, row, 1<<20); err != nil {
		t.Fatal(err)
	}
	s := l.digest.Samples[len(l.digest.Samples)-1]
	row[s.Off] ^= 0xff
	if err := l.Flush(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("close after the row changed: %v, want EIO", err)
	}
	if got := loads.Counters.Completed.Load(); got != 0 {
		t.Fatalf("%d loads completed, want 0", got)
	}
}
