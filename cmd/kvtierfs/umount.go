package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
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

// isMountpoint reports whether dir is the mount point of a mount, from
// /proc/self/mountinfo (it works for stale FUSE mounts that stat cannot reach).
func isMountpoint(dir string) (bool, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return false, err
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && unescapeMountinfo(fields[4]) == abs {
			return true, nil
		}
	}
	return false, sc.Err()
}

// unescapeMountinfo decodes the octal escapes (\040 for space) of mountinfo paths.
func unescapeMountinfo(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
