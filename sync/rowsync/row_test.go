package rowsync

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"runtime/debug"
	"strings"
	"sync/atomic"
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
	dst := bytes.Repeat([]byte{0xee}, len(src)) // stale bytes everywhere
	dest := newRowCommit(dst)
	var asked *RowWrite
	r := bytes.NewReader(frame[5:])
	w, crc, refused, err := receiveRow(r, uint32(len(frame)-5), func(w *RowWrite) ([]byte, error) { asked = w; return buf, nil }, dest.gap, plainBulk(r))
	if err != nil || refused != nil {
		t.Fatal(err, refused)
	}
	if crc != block.CRC32C(src) {
		t.Errorf("CRC32C %08x, want %08x", crc, block.CRC32C(src))
	}
	if asked.Row != 1 || asked.Rows != 2 || asked.RowBytes != uint64(len(src)) || asked.Seq != 3 || w != asked {
		t.Errorf("bufFor got %+v", asked)
	}
	if dest.commit(w.Extents); !bytes.Equal(dst, src) {
		t.Error("the commit made another row")
	}

	// Without a buffer the body is skipped and the refusal returned.
	r = bytes.NewReader(append(frame[5:], "next frame"...))
	w, _, refused, err = receiveRow(r, uint32(len(frame)-5), func(*RowWrite) ([]byte, error) { return buf[1:], nil }, nil, plainBulk(r))
	if err != nil || refused == nil || !strings.Contains(refused.Error(), fmt.Sprintf("buffer of %d bytes", len(buf)-1)) || r.Len() != len("next frame") || w.Seq != 3 {
		t.Errorf("refused %v, %v, %d bytes left", refused, err, r.Len())
	}

	// A body cut short is an error, whatever it had delivered.
	r = bytes.NewReader(frame[5 : len(frame)-1])
	if _, _, _, err := receiveRow(r, uint32(len(frame)-5), func(*RowWrite) ([]byte, error) { return buf, nil }, nil, plainBulk(r)); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("receiveRow of a torn frame = %v", err)
	}
}

// TestCommitRowOnlyReadsZeroPages checks that a received row's commit clears the stale
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
				t.Fatalf("the commit wrote a page that was zero already: %v", r)
			}
		}()
		frame := Encode(&RowWrite{Row: 0, Rows: 1, RowBytes: uint64(len(src)), Extents: nonZeroExtents(src)})
		dest := newRowCommit(mem)
		r := bytes.NewReader(frame[5:])
		w, _, refused, err := receiveRow(r, uint32(len(frame)-5), func(*RowWrite) ([]byte, error) { return make([]byte, len(src)), nil }, dest.gap, plainBulk(r))
		if err != nil || refused != nil {
			t.Fatal(err, refused)
		}
		dest.commit(w.Extents)
	}()
	if !bytes.Equal(mem, src) {
		t.Error("the commit left stale bytes or lost the slot's")
	}
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r    io.Reader
	read int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.read += n
	return n, err
}

// TestReceiveRowTellsGapsBeforeTheirData checks that every range outside the
// extents is told before a byte of the bulk arrived, so the destination is
// read while the data still arrives.
func TestReceiveRowTellsGapsBeforeTheirData(t *testing.T) {
	page := block.PageSize
	src := make([]byte, 16*page)
	fillHalf(src[2*page:4*page], 1)
	fillHalf(src[9*page:11*page], 2)
	extents := nonZeroExtents(src)
	if len(extents) != 2 {
		t.Fatalf("%d extents, want 2", len(extents))
	}
	frame := Encode(&RowWrite{Row: 0, Rows: 1, RowBytes: uint64(len(src)), Extents: extents})
	r := &countingReader{r: bytes.NewReader(frame[5:])}
	type told struct{ from, to uint64 }
	var gaps []told
	var readAt []int
	_, _, refused, err := receiveRow(r, uint32(len(frame)-5), func(*RowWrite) ([]byte, error) { return make([]byte, len(src)), nil },
		func(from, to uint64) { gaps, readAt = append(gaps, told{from, to}), append(readAt, r.read) }, plainBulk(r))
	if err != nil || refused != nil {
		t.Fatal(err, refused)
	}
	endOf := func(e Extent) uint64 { return e.Off + uint64(len(e.Data)) }
	want := []told{{0, extents[0].Off}, {endOf(extents[0]), extents[1].Off}, {endOf(extents[1]), uint64(len(src))}}
	if !reflect.DeepEqual(gaps, want) {
		t.Fatalf("gaps %v, want %v", gaps, want)
	}
	bulkAt := len(frame) - 5 - len(extents[0].Data) - len(extents[1].Data)
	for i, at := range readAt {
		if at > bulkAt {
			t.Errorf("gap %v was told after %d bytes of the body, want by %d (before the bulk)", gaps[i], at, bulkAt)
		}
	}
}

// TestReceiveRowIsNotHeldByGapScans checks that the receive reaches the bulk
// with more gaps than scanLanes while every scan is held: no more than
// scanLanes scans run at once, so none runs on the receive's goroutine.
// Each gap's stale page is still cleared by the commit.
func TestReceiveRowIsNotHeldByGapScans(t *testing.T) {
	page := block.PageSize
	src := make([]byte, 16*page)
	for _, p := range []int{2, 6, 10} {
		fillHalf(src[p*page:(p+2)*page], uint64(p)) // page p non-zero, p+1 zero
	}
	extents := nonZeroExtents(src)
	if len(extents) != 3 {
		t.Fatalf("%d extents, want 3 (4 gaps)", len(extents))
	}
	dst := make([]byte, len(src))
	for _, p := range []int{0, 4, 8, 13} { // a stale page in every gap
		dst[p*page] = 0xee
	}
	release, tooMany := make(chan struct{}), make(chan struct{})
	var running atomic.Int32
	scan := findStale
	findStale = func(row []byte, from, to int) []block.Run {
		if running.Add(1) == scanLanes+1 {
			close(tooMany)
		}
		<-release
		running.Add(-1)
		return scan(row, from, to)
	}
	t.Cleanup(func() { findStale = scan })
	frame := Encode(&RowWrite{Row: 0, Rows: 1, RowBytes: uint64(len(src)), Extents: extents})
	r := bytes.NewReader(frame[5:])
	bulkRead := make(chan struct{})
	bulk := func(*RowWrite, uint64) (io.Reader, error) { close(bulkRead); return r, nil }
	dest := newRowCommit(dst)
	var w *RowWrite
	var refused, err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		w, _, refused, err = receiveRow(r, uint32(len(frame)-5), func(*RowWrite) ([]byte, error) { return make([]byte, len(src)), nil }, dest.gap, bulk)
	}()
	select {
	case <-bulkRead:
	case <-tooMany:
		t.Errorf("%d gaps scanned at once before the bulk: the receive scanned one", scanLanes+1)
	}
	close(release)
	if <-done; err != nil || refused != nil {
		t.Fatal(err, refused)
	}
	if dest.commit(w.Extents); !bytes.Equal(dst, src) {
		t.Error("the commit left a gap's stale page")
	}
}

// plainBulk is receiveRow's bulk for a frame in the clear: the bulk is the
// rest of r.
func plainBulk(r io.Reader) func(*RowWrite, uint64) (io.Reader, error) {
	return func(*RowWrite, uint64) (io.Reader, error) { return r, nil }
}
