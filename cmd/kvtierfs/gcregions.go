package main

import (
	"fmt"
	"io"
	"os"

	"github.com/kvtierfs/kvtierfs/tiers/shm"
)

func runGCRegions(args []string) error {
	fl := newFlagSet("gc-regions")
	glob := fl.String("shm-glob", shm.DefaultGlob, "glob of the engine's shared offload regions")
	dryRun := fl.Bool("dry-run", false, "list the orphaned regions without removing them")
	timeout := fl.Duration("timeout", defaultMountTimeout, "give up when reading the processes' mappings takes longer (a process stuck in the kernel)")
	if err := parseFlags(fl, args); err != nil {
		return err
	}
	if err := checkTimeout(*timeout); err != nil {
		return err
	}
	if fl.NArg() != 0 {
		return usageError{fmt.Errorf("expected no arguments, got %q (run 'kvtierfs gc-regions --help')", fl.Args())}
	}
	scan, err := scanRegionsWithin(*glob, *timeout)
	if err != nil {
		return err
	}
	return gcRegions(os.Stdout, scan, *dryRun)
}

// gcRegions removes (or with dryRun lists) the orphaned regions of scan.
func gcRegions(w io.Writer, scan regionScan, dryRun bool) error {
	if len(scan.unreadable) > 0 {
		for _, r := range scan.orphans {
			fmt.Fprintf(w, "not proven orphaned %s (%s)\n", r.path, formatBytes(r.size))
		}
		return fmt.Errorf("cannot read the mappings of processes %s, so no region is proven orphaned: nothing removed (run as root, in the host's PID namespace)",
			describeProcesses(scan.unreadable))
	}
	failed := 0
	var freed int64
	for _, r := range scan.orphans {
		if dryRun {
			fmt.Fprintf(w, "would remove %s (%s)\n", r.path, formatBytes(r.size))
			continue
		}
		if err := removeOrphan(r); err != nil {
			fmt.Fprintf(w, "kept %s: %v\n", r.path, err)
			failed++
			continue
		}
		freed += r.size
		fmt.Fprintf(w, "removed %s (%s)\n", r.path, formatBytes(r.size))
	}
	for _, r := range scan.inUse {
		fmt.Fprintf(w, "in use %s (%s)\n", r.path, formatBytes(r.size))
	}
	if !dryRun {
		fmt.Fprintf(w, "%d orphaned regions removed, %s freed\n", len(scan.orphans)-failed, formatBytes(freed))
	}
	if failed > 0 {
		return fmt.Errorf("%d orphaned regions could not be removed", failed)
	}
	return nil
}

// printOrphans adds the orphaned regions to stat's report.
func printOrphans(w io.Writer, scan regionScan) {
	if len(scan.orphans) == 0 {
		fmt.Fprintln(w, "orphaned regions: none")
		return
	}
	fmt.Fprintf(w, "orphaned regions: %d mapped by no process ('kvtierfs gc-regions' removes them):\n", len(scan.orphans))
	for _, r := range scan.orphans {
		fmt.Fprintf(w, "  %s  %s\n", r.path, formatBytes(r.size))
	}
	if len(scan.unreadable) > 0 {
		fmt.Fprintf(w, "  (not proven: the mappings of processes %s are unreadable)\n", describeProcesses(scan.unreadable))
	}
}
