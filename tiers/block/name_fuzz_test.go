package block

import (
	"path"
	"strconv"
	"strings"
	"testing"
)

// FuzzParse checks what every caller of Parse relies on, for any path: no
// panic; a File is `<tier>/…/<anything>_g<group>/<hash>.bin` with the group
// and hash it reports; a TmpFile is `<hash>.bin_<…>.tmp` beside the block it
// names, which parses as that same block. And the round trip: the name a path
// parses to builds a path (Name.Path, Name.TmpPath) that parses back to the
// same name, and is the path itself when the path was laid out as the engine
// does. The seed corpus is in testdata/fuzz/FuzzParse; `go test` runs only
// the seeds, `go test -fuzz FuzzParse ./tiers/block` explores.
func FuzzParse(f *testing.F) {
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
		kind, name := Parse(rel)
		dir, file := path.Split(rel)
		switch kind {
		case OtherFile, Malformed:
			if name != (Name{}) {
				t.Fatalf("Parse(%q) = %v with a name %+v", rel, kind, name)
			}
			return
		case File:
			if file != name.Hash+".bin" {
				t.Fatalf("Parse(%q): block file %q is not its hash %q + .bin", rel, file, name.Hash)
			}
		case TmpFile:
			if !strings.HasPrefix(file, name.Hash+".bin_") || !strings.HasSuffix(file, ".tmp") {
				t.Fatalf("Parse(%q): tmp file %q is not %q.bin_….tmp", rel, file, name.Hash)
			}
			if k, n := Parse(dir + name.Hash + ".bin"); k != File || n != name {
				t.Fatalf("Parse(%q) = tmp of %+v, but its block parses as %v %+v", rel, name, k, n)
			}
		default:
			t.Fatalf("Parse(%q) = unknown kind %d", rel, kind)
		}
		if !IsHash(name.Hash) {
			t.Fatalf("Parse(%q): hash %q is not lowercase hex of a hash's length", rel, name.Hash)
		}
		if name.Tier == "" || !strings.HasPrefix(rel, name.Tier+"/") || strings.Contains(name.Tier, "/") {
			t.Fatalf("Parse(%q): tier %q is not the first component", rel, name.Tier)
		}
		groupDir := path.Base(strings.TrimSuffix(dir, "/"))
		if name.Group < 0 || !strings.HasSuffix(groupDir, "_g"+strconv.Itoa(name.Group)) && !hasPaddedGroup(groupDir, name.Group) {
			t.Fatalf("Parse(%q): group %d is not the _g<N> suffix of %q", rel, name.Group, groupDir)
		}
		if g, ok := GroupOfDir(groupDir); !ok || g != name.Group {
			t.Fatalf("Parse(%q): group %d, GroupOfDir(%q) = %d, %v", rel, name.Group, groupDir, g, ok)
		}

		built := name.Path()
		if k, n := Parse(built); k != File || n != name {
			t.Fatalf("Parse(%q) = %+v, whose Path %q parses as %v %+v", rel, name, built, k, n)
		}
		if k, n := Parse(name.TmpPath("42")); k != TmpFile || n != name {
			t.Fatalf("Parse(%q) = %+v, whose TmpPath parses as %v %+v", rel, name, k, n)
		}
		laidOut := name.Tier + "/" + name.Hash[:3] + "/" + name.Hash[3:5] + "_g" + strconv.Itoa(name.Group) + "/"
		if kind == File && dir == laidOut && built != rel {
			t.Fatalf("Parse(%q) = %+v, whose Path is %q", rel, name, built)
		}
		if kind == TmpFile && dir == laidOut {
			unique := strings.TrimSuffix(strings.TrimPrefix(file, name.Hash+".bin_"), ".tmp")
			if tmp := name.TmpPath(unique); tmp != rel {
				t.Fatalf("Parse(%q) = tmp of %+v, whose TmpPath(%q) is %q", rel, name, unique, tmp)
			}
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
