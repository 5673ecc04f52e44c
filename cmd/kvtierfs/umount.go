package main

import (
	"fmt"
	"os"
	"os/exec"
	"strings"

	"golang.org/x/sys/unix"
)

func runUmount(args []string) error {
	fl := newFlagSet("umount")
	mnt, err := parseArgs(fl, args)
	if err != nil {
		return err
	}
	mounted, err := isMountpoint(mnt)
	if err != nil {
		return err
	}
	if !mounted {
		return fmt.Errorf("%s is not mounted", mnt)
	}
	if os.Geteuid() != 0 {
		out, err := exec.Command("fusermount3", "-u", "-z", mnt).CombinedOutput()
		if err != nil {
			return fmt.Errorf("fusermount3 -u %s: %v: %s", mnt, err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	err = unix.Unmount(mnt, 0)
	if err == unix.EBUSY {
		fmt.Fprintf(os.Stderr, "kvtierfs umount: %s is busy; detached lazily, it disappears when the last open file closes\n", mnt)
		err = unix.Unmount(mnt, unix.MNT_DETACH)
	}
	if err != nil {
		return fmt.Errorf("unmount %s: %w", mnt, err)
	}
	return nil
}
