package rowsync

import (
	"bytes"
	"strings"
	"syscall"
	"testing"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

func TestNewRegionGeometry(t *testing.T) {
	for _, tc := range []struct {
		size, rowBytes int
		want           string
	}{
		{size: 8192, rowBytes: 4096},
		{size: 8192, rowBytes: 3000, want: "not a whole number of 3000-byte rows"},
		{size: 0, rowBytes: 4096, want: "not a whole number"},
		{size: 4096, rowBytes: 0, want: "row size 0"},
		{size: 4096, rowBytes: -1, want: "row size -1"},
	} {
		r, err := NewRegion(make([]byte, tc.size), tc.rowBytes)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("NewRegion(%d, %d): %v", tc.size, tc.rowBytes, err)
		case tc.want == "" && (r.Rows() != tc.size/tc.rowBytes || r.RowBytes() != tc.rowBytes):
			t.Errorf("NewRegion(%d, %d): %d rows of %d", tc.size, tc.rowBytes, r.Rows(), r.RowBytes())
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("NewRegion(%d, %d) = %v, want error containing %q", tc.size, tc.rowBytes, err, tc.want)
		}
	}
}

func TestOpenRegion(t *testing.T) {
	odd := shmFile(t, 3*8192+1)
	if _, err := OpenRegion(odd, 8192); err == nil || !strings.Contains(err.Error(), "not a whole number of 8192-byte rows") {
		t.Errorf("OpenRegion(3 rows + 1 byte) = %v", err)
	}
	if _, err := OpenRegion(odd+".missing", 8192); err == nil {
		t.Error("OpenRegion(missing file) succeeded")
	}

	// Two mappings of one file see each other's writes.
	path := shmFile(t, 3*8192)
	a, b := openRegion(t, path, 8192), openRegion(t, path, 8192)
	copy(a.Row(2), "written through a")
	if !bytes.HasPrefix(b.Row(2), []byte("written through a")) {
		t.Error("row 2 differs between two mappings of one file")
	}
}

func TestIdentify(t *testing.T) {
	const rows, rowBytes = 12, 10 * block.PageSize
	r := shmRegion(t, rows, rowBytes)
	for i := range rows {
		fillHalf(r.Row(i), uint64(i))
	}
	for i := range rows {
		data := bytes.Clone(r.Row(i))
		if row, ok := r.Identify(data); !ok || row != i {
			t.Errorf("Identify(row %d) = %d, %v", i, row, ok)
		}
	}

	data := bytes.Clone(r.Row(5))
	data[len(data)-1] = 1 // differs only in the zero half, where no sample lies
	if row, ok := r.Identify(data); ok {
		t.Errorf("Identify(modified block) = %d, true", row)
	}
	if row, ok := r.Identify(data[:rowBytes-1]); ok {
		t.Errorf("Identify(short block) = %d, true", row)
	}

	// The engine wrote the block into row 7 while a stale copy sits in row 2.
	copy(r.Row(7), r.Row(2))
	if row, ok := r.Identify(bytes.Clone(r.Row(2))); ok {
		t.Errorf("Identify(block held by rows 2 and 7) = %d, true", row)
	}
	// Rows change under Identify: nothing is remembered between calls.
	fillHalf(r.Row(2), 99)
	if row, ok := r.Identify(bytes.Clone(r.Row(7))); !ok || row != 7 {
		t.Errorf("Identify(row 7 after row 2 changed) = %d, %v", row, ok)
	}
}

func TestIdentifyZeroAndTinyRows(t *testing.T) {
	r, err := NewRegion(make([]byte, 4*40), 40) // rows shorter than a sample
	if err != nil {
		t.Fatal(err)
	}
	copy(r.Row(3), "forty bytes of row three, and some more")
	if row, ok := r.Identify(bytes.Clone(r.Row(3))); !ok || row != 3 {
		t.Errorf("Identify(tiny row 3) = %d, %v", row, ok)
	}
	// Rows 0..2 are all zero: a zero block is ambiguous.
	if row, ok := r.Identify(make([]byte, 40)); ok {
		t.Errorf("Identify(zero block) = %d, true", row)
	}
}

func TestSampleOffsetsFollowNonZeroBytes(t *testing.T) {
	data := make([]byte, 1<<20)
	fillHalf(data[3<<18:], 1) // non-zero bytes only in [768 KiB, 896 KiB)
	var dst [maxSamples]int
	offs := sampleOffsets(data, &dst)
	if len(offs) != maxSamples {
		t.Fatalf("%d samples, want %d", len(offs), maxSamples)
	}
	for _, off := range offs {
		if block.IsZero(data[off : off+sampleBytes]) {
			t.Errorf("sample at %d is zero", off)
		}
	}
}

// BenchmarkIdentify identifies one row among 498 rows of 8,601,600 bytes
// (the field's DeepSeek-V4-Flash geometry), half of each row zero: "present"
// is the load case (samples of every row, then the full compare of the one
// candidate), "absent" a block no row holds (samples only).
func BenchmarkIdentify(b *testing.B) {
	const rows, rowBytes = 498, 8601600
	mem, err := syscall.Mmap(-1, 0, rows*rowBytes, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE|syscall.MAP_NORESERVE)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { syscall.Munmap(mem) })
	r, err := NewRegion(mem, rowBytes)
	if err != nil {
		b.Fatal(err)
	}
	for i := range rows {
		fillHalf(r.Row(i), uint64(i))
	}
	data := bytes.Clone(r.Row(rows / 2))
	b.Run("present", func(b *testing.B) {
		for b.Loop() {
			if row, ok := r.Identify(data); !ok || row != rows/2 {
				b.Fatalf("Identify = %d, %v", row, ok)
			}
		}
	})
	absent := make([]byte, rowBytes)
	fillHalf(absent, rows)
	b.Run("absent", func(b *testing.B) {
		for b.Loop() {
			if row, ok := r.Identify(absent); ok {
				b.Fatalf("Identify = %d, %v", row, ok)
			}
		}
	})
}
