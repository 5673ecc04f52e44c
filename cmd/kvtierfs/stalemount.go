package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// liveMountTimeout bounds how long a mount at the mountpoint may take to
// answer statfs before it counts as hung.
const liveMountTimeout = 5 * time.Second

// clearStaleMount makes a mountpoint usable again after a crash: a mount
// whose daemon died (statfs answers ENOTCONN) is detached lazily, so the engine
// never sees "Transport endpoint is not connected" once this daemon serves.
// A mount that answers, or hangs, is another daemon's: it is refused. statfs
// always reaches the daemon, where stat may be answered from cached attributes.
func clearStaleMount(mnt string) error {
	entry, err := findMount(mnt)
	if err != nil || entry == nil {
		return err
	}
	if !strings.HasPrefix(entry.FSType, "fuse") {
		return fmt.Errorf("mountpoint %s is busy: %s (%s) is mounted there; unmount it first", mnt, entry.Source, entry.FSType)
	}
	switch err := statfsWithin(mnt, liveMountTimeout); {
	case errors.Is(err, unix.ENOTCONN) || errors.Is(err, unix.ECONNABORTED):
		if err := detach(mnt); err != nil {
			return fmt.Errorf("mountpoint %s holds the dead mount of a crashed daemon (%s) and detaching it failed: %w", mnt, entry.Source, err)
		}
		slog.Warn("detached the stale mount of a daemon that died", "mountpoint", mnt, "source", entry.Source)
		return nil
	case errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Errorf("mountpoint %s is busy: %s serves it and does not answer statfs within %s (a stopped or hung daemon): "+
			"end that daemon, or 'kvtierfs umount %s', then mount again", mnt, entry.Source, liveMountTimeout, mnt)
	default:
		return fmt.Errorf("mountpoint %s is busy: a live daemon serves it (%s, %s); stop it first ('kvtierfs umount %s' or SIGTERM to its process)",
			mnt, entry.Source, entry.FSType, mnt)
	}
}

// statfsWithin calls statfs on path, giving up with os.ErrDeadlineExceeded
// after timeout (statfs of a hung FUSE mount never returns; its goroutine is
// left behind).
func statfsWithin(path string, timeout time.Duration) error {
	done := make(chan error, 1)
	go func() {
		var st unix.Statfs_t
		done <- unix.Statfs(path, &st)
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(timeout):
		return os.ErrDeadlineExceeded
	}
}

// detach lazily unmounts mnt: directly as root, through fusermount3 otherwise.
func detach(mnt string) error {
	if os.Geteuid() != 0 {
		if out, err := exec.Command("fusermount3", "-u", "-z", mnt).CombinedOutput(); err != nil {
			return fmt.Errorf("fusermount3 -u -z %s: %v: %s", mnt, err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	return unix.Unmount(mnt, unix.MNT_DETACH)
}
