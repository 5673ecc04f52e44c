package match

import (
	"fmt"
	"strconv"
	"testing"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
)

// BenchmarkMatchManyPasses is the costliest request shape found for Hit:
// two one-chunk windows whose stored chunks alternate, so each pass of the
// engine's loop lowers the hit by two and the next pass looks every windowed
// group up again, beside a windowed group as long as the prompt that is all
// stored, each at MaxRequestKeys keys in all. Walking that group's known run
// on every pass took 5.2 s per request on the development machine; the skip
// chains make it 0.07 s (go test -bench ManyPasses ./staging).
func BenchmarkMatchManyPasses(b *testing.B) {
	n := ctlabi.MaxRequestKeys / 3
	keys := func(group int) []string {
		k := make([]string, n)
		for i := range k {
			k[i] = fmt.Sprintf("%02x%014x", group, i)
		}
		return k
	}
	req := ctlabi.MatchRequest{Tier: "t", Groups: []ctlabi.GroupSpec{
		{Group: 0, Kind: ctlabi.KindSliding, Tail: n, Acc: n, Keys: keys(0)},
		{Group: 1, Kind: ctlabi.KindSliding, Tail: 1, Acc: 1, Keys: keys(1)},
		{Group: 2, Kind: ctlabi.KindSliding, Tail: 1, Acc: 1, Keys: keys(2)},
	}}
	present := func(group int, key string) bool {
		chunk, _ := strconv.ParseUint(key[2:], 16, 64)
		return group == 0 || int(chunk%2) == group-1
	}
	for b.Loop() {
		if _, err := Hit(req, present); err != nil {
			b.Fatal(err)
		}
	}
}
