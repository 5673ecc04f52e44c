package core

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
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
	store, err := disk.Open(disk.Config{Dir: t.TempDir()})
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
	if err := os.MkdirAll(filepath.Dir(f.store.Path(rel)), 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := rel + "_1.tmp"
	w, err := f.store.CreateTmp(tmp, syscall.O_CREAT|syscall.O_EXCL|syscall.O_WRONLY, 0o600)
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
	return rel, data
}

// corrupt flips bytes of the block file in the store, keeping its size.
func (f *fixture) corrupt(t *testing.T, rel string) {
	t.Helper()
	file, err := os.OpenFile(f.store.Path(rel), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	if _, err := file.WriteAt(bytes.Repeat([]byte{0xa5}, 64), 4096); err != nil {
		t.Fatal(err)
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

// fakeMirror records the rows it mirrors, or fails with err.
type fakeMirror struct {
	mu   sync.Mutex
	err  error
	rows []shm.RowRef
	// seen is what the destination row held when the mirror was asked.
	seen [][]byte
	row  func(shm.RowRef) []byte
}

func (m *fakeMirror) Mirrors() bool { return true }

func (m *fakeMirror) MirrorRow(ctx context.Context, ref shm.RowRef, data []byte, crc uint32) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if block.CRC32C(data) != crc {
		return errors.New("block does not match its checksum")
	}
	m.rows = append(m.rows, ref)
	m.seen = append(m.seen, bytes.Clone(m.row(ref)))
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

func TestCorruptBlockFailsTheOpenAndIsDropped(t *testing.T) {
	f := newFixture(t)
	rel, _ := f.put(t, 1)
	f.corrupt(t, rel)
	loads := NewLoads(Config{Store: f.store, Regions: f.regions})
	if _, err := loads.Open(context.Background(), refOf(rel)); disk.Errno(err) != syscall.EIO {
		t.Fatalf("open of a corrupt block: %v, want EIO", err)
	}
	if f.store.Lookup(rel, 0) {
		t.Fatal("the corrupt block is still in the store")
	}
	if _, err := os.Stat(f.store.Path(rel)); !os.IsNotExist(err) {
		t.Fatalf("the corrupt block file is still there: %v", err)
	}
	if got := loads.Counters.Refused.Load(); got != 1 {
		t.Fatalf("%d opens refused, want 1", got)
	}
}

// TestReloadFromARowThatHoldsTheBlock corrupts the block on disk after it
// was stored: a load that copies it from a row of the engine's region never
// reads the disk, so it succeeds with the right bytes.
func TestReloadFromARowThatHoldsTheBlock(t *testing.T) {
	f := newFixture(t)
	rel, data := f.put(t, 1)
	copy(f.region.Row(0), data) // the row the engine stored it from
	f.corrupt(t, rel)
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

// TestRowWithOtherBytesIsNotTrusted changes one byte of a row that matches
// the block's samples: the copy fails its checksum and the load reads the store.
func TestRowWithOtherBytesIsNotTrusted(t *testing.T) {
	f := newFixture(t)
	rel, data := f.put(t, 1)
	copy(f.region.Row(0), data)
	f.region.Row(0)[rowBytes/2+1] ^= 1
	loads := NewLoads(Config{Store: f.store, Regions: f.regions})
	l, err := loads.Open(context.Background(), refOf(rel))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	if l.Source != FromStore {
		t.Fatalf("source %d, want the store", l.Source)
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
