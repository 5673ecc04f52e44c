package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
)

// busyRetries and busyPause bound how long umount waits for a mount that is
// busy for a moment (a batch of the daemon's lookup helper, a load in
// flight) before it detaches it lazily.
const (
	busyRetries = 10
	busyPause   = 200 * time.Millisecond
)

func runUmount(args []string) error {
	fl := newFlagSet("umount")
	timeout := addTimeoutFlag(fl)
	mnt, err := parseArgs(fl, args)
	if err != nil {
		return err
	}
	if err := checkTimeout(*timeout); err != nil {
		return err
	}
	entry, err := findMount(mnt)
	if err != nil {
		return err
	}
	if entry == nil {
		return fmt.Errorf("%s is not mounted", mnt)
	}
	if entry.FSType != ctlabi.FSType {
		return fmt.Errorf("%s is not a kvtierfs mount: %s (%s) is mounted there; kvtierfs umount leaves other filesystems alone (use umount(8))",
			mnt, entry.Source, entry.FSType)
	}
	_, err = onMount(mnt, *timeout, func() (struct{}, error) { return struct{}{}, unmount(mnt) })
	return err
}

// unmount unmounts mnt: directly as root, retrying while it is busy for a
// moment, then lazily; through fusermount3 otherwise.
func unmount(mnt string) error {
	if os.Geteuid() != 0 {
		out, err := exec.Command("fusermount3", "-u", "-z", mnt).CombinedOutput()
		if err != nil {
			return fmt.Errorf("fusermount3 -u %s: %v: %s", mnt, err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	err := unix.Unmount(mnt, unix.UMOUNT_NOFOLLOW)
	for i := 0; i < busyRetries && errors.Is(err, unix.EBUSY); i++ {
		time.Sleep(busyPause)
		err = unix.Unmount(mnt, unix.UMOUNT_NOFOLLOW)
	}
	if errors.Is(err, unix.EBUSY) {
		fmt.Fprintf(os.Stderr, "kvtierfs umount: %s is busy (a process has a file or its working directory there); detached lazily, it disappears when the last open file closes\n", mnt)
		err = unix.Unmount(mnt, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
	}
	if err != nil {
		return fmt.Errorf("unmount %s: %w", mnt, err)
	}
	return nil
}
