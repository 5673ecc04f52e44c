package disk

import (
	"path"
	"strconv"
	"strings"
)

// BlockName describes a path that names a KV block in the engine's tier layout:
// <tier>/<h[0:3]>/<h[3:5]>_g<group>/<h>.bin (DESIGN §2).
type BlockName struct {
	// Tier is the first path component, the engine's per-model directory.
	Tier string
	// Group is the KV cache group taken from the `_g<N>` directory name.
	Group int
	// Hash is the chunk hash in lowercase hex.
	Hash string
}

// NameKind classifies a path relative to the store root.
type NameKind int

const (
	// OtherFile is any path outside the block layout (config.json, probes, …).
	OtherFile NameKind = iota
	// Block is a well-formed `<hex>.bin` under a `_g<N>` directory.
	Block
	// BlockTmp is the engine's staging file `<hex>.bin_<random>.tmp` beside a block.
	BlockTmp
	// MalformedBlock is a `.bin` file under a `_g<N>` directory whose name is not a hash.
	MalformedBlock
)

// Hash lengths accepted as block names: xxhash-128 and sha256 variants write 32
// and 64 hex characters; 16 covers 64-bit variants.
const (
	minHashLen = 16
	maxHashLen = 128
)

// tmpSuffix is the suffix of every staging file the engine writes.
const tmpSuffix = ".tmp"

// GroupOfDir returns the KV group of a directory named `<anything>_g<N>`.
func GroupOfDir(dir string) (int, bool) {
	i := strings.LastIndex(dir, "_g")
	if i < 0 || i+2 == len(dir) {
		return 0, false
	}
	digits := dir[i+2:]
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	g, err := strconv.Atoi(digits)
	if err != nil {
		return 0, false
	}
	return g, true
}

// isHash reports whether s is an even-length lowercase hex string of a plausible hash length.
func isHash(s string) bool {
	if len(s) < minHashLen || len(s) > maxHashLen || len(s)%2 != 0 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// Classify tells what a store-relative path (slash separated, no leading slash)
// names, and for blocks and their tmp files the block it belongs to.
func Classify(rel string) (NameKind, BlockName) {
	dir, file := path.Split(rel)
	dir = strings.TrimSuffix(dir, "/")
	group, ok := GroupOfDir(path.Base(dir))
	if !ok || dir == "" {
		return OtherFile, BlockName{}
	}
	tier, _, _ := strings.Cut(rel, "/")
	if tier == "" {
		return OtherFile, BlockName{}
	}
	if strings.HasSuffix(file, tmpSuffix) {
		i := strings.Index(file, ".bin_")
		if i < 0 || !isHash(file[:i]) {
			return OtherFile, BlockName{}
		}
		return BlockTmp, BlockName{Tier: tier, Group: group, Hash: file[:i]}
	}
	hash, isBin := strings.CutSuffix(file, ".bin")
	if !isBin {
		return OtherFile, BlockName{}
	}
	if !isHash(hash) {
		return MalformedBlock, BlockName{}
	}
	return Block, BlockName{Tier: tier, Group: group, Hash: hash}
}
