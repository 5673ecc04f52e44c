package disk

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"syscall"
	"testing"
)

func TestErrno(t *testing.T) {
	if got := Errno(nil); got != 0 {
		t.Errorf("Errno(nil) = %v, want 0", got)
	}
	e := newError("write", "t/a_g0/x.bin", syscall.ENOSPC, "store full: %d", 7)
	if got := Errno(e); got != syscall.ENOSPC {
		t.Errorf("Errno(*Error ENOSPC) = %v", got)
	}
	if !errors.Is(e, syscall.ENOSPC) {
		t.Error("errors.Is(*Error, ENOSPC) is false")
	}
	wrapped := fmt.Errorf("outer: %w", e)
	if got := Errno(wrapped); got != syscall.ENOSPC {
		t.Errorf("Errno(wrapped *Error) = %v, want ENOSPC", got)
	}
	if msg := e.Error(); !strings.Contains(msg, "t/a_g0/x.bin") || !strings.Contains(msg, "store full: 7") || !strings.Contains(msg, "write") {
		t.Errorf("Error() = %q: want op, path and message", msg)
	}
	if got := Errno(errors.New("mystery")); got != syscall.EIO {
		t.Errorf("Errno(unknown) = %v, want EIO", got)
	}
	if got := Errno(syscall.EXDEV); got != syscall.EXDEV {
		t.Errorf("Errno(EXDEV) = %v", got)
	}
	_, err := os.Open("/nonexistent/kvtierfs/test")
	if got := Errno(err); got != syscall.ENOENT {
		t.Errorf("Errno(%v) = %v, want ENOENT", err, got)
	}
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatal("sanity")
	}
}
