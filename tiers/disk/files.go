package disk

import (
	"os"
	"path"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/tiers/internal/beneath"
)

// The store never follows a symbolic link, in any component of a path, nor
// leaves its root: anyone who can write through the mount can plant a link
// where a block or tmp file is expected (DESIGN "The store"). Every path is
// opened beneath the root's descriptor by tiers/internal/beneath (openat2,
// or a walk of O_NOFOLLOW opens where the kernel lacks it).

// openFile opens a store-relative path with flags (O_NOFOLLOW and O_CLOEXEC
// added) without following links.
func (s *Store) openFile(rel string, flags int, mode uint32) (*os.File, error) {
	fd, err := beneath.Open(s.rootFD, rel, flags, mode)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: s.Path(rel), Err: err}
	}
	return os.NewFile(uintptr(fd), s.Path(rel)), nil
}

// errNotRegular is the error of OpenFile and openForReading where the name
// holds something else than a regular file.
var errNotRegular = unix.ESTALE

// OpenFile opens the regular file at a store-relative path beneath the root
// as OpenAt does, without waiting on what else the name may hold: the
// engine's uid can swap a FIFO in beside the mount, whose open held a
// daemon thread, and the request's caller, which the kernel then keeps
// unkillable, until a writer came (DESIGN "Threat model"). O_NONBLOCK keeps
// the open from waiting and is dropped once the descriptor is known to be
// a regular file's; anything else is closed and fails with errNotRegular
// (ESTALE: the kernel knows a regular file there).
func (s *Store) OpenFile(rel string, flags int, mode uint32) (int, error) {
	fd, err := beneath.Open(s.rootFD, rel, flags|unix.O_NONBLOCK, mode)
	if err != nil {
		return -1, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return -1, errNotRegular
	}
	if flags&unix.O_NONBLOCK == 0 {
		// F_SETFL takes the status flags as opened, less O_NONBLOCK.
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFL, flags); err != nil {
			unix.Close(fd)
			return -1, err
		}
	}
	return fd, nil
}

// OpenAt opens a store-relative path beneath the root (O_NOFOLLOW and
// O_CLOEXEC added) without following a link in any component: the mount's
// operations on names outside the block layout resolve them through it.
func (s *Store) OpenAt(rel string, flags int, mode uint32) (int, error) {
	return beneath.Open(s.rootFD, rel, flags, mode)
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
	return beneath.Open(s.rootFD, path.Dir(rel), unix.O_PATH|unix.O_DIRECTORY, 0)
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
