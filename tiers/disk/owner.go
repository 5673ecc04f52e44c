package disk

import (
	"fmt"
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
