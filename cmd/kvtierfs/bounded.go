package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/pflag"
)

// defaultMountTimeout bounds each request a command makes of a mount. A
// daemon that is stopped or hung never answers, and the kernel lets only a
// fatal signal end the wait (Ctrl-C reaches a Go program as a caught one).
const defaultMountTimeout = 10 * time.Second

// addTimeoutFlag adds --timeout, the bound of each request to the mount.
func addTimeoutFlag(fl *pflag.FlagSet) *time.Duration {
	return fl.Duration("timeout", defaultMountTimeout, "give up when the mount does not answer within this long (a stopped or hung daemon)")
}

// checkTimeout refuses a bound that is not positive.
func checkTimeout(d time.Duration) error {
	if d <= 0 {
		return usageError{fmt.Errorf("--timeout %s: want a positive duration such as 10s", d)}
	}
	return nil
}

// interruptedError is SIGINT or SIGTERM arriving while a command waited on a mount.
type interruptedError struct{ sig os.Signal }

func (e interruptedError) Error() string { return "interrupted by " + e.sig.String() }

// onMount runs access, which touches the mount at mnt, and returns its
// result; it gives up after timeout, or when SIGINT or SIGTERM arrives, with
// an error that names the cause. A request still waiting on a hung daemon is
// left behind: the process exits (exit ends the kernel's wait), so callers
// return the error to main rather than carrying on.
func onMount[T any](mnt string, timeout time.Duration, access func() (T, error)) (T, error) {
	return bounded(timeout, func() error {
		return fmt.Errorf("%s does not answer within %s: the daemon serving it is stopped or hung "+
			"(see its state with 'ps -o pid,stat,cmd -C kvtierfs'; SIGCONT resumes a stopped one, 'kvtierfs umount %s' detaches it)",
			mnt, timeout, mnt)
	}, access)
}

// bounded runs work and returns its result, or gives up after timeout with
// the error hung returns, or at SIGINT or SIGTERM with an interruptedError.
func bounded[T any](timeout time.Duration, hung func() error, work func() (T, error)) (T, error) {
	type result struct {
		value T
		err   error
	}
	done := make(chan result, 1)
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(signals)
	go func() {
		v, err := work()
		done <- result{v, err}
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var zero T
	select {
	case r := <-done:
		return r.value, r.err
	case <-timer.C:
		return zero, hung()
	case sig := <-signals:
		return zero, interruptedError{sig}
	}
}

// scanRegionsWithin is scanRegions bounded by timeout: reading a process's
// mappings waits while that process is stuck in the kernel holding them,
// and the glob's directory may be on a hung mount. (The scan stats no
// descriptor a process holds, which on a hung FUSE mount waits on its
// server: readOpenFiles.)
func scanRegionsWithin(glob string, owners []uint32, timeout time.Duration) (regionScan, error) {
	return bounded(timeout, procScanHung(timeout), func() (regionScan, error) { return scanRegions(glob, owners) })
}

// filesInUseWithin is scanProcesses bounded by timeout, as scanRegionsWithin.
func filesInUseWithin(wanted map[fileID]bool, timeout time.Duration) (map[fileID]bool, error) {
	scan := scanProcesses
	return bounded(timeout, procScanHung(timeout), func() (map[fileID]bool, error) {
		used, _, err := scan(wanted)
		return used, err
	})
}

// scanProcesses is the scan after gc-regions' grace, filesInUse; a variable
// so that a test can make it hang.
var scanProcesses = filesInUse

// procScanHung is the error of a scan of the regions and /proc that did not
// finish within timeout.
func procScanHung(timeout time.Duration) func() error {
	return func() error {
		return fmt.Errorf("scanning the regions and the processes' mappings and open files (/proc/*/maps, /proc/*/fdinfo) did not finish within %s: a process is stuck in the kernel holding its mappings, or the regions' directory is on a hung mount", timeout)
	}
}
