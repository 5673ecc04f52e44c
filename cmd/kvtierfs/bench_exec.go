//go:build !bench

package main

import (
	"fmt"
	"os"
	"syscall"
)

// benchLinked is false in the daemon build: `kvtierfs bench` runs the
// benchmark build (bench.go), so that the binary a node runs links neither
// the engine model nor the daemon harness of integration/.
const benchLinked = false

// runBench replaces this process with the benchmark build beside this
// executable, EXE-bench (`make build` writes both), running `bench` with
// the same arguments: the same flags, output, exit status and process.
func runBench(args []string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	bench := exe + "-bench" // bin/kvtierfs.old runs bin/kvtierfs.old-bench, never another version's
	err = syscall.Exec(bench, append([]string{bench, "bench"}, args...), os.Environ())
	return fmt.Errorf("running the benchmark build %s (make build writes it beside %s): %w", bench, exe, err)
}
