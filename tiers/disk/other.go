package disk

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// Files outside the block layout (config.json, the O_DIRECT probe, an
// evictor's lock files, anything else written through the mount) count
// against the capacity with what they allocate, so no byte the mount writes
// escapes --capacity or fills the store filesystem (DESIGN "Threat model").
// They are counted per inode: hard links and renames change nothing, and a
// file stops counting when its last name goes.
//
// The table of them is bounded (Config.MaxOtherFiles): a file takes a place
// when it first allocates bytes, and a write that would take one past the
// bound is refused with EDQUOT (ReserveOther). A file found past the bound
// (at Open, or a tmp renamed out of the layout) has its bytes counted once,
// untracked, until the next Open: too much, never too little.

// ReserveOther makes room for n more bytes of the regular file st, named
// rel, outside the block layout before they are written, evicting blocks if
// needed. It fails with EDQUOT when the file holds no place in the table and
// the table is full, and with ENOSPC, evicting nothing, when the bytes
// cannot fit. SettleOther then replaces the reservation with what the file
// allocates.
func (s *Store) ReserveOther(n int64, st *unix.Stat_t, rel string) error {
	id := fileID{dev: st.Dev, ino: st.Ino}
	s.mu.Lock()
	_, tracked := s.others[id]
	if !tracked {
		if len(s.others) >= s.cfg.MaxOtherFiles {
			s.mu.Unlock()
			s.counters.OtherFilesRefused.Add(1)
			return newError("write", rel, syscall.EDQUOT,
				"the store already tracks %d files outside the block layout, its bound: remove some of them", s.cfg.MaxOtherFiles)
		}
		s.others[id] = 0 // the file's place, until SettleOther
	}
	s.mu.Unlock()
	err := s.reserve(n, rel)
	if err != nil && !tracked {
		s.mu.Lock()
		if s.others[id] == 0 {
			delete(s.others, id)
		}
		s.mu.Unlock()
	}
	return err
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
	s.countOtherLocked(st, reserved > 0)
}

// countOtherLocked sets the bytes a regular file outside the block layout
// counts against the capacity to what it allocates. Past the table's
// bound, a file holding no place is counted once, untracked, when its bytes
// must count (found, or just written); otherwise it is left as it is.
func (s *Store) countOtherLocked(st *unix.Stat_t, mustCount bool) {
	id := fileID{dev: st.Dev, ino: st.Ino}
	allocated := st.Blocks * 512
	counted, tracked := s.others[id]
	if !tracked && allocated > 0 && len(s.others) >= s.cfg.MaxOtherFiles {
		if mustCount {
			s.used += allocated
			s.othersUntracked++
		}
		return
	}
	s.used += allocated - counted
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

// countOtherFileLocked counts the regular file rel, found outside the block
// layout.
func (s *Store) countOtherFileLocked(rel string) {
	if st, err := s.Lstat(rel); err == nil && st.Mode&unix.S_IFMT == unix.S_IFREG {
		s.countOtherLocked(&st, true)
	}
}
