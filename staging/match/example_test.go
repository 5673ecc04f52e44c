package match_test

import (
	"fmt"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
	"github.com/kvtierfs/kvtierfs/staging/match"
	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// A batched match: the engine's lookup of a whole prompt in one request,
// answered under its rules. Written to MOUNTPOINT/.kvtier/match, the request
// is answered from the mount's index; here a set stands in for the index.
func ExampleHit() {
	keys := []string{
		"3fa90000000000000000000000000001", "3fa90000000000000000000000000002",
		"3fa90000000000000000000000000003", "3fa90000000000000000000000000004",
	}
	stored := map[string]bool{keys[0]: true, keys[1]: true, keys[3]: true}
	req := ctlabi.MatchRequest{Tier: "DeepSeek_0123456789ab_r0", Groups: []ctlabi.GroupSpec{
		{Group: 0, Kind: ctlabi.KindFull, Keys: keys},
	}}
	res, err := match.Hit(req, func(group int, key string) bool { return stored[key] })
	fmt.Println(res.HitChunks, res.PerGroup, err)
	fmt.Println(block.Name{Tier: req.Tier, Group: 0, Hash: keys[0]}.Path()) // where the engine stores the first key
	// Output:
	// 2 [2] <nil>
	// DeepSeek_0123456789ab_r0/3fa/90_g0/3fa90000000000000000000000000001.bin
}
