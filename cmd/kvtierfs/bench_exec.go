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
	if err := checkBenchBuild(exe, bench); err != nil {
		return err
	}
	err = syscall.Exec(bench, append([]string{bench, "bench"}, args...), os.Environ())
	return fmt.Errorf("running the benchmark build %s (make build writes it beside %s): %w", bench, exe, err)
}

// checkBenchBuild refuses a benchmark build that someone other than root or
// the owner of exe could have put or changed beside it: in a sticky
// world-writable directory (/tmp) anyone may create EXE-bench where none is,
// and root would run theirs. A file that passes cannot be swapped there by
// anyone else.
func checkBenchBuild(exe, bench string) error {
	var exeStat, benchStat syscall.Stat_t
	if err := syscall.Stat(exe, &exeStat); err != nil {
		return err
	}
	if err := syscall.Lstat(bench, &benchStat); err != nil {
		return fmt.Errorf("running the benchmark build %s (make build writes it beside %s): %w", bench, exe, err)
	}
	switch {
	case benchStat.Mode&syscall.S_IFMT != syscall.S_IFREG:
		return fmt.Errorf("refusing the benchmark build %s: not a regular file", bench)
	case benchStat.Uid != 0 && benchStat.Uid != exeStat.Uid:
		return fmt.Errorf("refusing the benchmark build %s: it belongs to uid %d, not to root or to %s's owner (uid %d)", bench, benchStat.Uid, exe, exeStat.Uid)
	case benchStat.Mode&0o022 != 0:
		return fmt.Errorf("refusing the benchmark build %s: others may write it (mode %04o)", bench, benchStat.Mode&0o7777)
	}
	return nil
}
