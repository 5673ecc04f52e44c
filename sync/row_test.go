package rowsync

import (
	"bytes"
	"testing"
)

func TestScanRow(t *testing.T) {
	row := make([]byte, 10*ZeroRunBytes+100)
	row[5] = 1                  // page 0
	row[ZeroRunBytes+7] = 2     // page 1, merged with page 0
	row[4*ZeroRunBytes] = 3     // page 4
	row[10*ZeroRunBytes+99] = 4 // the short last page
	extents, crc := scanRow(row)
	want := []struct{ off, n int }{{0, 2 * ZeroRunBytes}, {4 * ZeroRunBytes, ZeroRunBytes}, {10 * ZeroRunBytes, 100}}
	if len(extents) != len(want) {
		t.Fatalf("%d extents, want %d", len(extents), len(want))
	}
	for i, e := range extents {
		if int(e.Off) != want[i].off || len(e.Data) != want[i].n {
			t.Errorf("extent %d = %d+%d, want %d+%d", i, e.Off, len(e.Data), want[i].off, want[i].n)
		}
	}
	if crc != Checksum(row) {
		t.Errorf("crc %08x, want %08x", crc, Checksum(row))
	}
	if extents, _ := scanRow(make([]byte, 3*ZeroRunBytes)); len(extents) != 0 {
		t.Errorf("zero row: %d extents", len(extents))
	}
}

func TestFillRow(t *testing.T) {
	src := make([]byte, 40*ZeroRunBytes)
	fillHalf(src, 1)
	dst := bytes.Repeat([]byte{0xee}, len(src)) // stale bytes everywhere
	extents, crc := scanRow(src)
	if got := fillRow(dst, extents); got != crc || !bytes.Equal(dst, src) {
		t.Errorf("fillRow: crc %08x want %08x, rows equal %v", got, crc, bytes.Equal(dst, src))
	}
}
