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

// checkBenchBuild refuses a benchmark build that someone who could not
// change exe could have put or changed beside it: in a sticky
// world-writable directory (/tmp) anyone may create EXE-bench where none is,
// and root would run theirs. It must be a regular file owned by root or by
// exe's owner, writable by no group or others who cannot write exe (a
// build under umask 002 makes both group-writable).
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
	case benchStat.Mode&^exeStat.Mode&0o022 != 0:
		return fmt.Errorf("refusing the benchmark build %s: others than those who may write %s may write it (mode %04o)", bench, exe, benchStat.Mode&0o7777)
	}
	return nil
}
