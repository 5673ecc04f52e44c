//go:build !bench

package main

import (
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// benchLinked is false in the daemon build: `kvtierfs bench` runs the
// benchmark build (bench.go), so that the binary a node runs links neither
// the engine model nor the daemon harness of integration/.
const benchLinked = false

// runBench replaces this process with the benchmark build beside this
// executable, EXE-bench (`make build` writes both), running `bench` with
// the same arguments: the same flags, output, exit status and process. The
// file checked is the file run: it is executed through the descriptor that
// was checked, never looked up again by name.
func runBench(args []string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	bench := exe + "-bench" // bin/kvtierfs.old runs bin/kvtierfs.old-bench, never another version's
	f, err := openBenchBuild(exe, bench)
	if err != nil {
		return err
	}
	defer f.Close()
	err = syscall.Exec(fmt.Sprintf("/proc/self/fd/%d", f.Fd()), append([]string{bench, "bench"}, args...), os.Environ())
	return fmt.Errorf("running the benchmark build %s (make build writes it beside %s): %w", bench, exe, err)
}

// openBenchBuild opens, without following a link, a benchmark build that
// nobody who could not change exe could have put or changed beside it: in
// a sticky world-writable directory (/tmp) anyone may create EXE-bench where
// none is, and root would run theirs. It must be a regular file owned by
// root or by exe's owner, writable by no group or others who cannot write
// exe (a build under umask 002 makes both group-writable).
func openBenchBuild(exe, bench string) (*os.File, error) {
	var exeStat, benchStat unix.Stat_t
	if err := unix.Stat(exe, &exeStat); err != nil {
		return nil, err
	}
	fd, err := unix.Open(bench, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("running the benchmark build %s (make build writes it beside %s): %w", bench, exe, err)
	}
	f := os.NewFile(uintptr(fd), bench)
	if err := unix.Fstat(fd, &benchStat); err != nil {
		f.Close()
		return nil, err
	}
	switch {
	case benchStat.Mode&unix.S_IFMT != unix.S_IFREG:
		err = fmt.Errorf("refusing the benchmark build %s: not a regular file", bench)
	case benchStat.Uid != 0 && benchStat.Uid != exeStat.Uid:
		err = fmt.Errorf("refusing the benchmark build %s: it belongs to uid %d, not to root or to %s's owner (uid %d)", bench, benchStat.Uid, exe, exeStat.Uid)
	case benchStat.Mode&^exeStat.Mode&0o022 != 0:
		err = fmt.Errorf("refusing the benchmark build %s: others than those who may write %s may write it (mode %04o)", bench, exe, benchStat.Mode&0o7777)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}
