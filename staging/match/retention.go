package match

import (
	"fmt"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
)

// The engine stores a windowed group's chunks only where a lookup can use
// them: vLLM's store path skips chunks by their position chunk % acc within
// an alignment segment of acc chunks. A sliding group hits at a segment end
// with a run of tail chunks, {acc-tail … acc-1}. An unverified EAGLE group
// needs tail+1 consecutive chunks, one past the hit, so it also needs the
// head of the next segment: {0} ∪ {acc-tail … acc-1} forms the run
// acc-tail … acc across the boundary, and the dropped chunk is the one at
// 0 (mod acc), leaving the hit on a segment end. The engine's stock filter
// keeps {acc-tail … acc-1} for EAGLE groups too, so their runs are only tail
// long, the EAGLE group never hits and, ANDed, vetoes every hit (DESIGN §3,
// failure 1; 502 GB written, 0 read in the field).

// Retained reports whether the engine should store the chunk at index chunk
// (>= 0) of a group: every chunk for full attention; for a sliding group the
// positions {acc-tail … acc-1} of each segment of acc chunks; for an EAGLE
// group {0} ∪ {acc-tail … acc-1}. Windowed groups need 0 < tail <= acc (as
// Validate requires); Retained panics otherwise.
func Retained(kind ctlabi.GroupKind, tail, acc, chunk int) bool {
	if kind == ctlabi.KindFull {
		return true
	}
	position := segmentPosition(kind, tail, acc, chunk)
	return position >= acc-tail || (kind == ctlabi.KindEagle && position == 0)
}

// StockRetained is the engine's original store filter, kept to reproduce the
// field failure: every chunk for full attention, and {acc-tail … acc-1} of
// each segment for every windowed group, EAGLE included. Its arguments are
// those of Retained.
func StockRetained(kind ctlabi.GroupKind, tail, acc, chunk int) bool {
	if kind == ctlabi.KindFull {
		return true
	}
	return segmentPosition(kind, tail, acc, chunk) >= acc-tail
}

// segmentPosition returns chunk % acc for a windowed group, after checking
// the arguments.
func segmentPosition(kind ctlabi.GroupKind, tail, acc, chunk int) int {
	if kind != ctlabi.KindSliding && kind != ctlabi.KindEagle {
		panic(fmt.Sprintf("staging: retention for unknown group kind %v", kind))
	}
	if tail <= 0 || acc < tail || chunk < 0 {
		panic(fmt.Sprintf("staging: retention for a %v group needs 0 < tail <= acc and chunk >= 0, got tail %d, acc %d, chunk %d", kind, tail, acc, chunk))
	}
	return chunk % acc
}
