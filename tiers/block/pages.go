package block

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"testing"
)

// PageSize is this machine's page size, probed (os.Getpagesize): 4 KiB on
// x86-64, 4, 16 or 64 KiB on arm64 kernels. It is the granularity of block
// sizes (vLLM's SharedOffloadRegion asserts that a row is a multiple of
// mmap.PAGESIZE), of the alignment of direct I/O buffers, of zero detection
// (an all-zero page of a block is a hole in the store file and is never sent
// to a peer) and of the pages sampled from a written block.
var PageSize = probePageSize()

// TestPageSizeEnv, in a test binary's environment (and only there), sets
// PageSize to a larger power of two, e.g. 65536 as on a 64 KiB-page Grace
// kernel, so that the rules are tested at that page size on this machine.
const TestPageSizeEnv = "KVTIERFS_TEST_PAGE_SIZE"

// probePageSize is this machine's page size, or a test binary's TestPageSizeEnv.
func probePageSize() int {
	page := os.Getpagesize()
	v := os.Getenv(TestPageSizeEnv)
	if v == "" || !testing.Testing() {
		return page
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < page || n&(n-1) != 0 {
		panic(fmt.Sprintf("%s=%q: want a power of two no smaller than this machine's page size, %d", TestPageSizeEnv, v, page))
	}
	return n
}

// zeros is a run of zero bytes to compare and checksum against.
var zeros [64 << 10]byte

// IsZero reports whether every byte of p is zero.
func IsZero(p []byte) bool {
	for len(p) > 0 {
		n := min(len(p), len(zeros))
		if !bytes.Equal(p[:n], zeros[:n]) {
			return false
		}
		p = p[n:]
	}
	return true
}

// Run is a byte range [Start, End) of a buffer.
type Run struct{ Start, End int }

// NonZeroRuns splits p, which lies at offset off of a block, into runs of the
// pages (of the block, so the first and last may be partial in p) that hold a
// non-zero byte, adjacent pages merged. A non-zero page is usually told at
// its first bytes, so this reads little more than the zero pages.
func NonZeroRuns(p []byte, off int64) []Run {
	var runs []Run
	for start := 0; start < len(p); {
		end := min(len(p), start+PageSize-int((off+int64(start))%int64(PageSize)))
		if !IsZero(p[start:end]) {
			if len(runs) > 0 && runs[len(runs)-1].End == start {
				runs[len(runs)-1].End = end
			} else {
				runs = append(runs, Run{start, end})
			}
		}
		start = end
	}
	return runs
}

// AppendNonZeroRuns appends to runs, those of buf[:from], the runs of the
// non-zero pages of buf[from:to], buf starting at a page of the block,
// merging a run that goes on from the last: a buffer scanned in stretches
// gets the runs of one scan of the whole.
func AppendNonZeroRuns(runs []Run, buf []byte, from, to int) []Run {
	for _, r := range NonZeroRuns(buf[from:to], int64(from)) {
		r.Start, r.End = r.Start+from, r.End+from
		if n := len(runs); n > 0 && runs[n-1].End == r.Start {
			runs[n-1].End = r.End
		} else {
			runs = append(runs, r)
		}
	}
	return runs
}
