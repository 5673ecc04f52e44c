package disk

import (
	"errors"
	"os"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A block's times behave like a plain file's (DESIGN "Block times"): they
// live on its file, so they survive a restart; utimensat sets them; a load
// moves the access time under relatime's rule, so an evictor that orders
// blocks by atime over readdir and stat evicts the idle ones first.

// Times are a block file's access, modification and change times.
type Times struct{ Atime, Mtime, Ctime unix.Timespec }

// timesOf are the times of a stat.
func timesOf(st *unix.Stat_t) Times { return Times{Atime: st.Atim, Mtime: st.Mtim, Ctime: st.Ctim} }

// relatimeAge is how old an access time relatime lets stand.
const relatimeAge = 24 * time.Hour

// atimeStale reports whether a load at now moves the access time, as the
// kernel's relatime does for a plain file: when the access time is not later
// than the modification time, or a day old.
func atimeStale(t Times, now int64) bool {
	return t.Atime.Nano() <= t.Mtime.Nano() || now-t.Atime.Nano() >= int64(relatimeAge)
}

// futimens sets the times of an open file (utimensat with a NULL path, which
// acts on the descriptor itself); UTIME_NOW and UTIME_OMIT work as there.
func futimens(fd int, atime, mtime unix.Timespec) error {
	ts := [2]unix.Timespec{atime, mtime}
	_, _, errno := unix.Syscall6(unix.SYS_UTIMENSAT, uintptr(fd), 0, uintptr(unsafe.Pointer(&ts[0])), 0, 0, 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// Times returns a present block's times; ok is false for an absent block.
func (s *Store) Times(rel string) (t Times, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.blocks[rel]
	if b == nil {
		return Times{}, false
	}
	return b.times, true
}

// SetTimes sets a published block's access and modification times on its
// file (unix.UTIME_NOW and unix.UTIME_OMIT as in utimensat) and returns its
// times after.
func (s *Store) SetTimes(rel string, atime, mtime unix.Timespec) (Times, error) {
	r, err := s.PinBlock(rel)
	if err != nil {
		return Times{}, err
	}
	defer r.Close()
	return r.setTimes(atime, mtime)
}

// Accessed records a load of the pinned block: its access time moves to now
// when relatime would move a plain file's.
func (r *Reader) Accessed() error {
	r.s.mu.Lock()
	stale := atimeStale(r.b.times, r.s.nowNano())
	r.s.mu.Unlock()
	if !stale {
		return nil
	}
	_, err := r.setTimes(unix.Timespec{Nsec: unix.UTIME_NOW}, unix.Timespec{Nsec: unix.UTIME_OMIT})
	return err
}

// setTimes sets the pinned file's times and records them in its entry.
func (r *Reader) setTimes(atime, mtime unix.Timespec) (Times, error) {
	var set error
	st, err := r.ownChange(func(fd int) error {
		set = futimens(fd, atime, mtime)
		return set
	})
	if set != nil {
		return Times{}, newError("utimensat", r.b.rel, Errno(set), "setting the block's times: %v", set)
	}
	if err != nil {
		return Times{}, err
	}
	t := timesOf(&st)
	r.s.mu.Lock()
	r.b.times = t
	r.s.mu.Unlock()
	return t, nil
}

// openForReading opens a block file to read it without moving its access
// time (O_NOATIME, where the daemon owns the file or may act as its owner):
// only a load does, through Reader.Accessed. A name holding anything but a
// regular file (a FIFO swapped in) fails without waiting (OpenFile).
func (s *Store) openForReading(rel string) (*os.File, error) {
	fd, err := s.OpenFile(rel, unix.O_RDONLY|unix.O_NOATIME, 0)
	if errors.Is(err, unix.EPERM) {
		fd, err = s.OpenFile(rel, unix.O_RDONLY, 0)
	}
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: s.Path(rel), Err: err}
	}
	return os.NewFile(uintptr(fd), s.Path(rel)), nil
}
