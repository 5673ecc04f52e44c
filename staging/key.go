package staging

import (
	"strconv"
	"strings"
)

// Key names a block as the filesystem sees it: the block file's path
// relative to the store root, slash separated, no leading slash, e.g.
// "DeepSeek_abc123def456_r0/3fa/9c_g0/3fa9c….bin" (see BlockPath).
type Key string

// chainID names the blocks that can form chains: one engine tier directory
// and one KV group. Blocks of different groups never share a chain, even
// when they hold the same chunk.
type chainID struct {
	tier  string
	group int
}

// parseKey returns the tier and group of a block key laid out as
// <tier>/<h[0:3]>/<h[3:5]>_g<group>/<h>.bin, or false for any other path
// (config.json, probes, tmp files, directories). Directory names other than
// the `_g<N>` suffix are treated as opaque, as DESIGN §2 asks.
func parseKey(key Key) (chainID, bool) {
	parts := strings.Split(string(key), "/")
	if len(parts) != 4 || parts[0] == "" || parts[1] == "" {
		return chainID{}, false
	}
	if stem, ok := strings.CutSuffix(parts[3], ".bin"); !ok || stem == "" {
		return chainID{}, false
	}
	group, ok := groupOfDir(parts[2])
	if !ok {
		return chainID{}, false
	}
	return chainID{tier: parts[0], group: group}, true
}

// groupOfDir returns N for a directory named <prefix>_g<N>, N decimal.
func groupOfDir(dir string) (int, bool) {
	i := strings.LastIndex(dir, "_g")
	if i < 0 {
		return 0, false
	}
	digits := dir[i+len("_g"):]
	if digits == "" || strings.TrimLeft(digits, "0123456789") != "" {
		return 0, false
	}
	group, err := strconv.Atoi(digits)
	return group, err == nil
}
