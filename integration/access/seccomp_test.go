package access_test

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/internal/seccomptest"
)

// execWithoutOpenat2 runs argv as a kernel without openat2 would, as some
// sandboxes do: a seccomp filter makes openat2 answer ENOSYS, and argv is
// exec'd from the filtered thread (the filter is inherited). It returns only
// on failure.
func execWithoutOpenat2(argv []string) error {
	runtime.LockOSThread() // the filter and the exec on one thread
	if err := seccomptest.DenyOpenat2(); err != nil {
		return fmt.Errorf("seccomp filter: %w", err)
	}
	how := unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC}
	if fd, err := unix.Openat2(unix.AT_FDCWD, "/", &how); !errors.Is(err, unix.ENOSYS) {
		unix.Close(fd)
		return fmt.Errorf("openat2 still answers under the filter: %v", err)
	}
	os.Unsetenv(helperEnv)
	return syscall.Exec(argv[0], argv, os.Environ())
}
