package main

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
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

// writeVersion prints the release version, the commit (with "+dirty" when
// built from a modified tree) and the Go version of this binary.
func writeVersion(w io.Writer, info *debug.BuildInfo) {
	b := buildOf(info)
	fmt.Fprintf(w, "kvtierfs %s commit %s %s %s/%s\n", b.version, b.revision, b.goVersion, runtime.GOOS, runtime.GOARCH)
}

// build is what the binary knows of its own build.
type build struct{ version, revision, goVersion string }

// buildOf reads the build from the stamped version and commit and from info
// (nil: unknown), the toolchain's where nothing was stamped.
func buildOf(info *debug.BuildInfo) build {
	b := build{version: version, revision: commit, goVersion: runtime.Version()}
	dirty := false
	if info != nil {
		if b.version == "" {
			b.version = info.Main.Version
		}
		b.goVersion = info.GoVersion
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				b.revision = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	if b.version == "" || b.version == "(devel)" {
		b.version = unreleased
	}
	if b.revision == "" {
		b.revision = "unknown"
	}
	if dirty {
		b.revision += "+dirty"
	}
	return b
}

// thisBuild is the build of the running binary.
func thisBuild() build {
	info, _ := debug.ReadBuildInfo()
	return buildOf(info)
}

// buildInfoMetric is kvtierfs_build_info: 1, labelled with the build, so
// that a fleet's versions show in one query.
func buildInfoMetric(b build) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvtierfs_build_info",
		Help:        "Always 1; the labels name the daemon's version, commit and Go version.",
		ConstLabels: prometheus.Labels{"version": b.version, "revision": b.revision, "goversion": b.goVersion}},
		func() float64 { return 1 })
}
