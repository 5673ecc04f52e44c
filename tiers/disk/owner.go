package disk

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// Owner is the engine's user: the store root, block tmp files and the
// blocks they become belong to it, readable by it and root only (DESIGN
// "Threat model").
type Owner struct {
	UID, GID int
}

// Modes of what the store creates: private to the owner.
const (
	// PrivateFileMode is the mode of block tmp files and blocks.
	PrivateFileMode = 0o600
	// PrivateDirMode is the mode of the store root.
	PrivateDirMode = 0o700
)

// Owner is the user the store gives its files to: Config.Owner, else the
// daemon's own user.
func (s *Store) Owner() Owner {
	if s.cfg.Owner != nil {
		return *s.cfg.Owner
	}
	return Owner{UID: os.Geteuid(), GID: os.Getegid()}
}

// MakePrivate gives an open file or directory to the store's owner with
// mode (PrivateFileMode, PrivateDirMode for the store's own), through its
// descriptor so that nothing swapped in at its path is touched.
func (s *Store) MakePrivate(fd int, mode uint32) error {
	if s.cfg.Owner != nil {
		if err := unix.Fchown(fd, s.cfg.Owner.UID, s.cfg.Owner.GID); err != nil {
			return fmt.Errorf("giving a store file to uid %d: %w", s.cfg.Owner.UID, err)
		}
	}
	return unix.Fchmod(fd, mode)
}

// isPrivate reports whether a file with status st already belongs to the
// store's owner with exactly mode, so MakePrivate would change nothing.
func (s *Store) isPrivate(st *unix.Stat_t, mode uint32) bool {
	owner := s.Owner()
	return int(st.Uid) == owner.UID && int(st.Gid) == owner.GID && st.Mode&0o7777 == mode
}

// refuseTakeoverThroughLink refuses to take over an empty directory of
// another user that the store's path reached through a link in a
// directory above it: the engine's uid, owning a directory on the way
// (--store /data/engine/x/kvtier), can make it a link to a directory of
// root's where an empty directory of that name waits (/usr/local/bin, or
// /etc/cron.d on a bare system), which Open then gave to the engine with
// mode 0700. Only a link puts another user's directory at a path the
// engine's uid can change: renames need write access where it stood.
func (s *Store) refuseTakeoverThroughLink(rootFD int) error {
	reached, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", rootFD))
	if err != nil {
		return fmt.Errorf("store directory %s: %w", s.root, err)
	}
	if reached == s.root {
		return nil
	}
	return fmt.Errorf("store directory %s is reached through a link (it is %s) and belongs to another user than the engine's uid %d: "+
		"another user's directory is taken over only when named by its own path; give --store %s if it is meant, or chown it to the engine's uid first",
		s.root, reached, s.Owner().UID, reached)
}

// refuseTakeover refuses a store directory that holds files and belongs to
// another user than the store's owner: Open would give it, and every file
// it indexes or removes, to the engine's uid (a mistyped --store of a home
// directory, or of a root directory such as /etc for a non-root engine).
// An empty directory, or the owner's own store, is taken.
func (s *Store) refuseTakeover(rootFD int) error {
	var st unix.Stat_t
	if err := unix.Fstat(rootFD, &st); err != nil {
		return fmt.Errorf("store directory %s: %w", s.root, err)
	}
	owner := s.Owner()
	if int(st.Uid) == owner.UID {
		return nil
	}
	fd, err := unix.Openat(rootFD, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("store directory %s: %w", s.root, err)
	}
	dir := os.NewFile(uintptr(fd), s.root)
	defer dir.Close()
	names, err := dir.Readdirnames(1)
	if errors.Is(err, io.EOF) {
		return s.refuseTakeoverThroughLink(rootFD)
	}
	if err != nil {
		return fmt.Errorf("store directory %s: %w", s.root, err)
	}
	return fmt.Errorf("store directory %s belongs to uid %d, not to the engine's uid %d, and holds files (%q first): "+
		"the store would give it and them to uid %d, so another user's directory is never taken over; "+
		"if it is this tier's store, chown -R %d:%d %s (or pass the --engine-uid that owns it), else choose a new or empty directory",
		s.root, st.Uid, owner.UID, names[0], owner.UID, owner.UID, owner.GID, s.root)
}
