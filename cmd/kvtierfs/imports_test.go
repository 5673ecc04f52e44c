package main

import (
	"bufio"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// module is the module path every package of the drawing is under.
const module = "github.com/kvtierfs/kvtierfs/"

// benchEntry names cmd/kvtierfs built with -tags bench in the drawing.
const benchEntry = "cmd/kvtierfs+bench"

// readDrawing returns the entries of the rows of DESIGN.md's drawing of
// "Packages and their imports", top row first.
func readDrawing(t *testing.T) [][]string {
	t.Helper()
	doc, err := os.ReadFile("../../DESIGN.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n## Packages and their imports\n")
	if !ok {
		t.Fatal(`DESIGN.md has no "Packages and their imports" section`)
	}
	_, drawing, ok := strings.Cut(section, "\n```\n")
	drawing, _, closed := strings.Cut(drawing, "\n```\n")
	if !ok || !closed {
		t.Fatal(`DESIGN.md's "Packages and their imports" has no drawing in a code block`)
	}
	var rows [][]string
	scanner := bufio.NewScanner(strings.NewReader(drawing))
	for scanner.Scan() {
		line, _, _ := strings.Cut(scanner.Text(), "#")
		if entries := strings.Fields(strings.ReplaceAll(line, "│", "")); len(entries) > 0 {
			rows = append(rows, entries)
		}
	}
	return rows
}

// listImports returns the module's packages, each with the module's
// packages it imports (tests aside), by `go list`, with benchEntry for the
// benchmark build of cmd/kvtierfs.
func listImports(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, tags := range []string{"", "bench"} {
		list := exec.Command("go", "list", "-tags", tags, "-f", `{{if .GoFiles}}{{.ImportPath}} {{join .Imports " "}}{{end}}`, module+"...")
		raw, err := list.Output()
		if err != nil {
			t.Fatalf("go list -tags %q: %v", tags, err)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
			fields := strings.Fields(line)
			if len(fields) == 0 {
				continue
			}
			pkg := strings.TrimPrefix(fields[0], module)
			if tags == "bench" {
				if pkg != "cmd/kvtierfs" {
					continue
				}
				pkg = benchEntry
			}
			var own []string
			for _, imp := range fields[1:] {
				if rel, ok := strings.CutPrefix(imp, module); ok {
					own = append(own, rel)
				}
			}
			out[pkg] = own
		}
	}
	return out
}

// entryMatches reports whether a drawing entry names the package: itself,
// or a package under "dir/" for the entry "dir/*".
func entryMatches(entry, pkg string) bool {
	if dir, ok := strings.CutSuffix(entry, "/*"); ok {
		return strings.HasPrefix(pkg, dir+"/")
	}
	return entry == pkg
}

// place is an entry's position in the drawing.
type place struct {
	row   int
	entry string
}

// placeOf finds the one entry of the drawing that names pkg.
func placeOf(rows [][]string, pkg string) (place, int) {
	var found place
	n := 0
	for r, row := range rows {
		for _, e := range row {
			if entryMatches(e, pkg) {
				found, n = place{r, e}, n+1
			}
		}
	}
	return found, n
}

// TestImportsFollowTheDrawing holds `go list` to DESIGN.md's drawing of the
// packages: each package is named by exactly one entry, every entry names a
// package, and each import goes to a row below (or stays within one "/*"
// entry). The daemon's binary therefore links nothing of integration/, and
// staging nothing of fusefs but the control ABI, as checked once more here.
func TestImportsFollowTheDrawing(t *testing.T) {
	rows := readDrawing(t)
	imports := listImports(t)
	for pkg, imps := range imports {
		at, n := placeOf(rows, pkg)
		if n != 1 {
			t.Errorf("%s is named by %d entries of DESIGN.md's drawing, want 1: add it to its row", pkg, n)
			continue
		}
		for _, imp := range imps {
			to, m := placeOf(rows, imp)
			if m == 1 && (to.row > at.row || to.entry == at.entry && strings.HasSuffix(at.entry, "/*")) {
				continue
			}
			t.Errorf("%s (row %d, %s) imports %s (row %d, %s): the drawing allows imports of rows below only", pkg, at.row+1, at.entry, imp, to.row+1, to.entry)
		}
	}
	for _, row := range rows {
		for _, e := range row {
			if !slices.ContainsFunc(slices.Collect(maps.Keys(imports)), func(pkg string) bool { return entryMatches(e, pkg) }) {
				t.Errorf("DESIGN.md's drawing names %s, which is no package", e)
			}
		}
	}
	for _, pkg := range []string{"cmd/kvtierfs", "staging"} {
		deps := listDeps(t, module+pkg+"/...")
		for _, dep := range deps {
			if pkg == "cmd/kvtierfs" && strings.HasPrefix(dep, "integration/") {
				t.Errorf("the daemon's binary links %s", dep)
			}
			if pkg == "staging" && strings.HasPrefix(dep, "fusefs/") && dep != "fusefs/ctlabi" {
				t.Errorf("staging links %s, of fusefs only the control ABI may be", dep)
			}
		}
	}
}

// fuseFree are the packages that must link nothing of go-fuse: the mount's
// FUSE-free parts (the drawing's row of fusefs/core and tiers/tier).
var fuseFree = []string{"fusefs/core", "fusefs/kvevents", "fusefs/prime", "tiers/tier"}

// TestFUSEFreePartsLinkNoFUSE: only fusefs and what imports it link go-fuse;
// the rules of a block's life (tiers/tier) and of a load (fusefs/core) are
// tested without a mount.
func TestFUSEFreePartsLinkNoFUSE(t *testing.T) {
	for _, pkg := range fuseFree {
		raw, err := exec.Command("go", "list", "-deps", module+pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		for _, dep := range strings.Fields(string(raw)) {
			if strings.HasPrefix(dep, "github.com/hanwen/go-fuse/") {
				t.Errorf("%s links %s", pkg, dep)
			}
		}
	}
}

// listDeps is `go list -deps` of the pattern: the module's packages only.
func listDeps(t *testing.T, pattern string) []string {
	t.Helper()
	raw, err := exec.Command("go", "list", "-deps", pattern).Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pattern, err)
	}
	var out []string
	for _, line := range strings.Fields(string(raw)) {
		if rel, ok := strings.CutPrefix(line, module); ok {
			out = append(out, rel)
		}
	}
	return out
}
