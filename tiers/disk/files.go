package disk

import (
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// The store never follows a symbolic link, in any component of a path, nor
// leaves its root: anyone who can write through the mount can plant a link
// where a block or tmp file is expected (DESIGN "The store"). Files are opened
// relative to the root's descriptor with openat2's RESOLVE_BENEATH and
// RESOLVE_NO_SYMLINKS; where openat2 answers ENOSYS (kernels before 5.6, some
// sandboxes, qemu-user) the path is walked one component at a time from the
// root, each opened with O_NOFOLLOW, so the rule holds there too.

// openResolve is how the store resolves its paths.
const openResolve = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// openFile opens a store-relative path with flags (O_NOFOLLOW and O_CLOEXEC
// added) without following links.
func (s *Store) openFile(rel string, flags int, mode uint32) (*os.File, error) {
	fd, err := s.openat(rel, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: s.Path(rel), Err: err}
	}
	return os.NewFile(uintptr(fd), s.Path(rel)), nil
}

// openat resolves rel beneath the root, retrying the races openat2 reports
// (EAGAIN: a rename elsewhere in the store while resolving).
func (s *Store) openat(rel string, flags int, mode uint32) (int, error) {
	if rel == "" {
		rel = "." // the root
	}
	how := unix.OpenHow{Flags: uint64(flags), Mode: uint64(mode), Resolve: openResolve}
	for range 8 {
		fd, err := openat2(s.rootFD, rel, &how)
		switch err {
		case unix.EAGAIN, unix.EINTR:
			continue
		case unix.ENOSYS:
			return s.walkOpen(rel, flags, mode)
		}
		return fd, err
	}
	return -1, unix.EAGAIN
}

// openat2 is the openat2 system call; tests replace it with one that
// answers ENOSYS to exercise walkOpen on kernels that have it.
var openat2 = unix.Openat2

// walkOpen resolves rel beneath the root without openat2: every directory
// on the way is opened from the previous one with O_NOFOLLOW|O_DIRECTORY
// (a link there fails with ENOTDIR), the last component with O_NOFOLLOW,
// and names leaving the root are refused with EXDEV as RESOLVE_BENEATH does.
func (s *Store) walkOpen(rel string, flags int, mode uint32) (int, error) {
	rel = path.Clean(rel)
	if path.IsAbs(rel) || rel == ".." || strings.HasPrefix(rel, "../") {
		return -1, unix.EXDEV
	}
	dir := s.rootFD
	defer func() {
		if dir != s.rootFD {
			unix.Close(dir)
		}
	}()
	parts := strings.Split(rel, "/")
	for _, name := range parts[:len(parts)-1] {
		next, err := unix.Openat(dir, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return -1, err
		}
		if dir != s.rootFD {
			unix.Close(dir)
		}
		dir = next
	}
	return unix.Openat(dir, parts[len(parts)-1], flags|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
}

// OpenAt opens a store-relative path beneath the root (O_NOFOLLOW and
// O_CLOEXEC added) without following a link in any component: the mount's
// operations on names outside the block layout resolve them through it.
func (s *Store) OpenAt(rel string, flags int, mode uint32) (int, error) {
	return s.openat(rel, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
}

// OpenParent opens the directory holding rel (O_PATH) beneath the root
// without following links, and returns it with rel's last component: the
// *at calls on that name then act inside the store whatever someone swapped
// into its path. The caller closes dirfd.
func (s *Store) OpenParent(rel string) (dirfd int, name string, err error) {
	dirfd, err = s.openDir(rel)
	return dirfd, path.Base(rel), err
}

// Lstat reads the attributes of a store-relative name without following a
// link in any component.
func (s *Store) Lstat(rel string) (unix.Stat_t, error) {
	var st unix.Stat_t
	fd, err := s.OpenAt(rel, unix.O_PATH, 0)
	if err != nil {
		return st, err
	}
	defer unix.Close(fd)
	err = unix.Fstat(fd, &st)
	return st, err
}

// openDir opens the directory holding rel, for the *at calls that publish a
// block: the name a rename acts on is then resolved in that directory only.
func (s *Store) openDir(rel string) (int, error) {
	return s.openat(path.Dir(rel), unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
}

// fileID is a file's identity.
type fileID struct{ dev, ino uint64 }

// nameID returns the identity of what name in directory dirfd is now,
// without following a link.
func nameID(dirfd int, name string) (fileID, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fileID{}, err
	}
	return fileID{st.Dev, st.Ino}, nil
}

// unlink removes a store-relative name in its directory, opened without
// following links, so that a directory of the layout replaced by a link
// never leads a removal out of the store.
func (s *Store) unlink(rel string) error {
	dirfd, err := s.openDir(rel)
	if err != nil {
		return err
	}
	defer unix.Close(dirfd)
	return unix.Unlinkat(dirfd, path.Base(rel), 0)
}
