// Package seccomptest lets tests run code as on a kernel without openat2
// (before 5.6, some sandboxes, qemu-user): a seccomp filter that answers
// openat2 with ENOSYS.
package seccomptest

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// DenyOpenat2 makes openat2 answer ENOSYS on the calling thread, for good,
// and in whatever that thread execs: lock the goroutine to its thread first
// (runtime.LockOSThread) and never unlock it.
func DenyOpenat2() error {
	filter := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 0}, // seccomp_data.nr
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: unix.SYS_OPENAT2, Jt: 0, Jf: 1},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ALLOW},
	}
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return err
	}
	return unix.Prctl(unix.PR_SET_SECCOMP, unix.SECCOMP_MODE_FILTER, uintptr(unsafe.Pointer(&prog)), 0, 0)
}
