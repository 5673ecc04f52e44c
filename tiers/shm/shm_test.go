package shm

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

const testRow = 1 << 20

// fill writes deterministic bytes for block i into the first half of row and zeroes the rest.
func fill(row []byte, i int) {
	x := uint64(i)*0x9E3779B97F4A7C15 | 1
	for off := 0; off < len(row)/2; off += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(row[off:], x)
	}
	clear(row[len(row)/2:])
}

// regionFile writes a region file of n rows, row r holding block r, and
// returns a Set mapping it.
func regionFile(t *testing.T, n int) (*Set, []byte, string) {
	t.Helper()
	data := make([]byte, n*testRow)
	for r := 0; r < n; r++ {
		fill(data[r*testRow:(r+1)*testRow], r)
	}
	path := filepath.Join(t.TempDir(), "vllm_offload_test.mmap")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	set, err := NewSet(filepath.Join(filepath.Dir(path), "*.mmap"))
	if err != nil {
		t.Fatal(err)
	}
	if err := set.Refresh(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(set.Close)
	return set, data, path
}

func TestConfirmFindsTheNewRowOnly(t *testing.T) {
	set, data, _ := regionFile(t, 8)
	d := block.DigestOf(data[2*testRow : 3*testRow])
	before := set.Candidates(d)
	if len(before) != 1 || before[0].Row != 2 {
		t.Fatalf("candidates %+v, want row 2", before)
	}
	if _, ok := set.Confirm(d, before); ok {
		t.Fatal("a row that held the block before the load proved the load")
	}
	if ref, ok := set.Confirm(d, nil); !ok || ref.Row != 2 {
		t.Fatalf("confirm without history: %+v %v", ref, ok)
	}
	if !set.Fits(testRow) || set.Fits(testRow*3) || set.Fits(1000) {
		t.Fatal("Fits disagrees with the region geometry")
	}
}

func TestConfirmRejectsWrongBytes(t *testing.T) {
	set, data, path := regionFile(t, 4)
	d := block.DigestOf(data[1*testRow : 2*testRow])
	// Row 3 receives the block's bytes with one flipped byte past the samples.
	row := append([]byte{}, data[1*testRow:2*testRow]...)
	row[testRow/2-1] ^= 1
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt(row, 3*testRow)
	f.Close()
	if ref, ok := set.Confirm(d, set.Candidates(d)); ok {
		t.Fatalf("wrong bytes in row %d proved the load", ref.Row)
	}
}

func TestInfosWarnOnGeometry(t *testing.T) {
	set, _, _ := regionFile(t, 4)
	infos := set.Infos([]int64{testRow})
	if len(infos) != 1 || infos[0].Rows != 4 || infos[0].Warning != "" {
		t.Fatalf("infos %+v", infos)
	}
	infos = set.Infos([]int64{3 * testRow})
	if infos[0].Rows != 0 || infos[0].Warning == "" {
		t.Fatalf("region not a multiple of the row size: %+v, want a warning", infos[0])
	}
	if _, err := NewSet("/dev/shm/[x"); err == nil {
		t.Fatal("malformed glob accepted")
	}
}

// BenchmarkConfirm finds a loaded block among 498 rows of 8,601,600 bytes
// (the field's region): sampled windows over every row, then one CRC32C.
func BenchmarkConfirm(b *testing.B) {
	const rows, rowBytes = 498, 8601600
	set := benchRegion(b, rows, rowBytes)
	row := make([]byte, rowBytes)
	fill(row, rows/2)
	d := block.DigestOf(row)
	set.Confirm(d, nil) // map the region's pages, as a running daemon has
	b.SetBytes(rowBytes)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if ref, ok := set.Confirm(d, nil); !ok || ref.Row != rows/2 {
			b.Fatalf("confirm: %+v %v", ref, ok)
		}
	}
	b.StopTimer() // unmapping and removing 4.3 GB is not part of a FLUSH
}

// Two rows that hold the same bytes at the pages sampled but differ elsewhere
// leave the written row unknown: ScanWritten finds none (the store then reads
// the file back) rather than the first twin's checksum.
func TestScanWrittenTwinRows(t *testing.T) {
	set, data, path := regionFile(t, 4)
	written := data[1*testRow : 2*testRow]
	twin := append([]byte(nil), written...)
	copy(twin[5*block.PageSize:], "another block")
	if err := os.WriteFile(path, append(twin, data[testRow:]...), 0o600); err != nil {
		t.Fatal(err)
	}
	pages := map[int64][]byte{}
	for _, p := range []int64{0, 1, 2, 3, 4, 6} {
		pages[p*page64] = written[p*page64 : (p+1)*page64]
	}
	if row, found := set.ScanWritten(testRow, pages); found && row.Sum.CRC() != block.CRC32C(written) {
		t.Fatalf("found the twin row's checksum %08x, the written row's is %08x", row.Sum.CRC(), block.CRC32C(written))
	}
	copy(twin, written)
	if err := os.WriteFile(path, append(twin, data[testRow:]...), 0o600); err != nil {
		t.Fatal(err)
	}
	if row, found := set.ScanWritten(testRow, pages); !found || row.Sum.CRC() != block.CRC32C(written) {
		t.Fatalf("two rows holding the same block: found %v, crc %08x", found, row.Sum.CRC())
	}
}

// A row that holds the first word of the pages read (the word tried first)
// but not all of them is not the written row.
func TestScanWrittenComparesEveryPage(t *testing.T) {
	set, data, path := regionFile(t, 4)
	written := append([]byte(nil), data[1*testRow:2*testRow]...)
	changed := append([]byte(nil), data...)
	copy(changed[1*testRow+3*page64+100:], "not the bytes written")
	if err := os.WriteFile(path, changed, 0o600); err != nil {
		t.Fatal(err)
	}
	pages := map[int64][]byte{}
	for _, p := range []int64{0, 1, 2, 3} {
		pages[p*page64] = written[p*page64 : (p+1)*page64]
	}
	if row, found := set.ScanWritten(testRow, pages); found {
		t.Fatalf("a row differing in the fourth page read was taken (crc %08x)", row.Sum.CRC())
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if row, found := set.ScanWritten(testRow, pages); !found || row.Sum.CRC() != block.CRC32C(written) {
		t.Fatalf("the written row: found %v, crc %08x", found, row.Sum.CRC())
	}
}

// Rows alike at the pages sampled, more of them than maxCandidates, leave the
// written row unknown (the store reads the file back) rather than each being
// checksummed whole: a region of many rows holding the same bytes would make
// every rename checksum all of it.
func TestScanWrittenBoundsRowsChecksummed(t *testing.T) {
	const n = maxCandidates + 2
	set, data, path := regionFile(t, n)
	written := append([]byte(nil), data[:testRow]...)
	alike := make([]byte, 0, n*testRow)
	for range n {
		alike = append(alike, written...)
	}
	if err := os.WriteFile(path, alike, 0o600); err != nil {
		t.Fatal(err)
	}
	pages := map[int64][]byte{0: written[:block.PageSize]}
	if _, found := set.ScanWritten(testRow, pages); found {
		t.Fatalf("%d rows alike at the pages sampled were all checksummed, the bound is %d", n, maxCandidates)
	}
}

// BenchmarkScanWritten finds the row a passthrough store wrote among 64 rows
// of 8 MiB, from 8 of its pages, and reads its checksum, probe windows and
// zero pages: the CPU a store's rename spends on the engine's region.
func BenchmarkScanWritten(b *testing.B) {
	const rows, rowBytes = 64, 8 << 20
	set := benchRegion(b, rows, rowBytes)
	row := make([]byte, rowBytes)
	fill(row, rows/2)
	pages := map[int64][]byte{}
	for i := int64(0); i < 8; i++ {
		off := i * (rowBytes / 2 / 8)
		pages[off] = row[off : off+page64]
	}
	want := block.CRC32C(row)
	b.SetBytes(rowBytes)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if w, ok := set.ScanWritten(rowBytes, pages); !ok || w.Sum.CRC() != want {
			b.Fatalf("scan: crc %08x ok %v, want %08x", w.Sum.CRC(), ok, want)
		}
	}
}

// benchRegion maps a region of rows rows of rowBytes, row r holding block r
// (fill), removed when the benchmark ends.
func benchRegion(b *testing.B, rows, rowBytes int) *Set {
	b.Helper()
	path := filepath.Join("/dev/shm", fmt.Sprintf("kvtier-test-bench-%d.mmap", os.Getpid()))
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.Remove(path) })
	row := make([]byte, rowBytes)
	for r := 0; r < rows; r++ {
		fill(row, r)
		if _, err := f.WriteAt(row, int64(r)*int64(rowBytes)); err != nil {
			b.Fatal(err)
		}
	}
	f.Close()
	set, err := NewSet(path)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { set.Close() })
	if err := set.Refresh(); err != nil {
		b.Fatal(err)
	}
	return set
}

// page64 is block.PageSize where sizes and offsets are int64.
var page64 = int64(block.PageSize)

// TestDestinationsComparesEveryByte: the row a load is filling is found from
// the delivered prefix; a row that matches every sample but differs in one
// byte of the prefix is not a destination, and a row that held the whole
// block before counts only when no other row matches.
func TestDestinationsComparesEveryByte(t *testing.T) {
	set, data, path := regionFile(t, 4)
	d := block.DigestOf(data[1*testRow : 2*testRow])
	before := set.Candidates(d) // row 1 holds the block already
	prefix := data[1*testRow : 1*testRow+testRow/4]
	if got := set.Destinations(d, prefix, before); len(got) != 1 || got[0].Row != 1 {
		t.Fatalf("only the row holding the block before: destinations %+v, want row 1 (a reload)", got)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	near := append([]byte{}, prefix...)
	flip := len(near) - 3 // inside the prefix, past every sample's 8 bytes
	for _, s := range d.Samples {
		if int(s.Off) <= flip && flip < int(s.Off)+8 {
			flip = int(s.Off) - 1
		}
	}
	near[flip] ^= 1
	if _, err := f.WriteAt(near, 3*testRow); err != nil { // row 3: one byte off
		t.Fatal(err)
	}
	if got := set.Destinations(d, prefix, before); len(got) != 1 || got[0].Row != 1 {
		t.Fatalf("with a row one byte off: destinations %+v, want row 1", got)
	}
	if _, err := f.WriteAt(prefix, 2*testRow); err != nil { // row 2: the load's destination
		t.Fatal(err)
	}
	if got := set.Destinations(d, prefix, before); len(got) != 1 || got[0].Row != 2 {
		t.Fatalf("destinations %+v, want row 2, the row being filled", got)
	}
}
