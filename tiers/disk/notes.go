package disk

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// MaxNoteBytes bounds a note's value.
const MaxNoteBytes = 1024

// noteXattr is the xattr of the store root that holds note name: in the
// trusted namespace as root, which the engine's uid (owner of the store
// tree) can neither read nor forge; in the user namespace otherwise.
func noteXattr(name string) string {
	if notesTrusted() {
		return "trusted.kvtierfs." + name
	}
	return "user.kvtierfs." + name
}

// notesTrusted reports whether this process may use trusted.* xattrs: root
// of the initial user namespace, whose CAP_SYS_ADMIN the kernel asks for.
// Root of another user namespace (a rootless container, the arm64 test
// runner) is refused them with EPERM, so its notes go to user.* instead.
// The initial namespace is told by its inode, fixed by the kernel
// (PROC_USER_INIT_INO), since a namespace may map every uid to itself.
var notesTrusted = sync.OnceValue(func() bool {
	const initUserNamespace = 0xEFFFFFFD
	var st unix.Stat_t
	return os.Geteuid() == 0 && unix.Stat("/proc/self/ns/user", &st) == nil && st.Ino == initUserNamespace
})

// ReadNote returns the daemon's note name, kept on the store root across
// restarts; an error wrapping fs.ErrNotExist when there is none.
func (s *Store) ReadNote(name string) ([]byte, error) {
	buf := make([]byte, MaxNoteBytes)
	n, err := unix.Fgetxattr(s.rootFD, noteXattr(name), buf)
	if errors.Is(err, unix.ENODATA) {
		return nil, fmt.Errorf("note %s of store %s: %w", name, s.root, fs.ErrNotExist)
	}
	if errors.Is(err, unix.ERANGE) {
		return nil, fmt.Errorf("note %s of store %s is larger than %d bytes", name, s.root, MaxNoteBytes)
	}
	if err != nil {
		return nil, fmt.Errorf("reading note %s of store %s: %w", name, s.root, err)
	}
	return buf[:n], nil
}

// WriteNote replaces the daemon's note name with value.
func (s *Store) WriteNote(name string, value []byte) error {
	if len(value) > MaxNoteBytes {
		return fmt.Errorf("note %s: %d bytes, at most %d", name, len(value), MaxNoteBytes)
	}
	if err := unix.Fsetxattr(s.rootFD, noteXattr(name), value, 0); err != nil {
		return fmt.Errorf("writing note %s of store %s: %w", name, s.root, err)
	}
	return nil
}
