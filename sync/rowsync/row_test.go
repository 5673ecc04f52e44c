package rowsync

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/kvtierfs/kvtierfs/tiers/block"
	"golang.org/x/sys/unix"
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
	row := make([]byte, 10*block.PageSize+100)
	row[5] = 1                    // page 0
	row[block.PageSize+7] = 2     // page 1, merged with page 0
	row[4*block.PageSize] = 3     // page 4
	row[10*block.PageSize+99] = 4 // the short last page
	extents := nonZeroExtents(row)
	want := []struct{ off, n int }{{0, 2 * block.PageSize}, {4 * block.PageSize, block.PageSize}, {10 * block.PageSize, 100}}
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
	if extents := nonZeroExtents(make([]byte, 3*block.PageSize)); len(extents) != 0 {
		t.Errorf("zero row: %d extents", len(extents))
	}
}

func TestReceiveRow(t *testing.T) {
	src := make([]byte, 40*block.PageSize)
	fillHalf(src, 1)
	frame := Encode(&RowWrite{Seq: 3, Row: 1, Rows: 2, RowBytes: uint64(len(src)), Extents: nonZeroExtents(src)})
	buf := make([]byte, len(src))
	var asked *RowWrite
	w, crc, refused, err := receiveRow(bytes.NewReader(frame[5:]), uint32(len(frame)-5), func(w *RowWrite) ([]byte, error) { asked = w; return buf, nil })
	if err != nil || refused != nil {
		t.Fatal(err, refused)
	}
	if crc != block.CRC32C(src) {
		t.Errorf("CRC32C %08x, want %08x", crc, block.CRC32C(src))
	}
	if asked.Row != 1 || asked.Rows != 2 || asked.RowBytes != uint64(len(src)) || asked.Seq != 3 || w != asked {
		t.Errorf("bufFor got %+v", asked)
	}
	dst := bytes.Repeat([]byte{0xee}, len(src)) // stale bytes everywhere
	if commitRow(dst, w.Extents); !bytes.Equal(dst, src) {
		t.Error("commitRow made another row")
	}

	// Without a buffer the body is skipped and the refusal returned.
	r := bytes.NewReader(append(frame[5:], "next frame"...))
	w, _, refused, err = receiveRow(r, uint32(len(frame)-5), func(*RowWrite) ([]byte, error) { return buf[1:], nil })
	if err != nil || refused == nil || !strings.Contains(refused.Error(), fmt.Sprintf("buffer of %d bytes", len(buf)-1)) || r.Len() != len("next frame") || w.Seq != 3 {
		t.Errorf("refused %v, %v, %d bytes left", refused, err, r.Len())
	}

	// A body cut short is an error, whatever it had delivered.
	r = bytes.NewReader(frame[5 : len(frame)-1])
	if _, _, _, err := receiveRow(r, uint32(len(frame)-5), func(*RowWrite) ([]byte, error) { return buf, nil }); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("receiveRow of a torn frame = %v", err)
	}
}

// TestCommitRowOnlyReadsZeroPages checks that commitRow clears the stale
// pages between and after the extents, whatever byte of the page is stale,
// and never writes a page that is zero already: those pages are mapped
// read-only, so a write would fault.
func TestCommitRowOnlyReadsZeroPages(t *testing.T) {
	page := block.PageSize
	mem, err := unix.Mmap(-1, 0, 16*page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	src := make([]byte, len(mem))
	fillPage := func(p []byte, seed byte) {
		for i := range p {
			p[i] = seed + byte(i%251) | 1
		}
	}
	fillPage(src[2*page:4*page], 3)    // the sent slot: pages 2 and 3
	fillPage(src[9*page:9*page+10], 5) // and part of page 9
	stale := map[int]int{0: page - 1, 5: 0, 9: page - 1, 12: page / 2, 15: page - 1}
	for p, at := range stale {
		mem[p*page+at] = 0xee
	}
	for p := range 16 {
		if _, ok := stale[p]; !ok && p != 2 && p != 3 {
			if err := unix.Mprotect(mem[p*page:(p+1)*page], unix.PROT_READ); err != nil {
				t.Fatal(err)
			}
		}
	}
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("commitRow wrote a page that was zero already: %v", r)
			}
		}()
		commitRow(mem, nonZeroExtents(src))
	}()
	if !bytes.Equal(mem, src) {
		t.Error("commitRow left stale bytes or lost the slot's")
	}
}
