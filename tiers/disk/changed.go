package disk

import "golang.org/x/sys/unix"

// A block that fails its checksum is told apart by its file (DESIGN "Threat
// model"): the engine's uid owns the store tree and can rewrite a block
// there, which is no disk fault. Every change to an inode moves its change
// time (a write, a truncate, an xattr, a chmod, a link, utimensat), which no
// user can set back, and a rename over the name brings another inode; a
// disk that changes a file's bytes moves neither. So the store keeps, for
// each block, its file as the daemon last saw or changed it (entry.seen):
// at its publish, at mount, and after each change of its own (ownChange).
// A file that fails its checksum and differs from that was changed outside
// the daemon (Counters.ChangedOutside); one that does not counts as a
// checksum failure. A change within the same tick of the kernel's coarse
// clock as the daemon's last look leaves the change time as it was on a
// filesystem without fine-grained timestamps (before Linux 6.13): such a
// change counts as a checksum failure, as every one did before. So does a
// write through a writable shared mapping of the file taken before its
// publish, once its page is dirty: such writes fault no more and move no
// change time (on tmpfs, mapped writes never do).

// fileState is what tells a block's file changed: its inode (the store is
// one filesystem) and change time. A change of size moves the change time
// too, and the block's size is its entry's. The zero fileState is a file
// never seen (a stat that failed).
type fileState struct {
	ino   uint64
	ctime unix.Timespec
}

// stateOf is the fileState of a stat.
func stateOf(st *unix.Stat_t) fileState {
	return fileState{ino: st.Ino, ctime: st.Ctim}
}

// sameFile reports whether a stat of b's file is the file as the daemon
// last saw or changed it: the same state, at the block's size. The caller
// holds s.mu.
func (b *entry) sameFile(st *unix.Stat_t) bool {
	return stateOf(st) == b.seen && st.Size == b.size
}

// changedOutside reports whether the pinned block's file is another than
// the one the daemon last saw or changed, or was changed since.
func (r *Reader) changedOutside() bool {
	var st unix.Stat_t
	if err := unix.Fstat(int(r.file.Fd()), &st); err != nil {
		return false
	}
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	return r.b.seen != fileState{} && !r.b.sameFile(&st)
}

// ownChange runs change, the daemon's own change to the pinned block's
// file, and moves what the store saw of the file along with it, unless the
// file had changed outside the daemon before: that stays to be told. It
// returns the file's stat after the change. The daemon's changes to one
// block run one at a time (entry.changing), so that each one's before is
// the last one's after.
func (r *Reader) ownChange(change func(fd int) error) (unix.Stat_t, error) {
	s, fd := r.s, int(r.file.Fd())
	r.b.changing.Lock()
	defer r.b.changing.Unlock()
	var before, after unix.Stat_t
	beforeErr := unix.Fstat(fd, &before)
	err := change(fd)
	statErr := unix.Fstat(fd, &after)
	if statErr == nil {
		s.mu.Lock()
		if beforeErr == nil && r.b.sameFile(&before) {
			r.b.seen = stateOf(&after)
		}
		s.mu.Unlock()
	}
	if err == nil {
		err = statErr
	}
	return after, err
}
