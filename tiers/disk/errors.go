package disk

import (
	"errors"
	"fmt"
	"syscall"
)

// Error is a store failure: an errno for the kernel plus a message for the log
// that names the path and what to do.
type Error struct {
	Op    string
	Path  string
	Errno syscall.Errno
	Msg   string
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s %s: %s (%v)", e.Op, e.Path, e.Msg, e.Errno)
}

// Unwrap exposes the errno so errors.Is(err, syscall.ENOSPC) works.
func (e *Error) Unwrap() error { return e.Errno }

func newError(op, path string, errno syscall.Errno, format string, args ...any) *Error {
	return &Error{Op: op, Path: path, Errno: errno, Msg: fmt.Sprintf(format, args...)}
}

// Errno maps any error to the errno the kernel should see: the errno inside a
// wrapped error, EIO for anything unknown, 0 for nil.
func Errno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno
	}
	return syscall.EIO
}
