package main

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
)

// commit is the source revision, set by `make build` through -ldflags where
// the Go toolchain cannot stamp it (a git worktree, -buildvcs=false).
var commit string

// version is the release version, set by `make build` and `make release`
// through -ldflags (git describe); without it the module version is used.
var version string

// unreleased names the version of a build from a checkout that nothing
// stamped: the toolchain's "(devel)" says nothing an operator can act on.
const unreleased = "unreleased"

func runVersion(args []string) error {
	fl := newFlagSet("version")
	if err := parseFlags(fl, args); err != nil {
		return err
	}
	if fl.NArg() != 0 {
		return usageError{fmt.Errorf("expected no arguments, got %q", fl.Args())}
	}
	info, _ := debug.ReadBuildInfo()
	writeVersion(os.Stdout, info)
	return nil
}

// writeVersion prints the module version, the commit (with "+dirty" when
// built from a modified tree) and the Go version of this binary.
func writeVersion(w io.Writer, info *debug.BuildInfo) {
	release, revision, dirty := version, commit, false
	goVersion := runtime.Version()
	if info != nil {
		if release == "" {
			release = info.Main.Version
		}
		goVersion = info.GoVersion
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				revision = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	if release == "" || release == "(devel)" {
		release = unreleased
	}
	if revision == "" {
		revision = "unknown"
	}
	if dirty {
		revision += "+dirty"
	}
	fmt.Fprintf(w, "kvtierfs %s commit %s %s %s/%s\n", release, revision, goVersion, runtime.GOOS, runtime.GOARCH)
}
