package block

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
	"testing"
)

// hashHex is a deterministic lowercase hex hash of n characters.
func hashHex(i, n int) string {
	sum := sha256.Sum256([]byte("block-" + strconv.Itoa(i)))
	return hex.EncodeToString(sum[:])[:n]
}

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
		kind Kind
		name Name
	}{
		// Well-formed blocks: sha256 (64 hex) and xxhash-128 (32 hex) variants.
		{dir64 + "/" + h64 + ".bin", File, Name{Tier: tier, Group: 0, Hash: h64}},
		{dir32 + "/" + h32 + ".bin", File, Name{Tier: tier, Group: 3, Hash: h32}},
		{"t/abc/de_g12/" + h32 + ".bin", File, Name{Tier: "t", Group: 12, Hash: h32}},
		{"t/abc/de_g007/" + h32 + ".bin", File, Name{Tier: "t", Group: 7, Hash: h32}},
		// The directory names are opaque: only the _g<N> suffix matters.
		{"t/zzz/anything_g1/" + h32 + ".bin", File, Name{Tier: "t", Group: 1, Hash: h32}},
		{"t/x/abc/de_g0/" + h32 + ".bin", File, Name{Tier: "t", Group: 0, Hash: h32}}, // at any depth

		// The engine's tmp files beside a block.
		{dir64 + "/" + h64 + ".bin_123456789.tmp", TmpFile, Name{Tier: tier, Group: 0, Hash: h64}},
		{dir32 + "/" + h32 + ".bin_9.tmp", TmpFile, Name{Tier: tier, Group: 3, Hash: h32}},
		// A tmp whose hash part is not a hash, or with no .bin_ part, is just a file.
		{dir64 + "/" + upper + ".bin_1.tmp", OtherFile, Name{}},
		{dir64 + "/" + nonHex + ".bin_1.tmp", OtherFile, Name{}},
		{dir64 + "/" + h64 + ".tmp", OtherFile, Name{}},
		{dir64 + "/" + h64 + ".bin.tmp", OtherFile, Name{}},

		// .bin files under a _g dir whose name is not a hash.
		{dir64 + "/" + upper + ".bin", Malformed, Name{}},
		{dir64 + "/" + nonHex + ".bin", Malformed, Name{}},
		{dir64 + "/" + h64[:63] + ".bin", Malformed, Name{}}, // odd length
		{dir64 + "/" + h64[:15] + ".bin", Malformed, Name{}}, // too short
		{dir64 + "/" + h64 + h64 + h64 + ".bin", Malformed, Name{}},
		{dir64 + "/.bin", Malformed, Name{}},
		{dir64 + "/" + h32 + "-x.bin", Malformed, Name{}},

		// Not a .bin file under a _g dir.
		{dir64 + "/" + h64, OtherFile, Name{}},
		{dir64 + "/" + h64 + ".binx", OtherFile, Name{}},
		{dir64 + "/" + h64 + ".bin.bak", OtherFile, Name{}},

		// Not under a _g<N> directory.
		{tier + "/" + h64[:3] + "/" + h64[3:5] + "/" + h64 + ".bin", OtherFile, Name{}},
		{tier + "/abc/de_g/" + h64 + ".bin", OtherFile, Name{}},
		{tier + "/abc/de_gx/" + h64 + ".bin", OtherFile, Name{}},
		{tier + "/abc/de_g1x/" + h64 + ".bin", OtherFile, Name{}},
		{tier + "/abc/de_g-1/" + h64 + ".bin", OtherFile, Name{}},
		{tier + "/abc/de_g99999999999999999999999/" + h64 + ".bin", OtherFile, Name{}},
		{tier + "/abc_g0/de/" + h64 + ".bin", OtherFile, Name{}},
		{tier + "/config.json", OtherFile, Name{}},
		{strings.TrimSuffix(tier, "_r0") + "/config.json", OtherFile, Name{}},
		{tier + "/.o_direct_probe_123.tmp", OtherFile, Name{}},
		{tier + "/.xattr_probe_123.tmp", OtherFile, Name{}},

		// Root-level files.
		{h64 + ".bin", OtherFile, Name{}},
		{h64 + ".bin_1.tmp", OtherFile, Name{}},
		{"config.json", OtherFile, Name{}},
		{".o_direct_probe_42.tmp", OtherFile, Name{}},
		{"", OtherFile, Name{}},
	}
	for _, tc := range tests {
		kind, name := Parse(tc.rel)
		if kind != tc.kind || name != tc.name {
			t.Errorf("Parse(%q) = %v, %+v; want %v, %+v", tc.rel, kind, name, tc.kind, tc.name)
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

func TestNamePaths(t *testing.T) {
	h := hashHex(3, 64)
	name := Name{Tier: "DeepSeek_abc123def456_r0", Group: 3, Hash: h}
	wantPath := "DeepSeek_abc123def456_r0/" + h[:3] + "/" + h[3:5] + "_g3/" + h + ".bin"
	if got := name.Path(); got != wantPath {
		t.Errorf("Path = %q, want %q", got, wantPath)
	}
	wantTmp := "DeepSeek_abc123def456_r0/" + h[:3] + "/" + h[3:5] + "_g3/" + h + ".bin_7f00.tmp"
	if got := name.TmpPath("7f00"); got != wantTmp {
		t.Errorf("TmpPath = %q, want %q", got, wantTmp)
	}
}

func TestRefs(t *testing.T) {
	h := hashHex(4, 32)
	name := Name{Tier: "T_r0", Group: 2, Hash: h}
	if ref := name.Ref(); ref.Rel != name.Path() || ref.Name != name || ref.String() != name.Path() {
		t.Errorf("%+v.Ref() = %+v", name, ref)
	}
	// A block file keeps the path it was found under: directories are opaque.
	odd := "T_r0/x/y_g2/" + h + ".bin"
	if ref, ok := ParseRef(odd); !ok || ref.Rel != odd || ref.Name != name {
		t.Errorf("ParseRef(%q) = %+v, %v", odd, ref, ok)
	}
	for _, rel := range []string{name.TmpPath("1"), "T_r0/config.json", "T_r0/abc/de_g2/" + strings.ToUpper(h) + ".bin"} {
		if ref, ok := ParseRef(rel); ok {
			t.Errorf("ParseRef(%q) = %+v, a block file", rel, ref)
		}
	}
}
