package block

import (
	"path"
	"strconv"
	"strings"
)

// Name is a block as the engine's tier layout names it:
// <tier>/<h[0:3]>/<h[3:5]>_g<group>/<h>.bin (DESIGN §2 of the shared design).
type Name struct {
	// Tier is the first path component, the engine's per-model directory.
	Tier string
	// Group is the KV cache group taken from the `_g<N>` directory name.
	Group int
	// Hash is the chunk hash in lowercase hex.
	Hash string
}

// Kind is what a store-relative path names.
type Kind int

const (
	// OtherFile is any path outside the block layout (config.json, probes, …).
	OtherFile Kind = iota
	// File is a well-formed block file `<hex>.bin` under a `_g<N>` directory.
	File
	// TmpFile is the engine's staging file `<hex>.bin_<random>.tmp` beside a block.
	TmpFile
	// Malformed is a `.bin` file under a `_g<N>` directory whose name is not a hash.
	Malformed
)

// Hash lengths accepted as block names: xxhash-128 and sha256 variants write 32
// and 64 hex characters; 16 covers 64-bit variants.
const (
	MinHashLen = 16
	MaxHashLen = 128
)

const (
	// fileSuffix ends every block file's name.
	fileSuffix = ".bin"
	// tmpInfix separates a tmp file's block name from the engine's random part.
	tmpInfix = ".bin_"
	// tmpSuffix ends every tmp file the engine writes.
	tmpSuffix = ".tmp"
)

// Path is the block's path relative to the store root as the engine lays it
// out. The hash must be a valid one (IsHash).
func (n Name) Path() string {
	return n.Tier + "/" + n.Hash[:3] + "/" + n.Hash[3:5] + "_g" + strconv.Itoa(n.Group) + "/" + n.Hash + fileSuffix
}

// TmpPath is the path of a tmp file the block is written to before the rename
// that publishes it; unique tells concurrent writers apart.
func (n Name) TmpPath(unique string) string {
	return strings.TrimSuffix(n.Path(), fileSuffix) + tmpInfix + unique + tmpSuffix
}

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

// IsHash reports whether s is an even-length lowercase hex string of a plausible hash length.
func IsHash(s string) bool {
	if len(s) < MinHashLen || len(s) > MaxHashLen || len(s)%2 != 0 {
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

// Parse tells what a store-relative path (slash separated, no leading slash)
// names, and for block files and their tmp files the block they belong to.
// The directories above the `_g<N>` one are not checked against the hash:
// only the tier (first component), the group and the file name count.
func Parse(rel string) (Kind, Name) {
	dir, file := path.Split(rel)
	dir = strings.TrimSuffix(dir, "/")
	group, ok := GroupOfDir(path.Base(dir))
	if !ok || dir == "" {
		return OtherFile, Name{}
	}
	tier, _, _ := strings.Cut(rel, "/")
	if tier == "" {
		return OtherFile, Name{}
	}
	if strings.HasSuffix(file, tmpSuffix) {
		i := strings.Index(file, tmpInfix)
		if i < 0 || !IsHash(file[:i]) {
			return OtherFile, Name{}
		}
		return TmpFile, Name{Tier: tier, Group: group, Hash: file[:i]}
	}
	hash, isBin := strings.CutSuffix(file, fileSuffix)
	if !isBin {
		return OtherFile, Name{}
	}
	if !IsHash(hash) {
		return Malformed, Name{}
	}
	return File, Name{Tier: tier, Group: group, Hash: hash}
}

// Ref is one block file: its store-relative path as the engine wrote it (the
// directories above `_g<N>` are opaque, so the path is kept, not rebuilt) and
// the name parsed from it. The FUSE adapter parses a path once and hands the
// Ref on; staging and the diagnostics key blocks by it.
type Ref struct {
	Rel  string
	Name Name
}

// ParseRef parses rel as a block file's path (Parse); ok is false for any
// other path.
func ParseRef(rel string) (ref Ref, ok bool) {
	kind, name := Parse(rel)
	return Ref{Rel: rel, Name: name}, kind == File
}

// String is the block file's path.
func (r Ref) String() string { return r.Rel }

// Ref is the name's block file at the path the engine lays it out at.
func (n Name) Ref() Ref { return Ref{Rel: n.Path(), Name: n} }
