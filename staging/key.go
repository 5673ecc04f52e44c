package staging

import "github.com/kvtierfs/kvtierfs/tiers/block"

// Key names a block as the filesystem sees it: the block file's path
// relative to the store root, slash separated, no leading slash, e.g.
// "DeepSeek_abc123def456_r0/3fa/9c_g0/3fa9c….bin" (block.Name.Path).
type Key string

// chainID names the blocks that can form chains: one engine tier directory
// and one KV group. Blocks of different groups never share a chain, even
// when they hold the same chunk.
type chainID struct {
	tier  string
	group int
}

// parseKey returns the tier and group of a block key (the store's own
// reading of the layout, block.Parse), or false for any other path
// (config.json, probes, tmp files, directories).
func parseKey(key Key) (chainID, bool) {
	kind, name := block.Parse(string(key))
	if kind != block.File {
		return chainID{}, false
	}
	return chainID{tier: name.Tier, group: name.Group}, true
}
