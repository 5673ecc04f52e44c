// Command kvtierfs mounts and inspects the kvtierfs disk tier of an inference
// engine's KV cache.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/kvtierfs/kvtierfs/fusefs/prime"
)

// command is one subcommand of kvtierfs.
type command struct {
	name, usage, summary string
	// example is a typical command line, shown by --help.
	example string
	run     func(args []string) error
}

// commands lists the subcommands; init sets it, as their run functions look
// their own entry up.
var commands []command

func init() {
	commands = []command{
		{"mount", "mount MOUNTPOINT [flags]", "serve the disk tier at MOUNTPOINT until SIGINT/SIGTERM",
			"kvtierfs mount /mnt/kvtier --store /nvme/kvtier --capacity 400GiB", runMount},
		{"stat", "stat MOUNTPOINT [--json | --watch [--interval 2s]]", "show occupancy, counters and warnings of a mount",
			"kvtierfs stat /mnt/kvtier --watch --interval 2s", runStat},
		{"umount", "umount MOUNTPOINT", "unmount (lazily if busy)",
			"kvtierfs umount /mnt/kvtier", runUmount},
		{"bench", "bench SCENARIO [flags]", "replay the engine's KV offloading on real mounts and report",
			"kvtierfs bench disk --blocks 64 --row-bytes 8MiB", runBench},
		{"gc-regions", "gc-regions [--dry-run] [--engine-uid UID]", "remove the engine's shm regions no process maps (left by dead engines)",
			"kvtierfs gc-regions --dry-run --engine-uid $(id -u vllm)", runGCRegions},
		{"version", "version", "print the version, commit and Go version (also --version)",
			"kvtierfs --version", runVersion},
	}
}

// commandNamed returns the subcommand called name, or nil.
func commandNamed(name string) *command {
	for i := range commands {
		if commands[i].name == name {
			return &commands[i]
		}
	}
	return nil
}

// usageOutput receives the help text that --help asks for.
var usageOutput io.Writer = os.Stdout

func usage(w io.Writer) {
	fmt.Fprintf(w, "kvtierfs: a FUSE disk tier for an inference engine's KV cache\n\nUsage:\n")
	for _, c := range commands {
		fmt.Fprintf(w, "  kvtierfs %-34s %s\n", c.usage, c.summary)
	}
	fmt.Fprintf(w, "\nExample:\n  %s\n\nRun 'kvtierfs COMMAND --help' for the flags of a command.\n", commands[0].example)
}

func main() {
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		if len(os.Args) < 2 {
			usage(os.Stderr)
			os.Exit(2)
		}
		usage(usageOutput)
		return
	}
	name := os.Args[1]
	if name == prime.HelperCommand { // started by mount, not listed
		os.Exit(prime.Main(os.Args[2:], os.Stdin, os.Stdout))
	}
	if name == "--version" {
		name = "version"
	}
	c := commandNamed(name)
	if c == nil {
		fmt.Fprintf(os.Stderr, "kvtierfs: unknown command %q (commands: %s)\n\n", name, commandNames())
		usage(os.Stderr)
		os.Exit(2)
	}
	err := c.run(os.Args[2:])
	if errors.Is(err, pflag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvtierfs %s: %v\n", c.name, err)
		os.Exit(exitCode(err))
	}
}

// commandNames lists the subcommands, comma-separated.
func commandNames() string {
	s := ""
	for i, c := range commands {
		if i > 0 {
			s += ", "
		}
		s += c.name
	}
	return s
}

// usageError is a problem with the command line; it exits with status 2.
type usageError struct{ error }

// exitCode is 2 for a usage error, 128+N for signal N that interrupted the
// command (as a shell reports it), else 1.
func exitCode(err error) int {
	var u usageError
	if errors.As(err, &u) {
		return 2
	}
	var i interruptedError
	if errors.As(err, &i) {
		if sig, ok := i.sig.(syscall.Signal); ok {
			return 128 + int(sig)
		}
	}
	return 1
}

// flagSets holds the flag set each subcommand built last, so tests can check
// deploy files against the real flags.
var flagSets = map[string]*pflag.FlagSet{}

// newFlagSet returns the flag set of subcommand name; it reports errors
// instead of exiting, and its usage shows the command's example.
func newFlagSet(name string) *pflag.FlagSet {
	c := commandNamed(name)
	fl := pflag.NewFlagSet(name, pflag.ContinueOnError)
	fl.SortFlags = false
	fl.Usage = func() {
		fmt.Fprintf(usageOutput, "Usage: kvtierfs %s\n\n%s.\n\nExample:\n  %s\n\nFlags:\n%s", c.usage, c.summary, c.example, fl.FlagUsages())
	}
	flagSets[name] = fl
	return fl
}

// parseArgs parses flags and requires exactly one positional MOUNTPOINT.
func parseArgs(fl *pflag.FlagSet, args []string) (string, error) {
	if err := parseFlags(fl, args); err != nil {
		return "", err
	}
	if fl.NArg() != 1 {
		return "", usageError{fmt.Errorf("expected exactly one MOUNTPOINT, got %d arguments (run 'kvtierfs %s --help')", fl.NArg(), fl.Name())}
	}
	return fl.Arg(0), nil
}
