package disk

import (
	"golang.org/x/sys/unix"
)

// Files outside the block layout (config.json, the O_DIRECT probe, an
// evictor's lock files, anything else written through the mount) count
// against the capacity with what they allocate, so no byte the mount writes
// escapes --capacity or fills the store filesystem (DESIGN "Threat model").
// They are counted per inode: hard links and renames change nothing, and a
// file stops counting when its last name goes.

// ReserveOther makes room for n more bytes of the file rel outside the block
// layout before they are written, evicting blocks if needed; it fails with
// ENOSPC, evicting nothing, when they cannot fit. SettleOther then replaces
// the reservation with what the file allocates.
func (s *Store) ReserveOther(n int64, rel string) error {
	return s.reserve(n, rel)
}

// SettleOther records what a file outside the block layout allocates now,
// from its stat, and returns the bytes ReserveOther reserved for the write
// that just ended.
func (s *Store) SettleOther(st *unix.Stat_t, reserved int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.used -= reserved
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return
	}
	s.countOtherLocked(st)
}

// countOtherLocked sets the bytes a regular file outside the block layout
// counts against the capacity to what it allocates.
func (s *Store) countOtherLocked(st *unix.Stat_t) {
	id := fileID{dev: st.Dev, ino: st.Ino}
	allocated := st.Blocks * 512
	s.used += allocated - s.others[id]
	if allocated == 0 {
		delete(s.others, id)
	} else {
		s.others[id] = allocated
	}
}

// RemovingOther is called before a file outside the block layout is
// unlinked or renamed over; the returned function, called once that
// succeeded, stops counting the file if rel was its last name.
func (s *Store) RemovingOther(rel string) (gone func()) {
	st, err := s.Lstat(rel)
	if err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Nlink > 1 {
		return func() {}
	}
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		id := fileID{dev: st.Dev, ino: st.Ino}
		s.used -= s.others[id]
		delete(s.others, id)
	}
}

// countOtherFile counts a regular file found outside the block layout when
// the store is indexed.
func (s *Store) countOtherFile(rel string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.countOtherFileLocked(rel)
}

// countOtherFileLocked counts the regular file rel outside the block layout.
func (s *Store) countOtherFileLocked(rel string) {
	if st, err := s.Lstat(rel); err == nil && st.Mode&unix.S_IFMT == unix.S_IFREG {
		s.countOtherLocked(&st)
	}
}
