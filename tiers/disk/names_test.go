package disk

import (
	"strings"
	"testing"
)

func TestClassify(t *testing.T) {
	h64 := hashHex(1, 64)
	h32 := hashHex(2, 32)
	tier := "Qwen_Qwen3-8B_0123456789ab_r0"
	dir64 := tier + "/" + h64[:3] + "/" + h64[3:5] + "_g0"
	dir32 := tier + "/" + h32[:3] + "/" + h32[3:5] + "_g3"
	upper := strings.ToUpper(h64)
	nonHex := "g" + h64[1:]

	tests := []struct {
		rel  string
		kind NameKind
		name BlockName
	}{
		// Well-formed blocks: sha256 (64 hex) and xxhash-128 (32 hex) variants.
		{dir64 + "/" + h64 + ".bin", Block, BlockName{Tier: tier, Group: 0, Hash: h64}},
		{dir32 + "/" + h32 + ".bin", Block, BlockName{Tier: tier, Group: 3, Hash: h32}},
		{"t/abc/de_g12/" + h32 + ".bin", Block, BlockName{Tier: "t", Group: 12, Hash: h32}},
		{"t/abc/de_g007/" + h32 + ".bin", Block, BlockName{Tier: "t", Group: 7, Hash: h32}},
		// The directory names are opaque: only the _g<N> suffix matters.
		{"t/zzz/anything_g1/" + h32 + ".bin", Block, BlockName{Tier: "t", Group: 1, Hash: h32}},

		// The engine's tmp files beside a block.
		{dir64 + "/" + h64 + ".bin_123456789.tmp", BlockTmp, BlockName{Tier: tier, Group: 0, Hash: h64}},
		{dir32 + "/" + h32 + ".bin_9.tmp", BlockTmp, BlockName{Tier: tier, Group: 3, Hash: h32}},
		// A tmp whose hash part is not a hash, or with no .bin_ part, is just a file.
		{dir64 + "/" + upper + ".bin_1.tmp", OtherFile, BlockName{}},
		{dir64 + "/" + nonHex + ".bin_1.tmp", OtherFile, BlockName{}},
		{dir64 + "/" + h64 + ".tmp", OtherFile, BlockName{}},
		{dir64 + "/" + h64 + ".bin.tmp", OtherFile, BlockName{}},

		// .bin files under a _g dir whose name is not a hash.
		{dir64 + "/" + upper + ".bin", MalformedBlock, BlockName{}},
		{dir64 + "/" + nonHex + ".bin", MalformedBlock, BlockName{}},
		{dir64 + "/" + h64[:63] + ".bin", MalformedBlock, BlockName{}}, // odd length
		{dir64 + "/" + h64[:15] + ".bin", MalformedBlock, BlockName{}}, // too short
		{dir64 + "/" + h64 + h64 + h64 + ".bin", MalformedBlock, BlockName{}},
		{dir64 + "/.bin", MalformedBlock, BlockName{}},
		{dir64 + "/" + h32 + "-x.bin", MalformedBlock, BlockName{}},

		// Not a .bin file under a _g dir.
		{dir64 + "/" + h64, OtherFile, BlockName{}},
		{dir64 + "/" + h64 + ".binx", OtherFile, BlockName{}},
		{dir64 + "/" + h64 + ".bin.bak", OtherFile, BlockName{}},

		// Not under a _g<N> directory.
		{tier + "/" + h64[:3] + "/" + h64[3:5] + "/" + h64 + ".bin", OtherFile, BlockName{}},
		{tier + "/abc/de_g/" + h64 + ".bin", OtherFile, BlockName{}},
		{tier + "/abc/de_gx/" + h64 + ".bin", OtherFile, BlockName{}},
		{tier + "/abc/de_g1x/" + h64 + ".bin", OtherFile, BlockName{}},
		{tier + "/abc/de_g-1/" + h64 + ".bin", OtherFile, BlockName{}},
		{tier + "/abc/de_g99999999999999999999999/" + h64 + ".bin", OtherFile, BlockName{}},
		{tier + "/abc_g0/de/" + h64 + ".bin", OtherFile, BlockName{}},
		{tier + "/config.json", OtherFile, BlockName{}},
		{strings.TrimSuffix(tier, "_r0") + "/config.json", OtherFile, BlockName{}},
		{tier + "/.o_direct_probe_123.tmp", OtherFile, BlockName{}},
		{tier + "/.xattr_probe_123.tmp", OtherFile, BlockName{}},

		// Root-level files.
		{h64 + ".bin", OtherFile, BlockName{}},
		{h64 + ".bin_1.tmp", OtherFile, BlockName{}},
		{"config.json", OtherFile, BlockName{}},
		{".o_direct_probe_42.tmp", OtherFile, BlockName{}},
		{"", OtherFile, BlockName{}},
	}
	for _, tc := range tests {
		kind, name := Classify(tc.rel)
		if kind != tc.kind || name != tc.name {
			t.Errorf("Classify(%q) = %v, %+v; want %v, %+v", tc.rel, kind, name, tc.kind, tc.name)
		}
	}
}

func TestGroupOfDir(t *testing.T) {
	tests := []struct {
		dir   string
		group int
		ok    bool
	}{
		{"de_g0", 0, true},
		{"de_g1", 1, true},
		{"de_g42", 42, true},
		{"a_g1_g2", 2, true},
		{"_g5", 5, true},
		{"de_g", 0, false},
		{"de", 0, false},
		{"de_gx", 0, false},
		{"de_g1x", 0, false},
		{"de_g+1", 0, false},
		{"de_g-1", 0, false},
		{"de_g 1", 0, false},
		{"de_g99999999999999999999999", 0, false},
		{"", 0, false},
		{".", 0, false},
	}
	for _, tc := range tests {
		g, ok := GroupOfDir(tc.dir)
		if g != tc.group || ok != tc.ok {
			t.Errorf("GroupOfDir(%q) = %d, %v; want %d, %v", tc.dir, g, ok, tc.group, tc.ok)
		}
	}
}
