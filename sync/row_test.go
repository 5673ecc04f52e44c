package rowsync

import (
	"bytes"
	"strings"
	"testing"
)

// applyExtents is the reference for what a receiver makes of a RowWrite: the
// extents at their offsets, zeros elsewhere.
func applyExtents(rowBytes uint64, extents []Extent) []byte {
	row := make([]byte, rowBytes)
	for _, e := range extents {
		copy(row[e.Off:], e.Data)
	}
	return row
}

func TestNonZeroExtents(t *testing.T) {
	row := make([]byte, 10*ZeroRunBytes+100)
	row[5] = 1                  // page 0
	row[ZeroRunBytes+7] = 2     // page 1, merged with page 0
	row[4*ZeroRunBytes] = 3     // page 4
	row[10*ZeroRunBytes+99] = 4 // the short last page
	extents := nonZeroExtents(row)
	want := []struct{ off, n int }{{0, 2 * ZeroRunBytes}, {4 * ZeroRunBytes, ZeroRunBytes}, {10 * ZeroRunBytes, 100}}
	if len(extents) != len(want) {
		t.Fatalf("%d extents, want %d", len(extents), len(want))
	}
	for i, e := range extents {
		if int(e.Off) != want[i].off || len(e.Data) != want[i].n {
			t.Errorf("extent %d = %d+%d, want %d+%d", i, e.Off, len(e.Data), want[i].off, want[i].n)
		}
	}
	if !bytes.Equal(applyExtents(uint64(len(row)), extents), row) {
		t.Error("the extents do not rebuild the row")
	}
	if extents := nonZeroExtents(make([]byte, 3*ZeroRunBytes)); len(extents) != 0 {
		t.Errorf("zero row: %d extents", len(extents))
	}
}

func TestReceiveRow(t *testing.T) {
	src := make([]byte, 40*ZeroRunBytes)
	fillHalf(src, 1)
	frame := Encode(&RowWrite{Seq: 3, Row: 1, Rows: 2, RowBytes: uint64(len(src)), Extents: nonZeroExtents(src)})
	dst := bytes.Repeat([]byte{0xee}, len(src)) // stale bytes everywhere
	var asked *RowWrite
	ack, err := receiveRow(bytes.NewReader(frame[5:]), uint32(len(frame)-5), func(w *RowWrite) ([]byte, error) { asked = w; return dst, nil })
	if err != nil {
		t.Fatal(err)
	}
	if asked.Row != 1 || asked.Rows != 2 || asked.RowBytes != uint64(len(src)) || asked.Seq != 3 {
		t.Errorf("rowFor got %+v", asked)
	}
	if ack.Seq != 3 || ack.Row != 1 || ack.Err != "" || ack.CRC != Checksum(src) || !bytes.Equal(dst, src) {
		t.Errorf("ack %+v (want CRC %08x), rows equal %v", ack, Checksum(src), bytes.Equal(dst, src))
	}

	// Without a destination the body is skipped and the error acknowledged.
	r := bytes.NewReader(append(frame[5:], "next frame"...))
	ack, err = receiveRow(r, uint32(len(frame)-5), func(*RowWrite) ([]byte, error) { return dst[1:], nil })
	if err != nil || !strings.Contains(ack.Err, "destination row of 163839 bytes") || r.Len() != len("next frame") {
		t.Errorf("ack %+v, %v, %d bytes left", ack, err, r.Len())
	}
}
