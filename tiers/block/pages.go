package block

import "bytes"

// PageSize is the granularity of block sizes (the engine's rows are page
// multiples) and of zero detection: an all-zero page of a block is a hole in
// the store file and is never sent to a peer.
const PageSize = 4096

// zeroPage is a page of zeros to compare and checksum against.
var zeroPage [PageSize]byte

// IsZero reports whether every byte of p is zero.
func IsZero(p []byte) bool {
	for len(p) > 0 {
		n := min(len(p), PageSize)
		if !bytes.Equal(p[:n], zeroPage[:n]) {
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
		end := min(len(p), start+PageSize-int((off+int64(start))%PageSize))
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
