package access_test

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// openat2Syscall is openat2's number, the same on amd64 and arm64.
const openat2Syscall = 437

// execWithoutOpenat2 runs argv as a kernel without openat2 would, as some
// sandboxes do: a seccomp filter makes openat2 answer ENOSYS, and argv is
// exec'd from the filtered thread (the filter is inherited). It returns only
// on failure.
func execWithoutOpenat2(argv []string) error {
	runtime.LockOSThread() // the filter and the exec on one thread
	filter := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 0}, // seccomp_data.nr
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: openat2Syscall, Jt: 0, Jf: 1},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ALLOW},
	}
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_SECCOMP, unix.SECCOMP_MODE_FILTER, uintptr(unsafe.Pointer(&prog)), 0, 0); err != nil {
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
