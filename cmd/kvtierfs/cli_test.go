package main

import (
	"errors"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/kvtierfs/kvtierfs/tiers/disk"
)

func TestParseSize(t *testing.T) {
	cases := []struct {
		in   string
		want int64
	}{
		{"4096", 4096},
		{"4096B", 4096},
		{"1K", 1 << 10},
		{"1KiB", 1 << 10},
		{"1KB", 1000},
		{"10G", 10 << 30},
		{"10gib", 10 << 30},
		{"500MB", 500e6},
		{"1.5TB", 1.5e12},
		{"400GiB", 400 << 30},
		{" 2 MiB ", 2 << 20},
		{"1T", 1 << 40},
		{"400Gi", 400 << 30},
		{"512Mi", 512 << 20},
		{"2ki", 2 << 10},
	}
	for _, c := range cases {
		got, err := parseSize("capacity", c.in)
		if err != nil || got != c.want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"", "0", "-1G", "G", "ten", "1X", "1e30", "NaN", "Inf"} {
		_, err := parseSize("capacity", bad)
		if err == nil {
			t.Errorf("parseSize(%q) accepted", bad)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, "--capacity") || !strings.Contains(msg, "want a positive size") {
			t.Errorf("parseSize(%q) error %q does not name the flag and what is allowed", bad, msg)
		}
	}
}

func TestCheckDisjoint(t *testing.T) {
	cases := []struct {
		mountpoint, store string
		ok                bool
	}{
		{"/mnt/kvtier", "/nvme/kvtier", true},
		{"/mnt/kvtier", "/mnt/kvtier-store", true}, // a shared prefix is not containment
		{"/mnt/kvtier", "/mnt/kvtier", false},
		{"/mnt/kvtier", "/mnt/kvtier/store", false},
		{"/nvme/kvtier/mnt", "/nvme/kvtier", false},
		{"/mnt/kvtier/", "/mnt/kvtier/../kvtier/x", false},
		{"/a/b", "/a/c", true},
	}
	for _, c := range cases {
		err := checkDisjoint(c.mountpoint, c.store)
		if (err == nil) != c.ok {
			t.Errorf("checkDisjoint(%q, %q) = %v, want ok=%v", c.mountpoint, c.store, err, c.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "--store") {
			t.Errorf("checkDisjoint error %q does not name --store", err)
		}
	}
}

// TestFlagErrors checks that a bad flag names the flag, the value and what
// the flag accepts, and exits with the usage status.
func TestFlagErrors(t *testing.T) {
	// Should a case pass validation, it must not mount: its mountpoint is
	// the test's and its store missing.
	mnt, store := filepath.Join(t.TempDir(), "mnt"), filepath.Join(t.TempDir(), "missing")
	mount := func(flags ...string) []string { return append([]string{mnt, "--store", store}, flags...) }
	cases := []struct {
		command string
		args    []string
		want    []string
	}{
		{"mount", mount("--staging-depth", "many"), []string{"--staging-depth", `"many"`, "want an integer"}},
		{"mount", mount("--replicated-kv", "maybe"), []string{"--replicated-kv", `"maybe"`, "one of auto, on, off"}},
		{"mount", mount("--sync-deadline", "soon"), []string{"--sync-deadline", `"soon"`, "a duration such as"}},
		{"mount", mount("--sync-deadline"), []string{"--sync-deadline needs a value", "a duration"}},
		{"mount", mount("--capacity", "lots"), []string{"--capacity", `"lots"`, "want a positive size"}},
		{"mount", mount("--max-request", "2GiB"), []string{"--max-request", "2GiB", "to 1GiB"}},
		{"mount", mount("--passthrough-min-row", "-1MiB"), []string{"--passthrough-min-row", `"-1MiB"`, "want a positive size", "or 0"}},
		{"mount", mount("--row-bytes", "1000"), []string{"--row-bytes 1000", "a multiple of the page size"}},
		{"mount", mount("--row-bytes", "1GiB"), []string{"--row-bytes 1GiB", "up to 268435456 bytes"}},
		{"mount", mount("--staging-depth", "0"), []string{"--staging-depth", "0", "want at least 1"}},
		{"mount", mount("--lookup-budget", "on"), []string{"--lookup-budget", `"on"`, "want auto or off"}},
		{"mount", mount("--lookup-protect", "-1s"), []string{"--lookup-protect", "-1s", "want a positive duration"}},
		{"mount", mount("--log-format", "xml"), []string{"--log-format", `"xml"`, "one of text, json"}},
		{"mount", mount("--kv-events-endpoint", "127.0.0.1:5557"), []string{"--kv-events-endpoint", "127.0.0.1:5557", "tcp://*:5557"}},
		{"mount", mount("--no-such-flag"), []string{"unknown flag: --no-such-flag", "kvtierfs mount --help"}},
		{"mount", mount("--peer", "b:7470"), []string{"--peer", "need --secret-file"}},
		{"stat", []string{}, []string{"expected exactly one MOUNTPOINT", "kvtierfs stat --help"}},
		{"stat", []string{"/a", "/b"}, []string{"expected exactly one MOUNTPOINT, got 2"}},
		{"stat", []string{"/a", "--json=perhaps"}, []string{"--json", `"perhaps"`, "true or false"}},
		{"umount", []string{"-x", "/a"}, []string{"unknown flag", "kvtierfs umount --help"}},
		{"gc-regions", []string{"--engine-uid", "-1"}, []string{"--engine-uid -1", "want a uid, 0 to 4294967294"}},
		{"gc-regions", []string{"--engine-uid", "4294967295"}, []string{"--engine-uid 4294967295", "want a uid"}},
		{"bench", []string{"disk", "--blocks", "q"}, []string{"--blocks", `"q"`, "want an integer"}},
		{"version", []string{"extra"}, []string{"expected no arguments"}},
	}
	for _, c := range cases {
		if c.command == "bench" && !benchLinked {
			continue // the daemon build execs the benchmark build: make test runs these with -tags bench
		}
		err := commandNamed(c.command).run(c.args)
		if err == nil {
			t.Errorf("%s %q: accepted", c.command, c.args)
			continue
		}
		if exitCode(err) != 2 {
			t.Errorf("%s %q: %v exits %d, want 2", c.command, c.args, err, exitCode(err))
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s %q: error %q lacks %q", c.command, c.args, err, w)
			}
		}
	}
}

// TestHelpHasExample checks that every command's --help shows its usage,
// an example and its flags.
func TestHelpHasExample(t *testing.T) {
	var out strings.Builder
	usageOutput = &out
	t.Cleanup(func() { usageOutput = os.Stdout })
	for _, c := range commands {
		if c.name == "bench" && !benchLinked {
			continue // the daemon build execs the benchmark build: make test runs these with -tags bench
		}
		out.Reset()
		err := c.run([]string{"--help"})
		if !errors.Is(err, pflag.ErrHelp) {
			t.Errorf("%s --help: %v, want ErrHelp", c.name, err)
		}
		help := out.String()
		for _, w := range []string{"Usage: kvtierfs " + c.usage, "Example:\n  kvtierfs ", c.example} {
			if !strings.Contains(help, w) {
				t.Errorf("%s --help lacks %q:\n%s", c.name, w, help)
			}
		}
		argv := strings.Fields(c.example)
		if argv[1] == "--version" {
			argv[1] = "version"
		}
		if argv[0] != "kvtierfs" || argv[1] != c.name {
			t.Errorf("%s: example %q is not a kvtierfs %s command line", c.name, c.example, c.name)
			continue
		}
		checkCommandLine(t, c.name+" example", argv[1:])
	}
}

func TestWriteVersion(t *testing.T) {
	info := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.3.0"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.modified", Value: "true"}}}
	var out strings.Builder
	writeVersion(&out, info)
	for _, w := range []string{"kvtierfs v0.3.0", "commit abc123+dirty", "go1.26.8"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("version %q lacks %q", out.String(), w)
		}
	}
	commit = "feed42"
	t.Cleanup(func() { commit = "" })
	out.Reset()
	writeVersion(&out, &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}})
	if !strings.Contains(out.String(), "kvtierfs unreleased commit feed42 go1.26.8") {
		t.Errorf("version without vcs stamp = %q, want the -ldflags commit and no (devel)", out.String())
	}
	version = "v0.4.0-3-gfeed42"
	t.Cleanup(func() { version = "" })
	out.Reset()
	writeVersion(&out, &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}})
	if !strings.Contains(out.String(), "kvtierfs v0.4.0-3-gfeed42 commit feed42") {
		t.Errorf("version stamped by -ldflags = %q, want it before the module's", out.String())
	}
}

// TestPassthroughMinRowFlag: the default is the store's, 0 passes every row
// through, a size is taken as given.
func TestPassthroughMinRowFlag(t *testing.T) {
	for _, c := range []struct {
		args []string
		want int64
	}{{nil, disk.DefaultPassthroughMinRow}, {[]string{"--passthrough-min-row", "0"}, 0}, {[]string{"--passthrough-min-row", "1MiB"}, 1 << 20}} {
		got, err := parseMountFlags(append([]string{"/mnt/x", "--store", t.TempDir()}, c.args...))
		if err != nil {
			t.Fatalf("%q: %v", c.args, err)
		}
		if got.passthroughMinRow != c.want {
			t.Errorf("%q: %d, want %d", c.args, got.passthroughMinRow, c.want)
		}
	}
}
