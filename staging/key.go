package staging

import "github.com/kvtierfs/kvtierfs/tiers/block"

// chainID names the blocks that can form chains: one engine tier directory
// and one KV group. Blocks of different groups never share a chain, even
// when they hold the same chunk.
type chainID struct {
	tier  string
	group int
}

// chainOf is the chain a block can belong to.
func chainOf(ref block.Ref) chainID {
	return chainID{tier: ref.Name.Tier, group: ref.Name.Group}
}
