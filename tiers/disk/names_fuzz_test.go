package disk

import (
	"path"
	"strconv"
	"strings"
	"testing"
)

// FuzzClassify checks what every caller of Classify relies on, for any path:
// no panic; a Block is `<tier>/…/<anything>_g<group>/<hash>.bin` with the
// group and hash it reports; a BlockTmp is `<hash>.bin_<…>.tmp` beside the
// block it names, which classifies as that same block. The seed corpus is
// in testdata/fuzz/FuzzClassify; `go test` runs only the seeds, `go test
// -fuzz FuzzClassify ./tiers/disk` explores.
func FuzzClassify(f *testing.F) {
	h := strings.Repeat("0123456789abcdef", 4)
	for _, seed := range []string{
		"t/012/34_g0/" + h + ".bin",
		"t/012/34_g7/" + h + ".bin_123.tmp",
		"t/012/34_g/" + h + ".bin",
		"t/012/34_g99999999999999999999/" + h + ".bin",
		"/012/34_g0/" + h + ".bin",
		"_g0/" + h + ".bin",
		"t/012/34_g0/" + strings.ToUpper(h) + ".bin",
		"t/012/34_g0/.bin_1.tmp",
		"config.json",
		"",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, rel string) {
		kind, name := Classify(rel)
		dir, file := path.Split(rel)
		switch kind {
		case OtherFile, MalformedBlock:
			if name != (BlockName{}) {
				t.Fatalf("Classify(%q) = %v with a name %+v", rel, kind, name)
			}
			return
		case Block:
			if file != name.Hash+".bin" {
				t.Fatalf("Classify(%q): block file %q is not its hash %q + .bin", rel, file, name.Hash)
			}
		case BlockTmp:
			if !strings.HasPrefix(file, name.Hash+".bin_") || !strings.HasSuffix(file, ".tmp") {
				t.Fatalf("Classify(%q): tmp file %q is not %q.bin_….tmp", rel, file, name.Hash)
			}
			if k, n := Classify(dir + name.Hash + ".bin"); k != Block || n != name {
				t.Fatalf("Classify(%q) = tmp of %+v, but its block classifies as %v %+v", rel, name, k, n)
			}
		default:
			t.Fatalf("Classify(%q) = unknown kind %d", rel, kind)
		}
		if !isHash(name.Hash) {
			t.Fatalf("Classify(%q): hash %q is not lowercase hex of a hash's length", rel, name.Hash)
		}
		if name.Tier == "" || !strings.HasPrefix(rel, name.Tier+"/") || strings.Contains(name.Tier, "/") {
			t.Fatalf("Classify(%q): tier %q is not the first component", rel, name.Tier)
		}
		groupDir := path.Base(strings.TrimSuffix(dir, "/"))
		if name.Group < 0 || !strings.HasSuffix(groupDir, "_g"+strconv.Itoa(name.Group)) && !hasPaddedGroup(groupDir, name.Group) {
			t.Fatalf("Classify(%q): group %d is not the _g<N> suffix of %q", rel, name.Group, groupDir)
		}
		if g, ok := GroupOfDir(groupDir); !ok || g != name.Group {
			t.Fatalf("Classify(%q): group %d, GroupOfDir(%q) = %d, %v", rel, name.Group, groupDir, g, ok)
		}
	})
}

// hasPaddedGroup reports whether dir ends with `_g` and group written with leading zeros.
func hasPaddedGroup(dir string, group int) bool {
	i := strings.LastIndex(dir, "_g")
	if i < 0 {
		return false
	}
	digits := strings.TrimLeft(dir[i+2:], "0")
	return digits == strconv.Itoa(group) || digits == "" && group == 0
}
