// Command kvtierfs mounts and inspects the kvtierfs disk tier of an inference
// engine's KV cache.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/pflag"
)

// command is one subcommand of kvtierfs.
type command struct {
	name, usage, summary string
	run                  func(args []string) error
}

var commands = []command{
	{"mount", "mount MOUNTPOINT [flags]", "serve the disk tier at MOUNTPOINT until SIGINT/SIGTERM", runMount},
	{"stat", "stat MOUNTPOINT [--json]", "show occupancy, counters and warnings of a mount", runStat},
	{"umount", "umount MOUNTPOINT", "unmount (lazily if busy)", runUmount},
	{"bench", "bench SCENARIO [flags]", "replay the engine's KV offloading on real mounts and report", runBench},
}

func usage() {
	fmt.Fprintf(os.Stderr, "kvtierfs: a FUSE disk tier for an inference engine's KV cache\n\nUsage:\n")
	for _, c := range commands {
		fmt.Fprintf(os.Stderr, "  kvtierfs %-28s %s\n", c.usage, c.summary)
	}
	fmt.Fprintf(os.Stderr, "\nRun 'kvtierfs COMMAND --help' for the flags of a command.\n")
}

func main() {
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		usage()
		if len(os.Args) < 2 {
			os.Exit(2)
		}
		return
	}
	for _, c := range commands {
		if c.name == os.Args[1] {
			err := c.run(os.Args[2:])
			if errors.Is(err, pflag.ErrHelp) {
				return
			}
			if err != nil {
				fmt.Fprintf(os.Stderr, "kvtierfs %s: %v\n", c.name, err)
				os.Exit(exitCode(err))
			}
			return
		}
	}
	fmt.Fprintf(os.Stderr, "kvtierfs: unknown command %q (commands: mount, stat, umount)\n\n", os.Args[1])
	usage()
	os.Exit(2)
}

// usageError is a problem with the command line; it exits with status 2.
type usageError struct{ error }

func exitCode(err error) int {
	var u usageError
	if errors.As(err, &u) {
		return 2
	}
	return 1
}

// newFlagSet returns a flag set that reports errors instead of exiting.
func newFlagSet(name, usageLine string) *pflag.FlagSet {
	fl := pflag.NewFlagSet(name, pflag.ContinueOnError)
	fl.SortFlags = false
	fl.Usage = func() {
		fmt.Fprintf(os.Stderr, "Usage: kvtierfs %s\n\nFlags:\n%s", usageLine, fl.FlagUsages())
	}
	return fl
}

// parseArgs parses flags and requires exactly one positional MOUNTPOINT.
func parseArgs(fl *pflag.FlagSet, args []string) (string, error) {
	if err := fl.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return "", err
		}
		return "", usageError{err}
	}
	if fl.NArg() != 1 {
		fl.Usage()
		return "", usageError{fmt.Errorf("expected exactly one MOUNTPOINT, got %d arguments", fl.NArg())}
	}
	return fl.Arg(0), nil
}
