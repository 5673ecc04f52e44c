package block

import (
	"hash/crc32"
	"os"
	"slices"
	"strconv"
	"testing"
)

func TestNonZeroRuns(t *testing.T) {
	p := make([]byte, 10*PageSize+100)
	p[5] = 1              // page 0
	p[PageSize+7] = 2     // page 1, merged with page 0
	p[4*PageSize] = 3     // page 4
	p[10*PageSize+99] = 4 // the short last page
	want := []Run{{0, 2 * PageSize}, {4 * PageSize, 5 * PageSize}, {10 * PageSize, 10*PageSize + 100}}
	if got := NonZeroRuns(p, 0); !equalRuns(got, want) {
		t.Errorf("NonZeroRuns at 0 = %v, want %v", got, want)
	}
	if got := NonZeroRuns(make([]byte, 3*PageSize), 0); len(got) != 0 {
		t.Errorf("zero buffer: runs %v", got)
	}

	// Pages are the block's: a buffer at an unaligned offset splits at the
	// block's page boundaries, the first and last partial.
	// At off = P+100, q's pages are [0, P-100) (the end of block page 1),
	// then [P-100, 2P-100), [2P-100, 3P-100) and the partial [3P-100, 3P).
	off := int64(PageSize + 100)
	q := make([]byte, 3*PageSize)
	q[PageSize-100] = 1
	q[2*PageSize+50] = 2
	want = []Run{{PageSize - 100, 3*PageSize - 100}}
	if got := NonZeroRuns(q, off); !equalRuns(got, want) {
		t.Errorf("NonZeroRuns at %d = %v, want %v", off, got, want)
	}
	q[3*PageSize-1] = 3
	want = []Run{{PageSize - 100, 3 * PageSize}}
	if got := NonZeroRuns(q, off); !equalRuns(got, want) {
		t.Errorf("NonZeroRuns at %d with the tail set = %v, want %v", off, got, want)
	}
}

func equalRuns(a, b []Run) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestIsZero(t *testing.T) {
	for _, n := range []int{0, 1, 7, 8, PageSize - 1, PageSize, 3*PageSize + 5} {
		p := make([]byte, n)
		if !IsZero(p) {
			t.Errorf("%d zero bytes: not zero", n)
		}
		if n > 0 {
			p[n-1] = 1
			if IsZero(p) {
				t.Errorf("%d bytes with the last set: zero", n)
			}
		}
	}
}

func TestCRC32C(t *testing.T) {
	// The CRC32C check value of "123456789" (Castagnoli).
	if got := CRC32C([]byte("123456789")); got != 0xe3069283 {
		t.Errorf("CRC32C(123456789) = %08x, want e3069283", got)
	}
	p := make([]byte, 2*PageSize+300)
	p[0] = 9
	want := crc32.Checksum(p, crc32.MakeTable(crc32.Castagnoli))
	if got := UpdateCRC32CZeros(UpdateCRC32C(0, p[:1]), uint64(len(p)-1)); got != want {
		t.Errorf("CRC32C summed over a zero run = %08x, want %08x", got, want)
	}
	if got := UpdateCRC32C(UpdateCRC32C(0, p[:PageSize+1]), p[PageSize+1:]); got != want {
		t.Errorf("CRC32C in two updates = %08x, want %08x", got, want)
	}
}

// PageSize is this machine's page, or in a test binary the one TestPageSizeEnv names.
func TestPageSizeProbed(t *testing.T) {
	want := os.Getpagesize()
	if v := os.Getenv(TestPageSizeEnv); v != "" {
		want, _ = strconv.Atoi(v)
	}
	if PageSize != want {
		t.Fatalf("PageSize = %d, want %d", PageSize, want)
	}
}

// TestNonZeroRunsInStretches checks that scanning a buffer in stretches,
// split at any pages, finds the runs of one scan of the whole.
func TestNonZeroRunsInStretches(t *testing.T) {
	page := PageSize
	buf := make([]byte, 13*page+100)
	for _, p := range []int{1, 2, 3, 6, 7, 11, 12} {
		buf[p*page+page/2] = 1
	}
	want := NonZeroRuns(buf, 0)
	for _, cuts := range [][]int{{3}, {1, 2, 3}, {2, 7, 12}, {6, 7}, {}, {4, 5, 8, 9, 10, 11}} {
		var runs []Run
		from := 0
		for _, c := range cuts {
			runs = AppendNonZeroRuns(runs, buf, from, c*page)
			from = c * page
		}
		runs = AppendNonZeroRuns(runs, buf, from, len(buf))
		if !slices.Equal(runs, want) {
			t.Errorf("cut at pages %v: runs %v, want %v", cuts, runs, want)
		}
	}
}
