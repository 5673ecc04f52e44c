package block

import (
	"strconv"
	"strings"
)

// DirLevel is which directory of the block layout a store-relative path
// names. A key's lookup walks `<tier>/<h[0:3]>/<h[3:5]>_g<N>/<h>.bin`, and
// most absent keys end at one of the two directories below the tier.
type DirLevel int

const (
	// NotLayoutDir is any path that names neither directory.
	NotLayoutDir DirLevel = iota
	// PrefixDir is `<tier>/<h[0:3]>`: three lowercase hex digits.
	PrefixDir
	// GroupDir is `<tier>/<h[0:3]>/<h[3:5]>_g<N>`: two lowercase hex digits,
	// `_g` and the KV cache group in decimal.
	GroupDir
)

// Dir is a directory of the block layout.
type Dir struct {
	Level DirLevel
	// Tier is the path's first component; empty for NotLayoutDir.
	Tier string
	// Group is the KV cache group of a GroupDir; -1 otherwise.
	Group int
}

// ParseDir tells which directory of the block layout rel (slash separated,
// no leading slash) names. Unlike Parse, which takes the directories above a
// block as opaque, it holds both to the grammar the engine writes.
func ParseDir(rel string) Dir {
	none := Dir{Level: NotLayoutDir, Group: -1}
	tier, rest, ok := strings.Cut(rel, "/")
	if !ok || tier == "" {
		return none
	}
	prefix, group, deeper := strings.Cut(rest, "/")
	if !isLowerHex(prefix, 3) {
		return none
	}
	if !deeper {
		return Dir{Level: PrefixDir, Tier: tier, Group: -1}
	}
	if len(group) < 5 || !isLowerHex(group[:2], 2) || group[2:4] != "_g" {
		return none
	}
	for _, c := range group[4:] {
		if c < '0' || c > '9' {
			return none
		}
	}
	g, err := strconv.Atoi(group[4:])
	if err != nil {
		return none
	}
	return Dir{Level: GroupDir, Tier: tier, Group: g}
}

// isLowerHex reports whether s is n lowercase hex digits.
func isLowerHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for i := 0; i < n; i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
