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
