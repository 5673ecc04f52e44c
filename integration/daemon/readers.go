package daemon

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// FuseReaders counts the threads of process pid that wait in read(2) on a
// /dev/fuse descriptor: the FUSE server's idle readers, as the kernel sees
// them (/proc/PID/task/TID/syscall names each blocked thread's syscall and
// its arguments). A thread that leaves or enters the syscall while it is
// read is counted as it was found.
func FuseReaders(pid int) (int, error) {
	fuseFDs := map[uint64]bool{}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return 0, err
	}
	for _, fd := range fds {
		if target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); err == nil && target == "/dev/fuse" {
			n, err := strconv.ParseUint(fd.Name(), 10, 64)
			if err != nil {
				return 0, err
			}
			fuseFDs[n] = true
		}
	}
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/syscall", pid))
	if err != nil {
		return 0, err
	}
	readers := 0
	for _, task := range tasks {
		raw, err := os.ReadFile(task)
		if err != nil {
			continue // the thread exited
		}
		// "NR arg1 …", the first argument in hex.
		fields := strings.Fields(string(raw))
		if len(fields) < 2 || fields[0] != strconv.Itoa(unix.SYS_READ) {
			continue
		}
		if fd, err := strconv.ParseUint(strings.TrimPrefix(fields[1], "0x"), 16, 64); err == nil && fuseFDs[fd] {
			readers++
		}
	}
	return readers, nil
}
