package match

import (
	"fmt"
	"slices"
	"testing"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
)

// retainedChunks lists the chunks in [0, n) that rule keeps.
func retainedChunks(rule func(kind ctlabi.GroupKind, tail, acc, chunk int) bool, kind ctlabi.GroupKind, tail, acc, n int) []int {
	var kept []int
	for chunk := range n {
		if rule(kind, tail, acc, chunk) {
			kept = append(kept, chunk)
		}
	}
	return kept
}

func TestRetentionSets(t *testing.T) {
	type rule = func(kind ctlabi.GroupKind, tail, acc, chunk int) bool
	every := func(n int) []int {
		all := make([]int, n)
		for i := range all {
			all[i] = i
		}
		return all
	}
	tests := []struct {
		name      string
		rule      rule
		kind      ctlabi.GroupKind
		tail, acc int
		want      []int
	}{
		{"eagle keeps the segment head and tail", Retained, ctlabi.KindEagle, 4, 16, []int{0, 12, 13, 14, 15, 16, 28, 29, 30, 31, 32, 44, 45, 46, 47}},
		{"sliding keeps the segment tail", Retained, ctlabi.KindSliding, 4, 16, []int{12, 13, 14, 15, 28, 29, 30, 31, 44, 45, 46, 47}},
		{"full keeps everything", Retained, ctlabi.KindFull, 0, 0, every(48)},
		{"eagle with acc = tail keeps everything", Retained, ctlabi.KindEagle, 3, 3, every(48)},
		{"stock eagle keeps only the segment tail", StockRetained, ctlabi.KindEagle, 4, 16, []int{12, 13, 14, 15, 28, 29, 30, 31, 44, 45, 46, 47}},
		{"stock sliding is the same as fixed", StockRetained, ctlabi.KindSliding, 4, 16, []int{12, 13, 14, 15, 28, 29, 30, 31, 44, 45, 46, 47}},
		{"stock full keeps everything", StockRetained, ctlabi.KindFull, 0, 0, every(48)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := retainedChunks(tt.rule, tt.kind, tt.tail, tt.acc, 48); !slices.Equal(got, tt.want) {
				t.Errorf("kept %v, want %v", got, tt.want)
			}
		})
	}
}

// storeAlone stores one windowed group of n chunks by rule and returns the
// hit Hit gives it.
func storeAlone(t *testing.T, rule func(kind ctlabi.GroupKind, tail, acc, chunk int) bool, kind ctlabi.GroupKind, tail, acc, n int) int {
	t.Helper()
	store := newBlockStore()
	keys := testKeys(n)
	for chunk, key := range keys {
		if rule(kind, tail, acc, chunk) {
			store.blocks[blockRef{0, key}] = true
		}
	}
	req := ctlabi.MatchRequest{Tier: "t", Groups: []ctlabi.GroupSpec{{Group: 0, Kind: kind, Tail: tail, Acc: acc, Keys: keys}}}
	return runMatch(t, req, store).HitChunks
}

// TestRetainedChunksHitAtSegmentEnds checks, for every small geometry, that
// chunks stored by Retained let the group hit at the last segment end the
// engine can reach, and that StockRetained leaves an EAGLE group no hit.
func TestRetainedChunksHitAtSegmentEnds(t *testing.T) {
	for tail := 1; tail <= 5; tail++ {
		for acc := tail; acc <= tail+8; acc++ {
			for n := 1; n <= 3*acc+2; n++ {
				name := fmt.Sprintf("tail %d acc %d chunks %d", tail, acc, n)

				// Sliding: the run acc-tail … acc-1 ends each segment;
				// with acc = tail everything is stored.
				wantSliding := acc * (n / acc)
				if acc == tail {
					wantSliding = n
				}
				if got := storeAlone(t, Retained, ctlabi.KindSliding, tail, acc, n); got != wantSliding {
					t.Errorf("%s: sliding hit %d, want %d", name, got, wantSliding)
				}

				// EAGLE: the run acc-tail … acc crosses into the next
				// segment's head, which must exist; the drop leaves a
				// segment end. With acc <= tail+1 everything is stored and
				// only the last chunk is dropped.
				wantEagle := acc * ((n - 1) / acc)
				if acc <= tail+1 {
					wantEagle = n - 1
				}
				if got := storeAlone(t, Retained, ctlabi.KindEagle, tail, acc, n); got != wantEagle {
					t.Errorf("%s: eagle hit %d, want %d", name, got, wantEagle)
				}

				// Stock: runs of exactly tail never satisfy tail+1.
				wantStock := 0
				if acc == tail {
					wantStock = n - 1
				}
				if got := storeAlone(t, StockRetained, ctlabi.KindEagle, tail, acc, n); got != wantStock {
					t.Errorf("%s: stock eagle hit %d, want %d", name, got, wantStock)
				}
			}
		}
	}
}

func TestRetentionRejectsBadArguments(t *testing.T) {
	tests := []struct {
		name             string
		kind             ctlabi.GroupKind
		tail, acc, chunk int
	}{
		{"zero tail", ctlabi.KindSliding, 0, 16, 3},
		{"acc below tail", ctlabi.KindEagle, 4, 3, 3},
		{"negative chunk", ctlabi.KindEagle, 4, 16, -1},
		{"unknown kind", ctlabi.GroupKind(0), 4, 16, 3},
	}
	for _, tt := range tests {
		for name, rule := range map[string]func(ctlabi.GroupKind, int, int, int) bool{"Retained": Retained, "StockRetained": StockRetained} {
			t.Run(tt.name+"/"+name, func(t *testing.T) {
				defer func() {
					if recover() == nil {
						t.Errorf("%s(%v, %d, %d, %d) did not panic", name, tt.kind, tt.tail, tt.acc, tt.chunk)
					}
				}()
				rule(tt.kind, tt.tail, tt.acc, tt.chunk)
			})
		}
	}
}
