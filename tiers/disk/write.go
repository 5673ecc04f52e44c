package disk

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// Writer writes one block tmp file. The engine writes a row with one write()
// that the kernel splits into sequential requests, or passes it to the file
// without the daemon (Passthrough); writes out of order, a truncate and
// fallocate are taken too. The tmp file's mutex serialises writes against
// each other and against Publish, which seals the tmp: the kernel releases a
// closed descriptor asynchronously, so the rename may arrive before the release.
type Writer struct {
	s    *Store
	rel  string
	tmp  *tmpFile
	file *os.File
	// direct is set for O_DIRECT writes, which go through bounce, a
	// page-aligned buffer of the store's recycled ones taken at the first
	// write (FUSE hands the daemon unaligned request payloads).
	direct bool
	bounce []byte
}

// bounceBytes is the size of an O_DIRECT writer's bounce buffer: one FUSE
// request of the mount's default --max-request.
const bounceBytes = 4 << 20

// tmpOpenFlags are the caller's open flags CreateTmp honours.
const tmpOpenFlags = syscall.O_EXCL | syscall.O_DIRECT | syscall.O_SYNC | syscall.O_DSYNC

// CreateTmp creates the tmp file of a block (a block.TmpFile path) with the caller's
// open flags: O_EXCL, O_TRUNC and the sync flags are honoured, others dropped,
// and O_DIRECT kept, so an engine writing O_DIRECT writes to the disk as it
// would without the mount, not into dirty pages the kernel then throttles. The
// file is created private to the store's owner (PrivateFileMode), whatever
// mode the engine asked for. The name is resolved without following links,
// and what it opens must be a regular file no other name links to; the store
// keeps its descriptor until the tmp is published or removed.
func (s *Store) CreateTmp(rel string, flags int) (*Writer, error) {
	kind, name := block.Parse(rel)
	if kind != block.TmpFile {
		return nil, newError("create", rel, syscall.EINVAL, "not a block tmp file name")
	}
	s.sweepTmps()
	// O_TRUNC waits until the file is known to be the tmp's own.
	truncate := flags&syscall.O_TRUNC != 0
	flags = flags&tmpOpenFlags | syscall.O_CREAT | syscall.O_RDWR
	if flags&syscall.O_EXCL == 0 {
		// An existing name may be a FIFO: do not wait on it.
		flags |= syscall.O_NONBLOCK
	}
	s.mu.Lock()
	if t, ok := s.tmps[rel]; ok && t.open || s.creating[rel] {
		s.mu.Unlock()
		return nil, newError("create", rel, syscall.EBUSY, "tmp file is already open for writing")
	}
	// The file is created outside the lock (a create waits on the store
	// filesystem's journal, which would stall every other request); a
	// publish of the same tmp name meanwhile is refused.
	s.creating[rel] = true
	s.mu.Unlock()
	opened := time.Now()
	f, direct, id, size, err := s.openTmp(rel, flags, truncate)
	var lease *os.File
	if err == nil {
		lease = s.leaseTmp(f)
	}
	s.TimePhase(PhaseCreateFile, opened)
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.creating, rel)
	if err != nil {
		return nil, err
	}
	if old, ok := s.tmps[rel]; ok {
		s.untrackLocked(rel, old)
		if old.mu.TryLock() {
			old.closeIfRetired()
			old.mu.Unlock()
		}
	}
	t := &tmpFile{file: f, id: id, size: size, allocated: size, sequential: size == 0, open: true, lease: lease}
	t.cover(0, size) // what the file held before is the tmp's
	if rowBytes, ok := s.rowBytes[name.Tier]; ok && size == 0 {
		t.expect = rowBytes
		t.probes = make(map[int64]uint64)
	}
	s.used += size
	if _, had := s.tmps[rel]; !had {
		s.countUnderLocked(rel, 1)
	}
	s.tmps[rel] = t
	return &Writer{s: s, rel: rel, tmp: t, file: f, direct: direct}, nil
}

// openTmp opens (creating it) the tmp file rel and checks that it is a file
// of its own, made private to the store; direct is whether it is open
// O_DIRECT. A new file is created private, and an empty one is not
// truncated: each metadata change costs the store filesystem's journal.
func (s *Store) openTmp(rel string, flags int, truncate bool) (f *os.File, direct bool, id fileID, size int64, err error) {
	direct = flags&syscall.O_DIRECT != 0
	f, err = s.openFile(rel, flags, PrivateFileMode)
	if direct && errors.Is(err, syscall.EINVAL) {
		// The store filesystem has no O_DIRECT (tmpfs): write through its cache.
		direct = false
		f, err = s.openFile(rel, flags&^syscall.O_DIRECT, PrivateFileMode)
	}
	if err != nil {
		return nil, false, fileID{}, 0, err
	}
	var st unix.Stat_t
	err = unix.Fstat(int(f.Fd()), &st)
	if err == nil && (st.Mode&unix.S_IFMT != unix.S_IFREG || st.Nlink != 1) {
		err = newError("create", rel, syscall.EPERM, "the tmp name holds something else than a file of its own (a hard link, a FIFO, a device)")
	}
	if err == nil && !s.isPrivate(&st, PrivateFileMode) {
		err = s.MakePrivate(int(f.Fd()), PrivateFileMode)
	}
	if err == nil && flags&syscall.O_NONBLOCK != 0 {
		err = setFlag(int(f.Fd()), syscall.O_NONBLOCK, false)
	}
	size = st.Size
	if err == nil && truncate && size > 0 {
		err = f.Truncate(0)
		size = 0
	}
	if err != nil {
		f.Close()
		return nil, false, fileID{}, 0, err
	}
	id = fileID{st.Dev, st.Ino}
	return f, direct, id, size, nil
}

// Fd is the tmp's store file, open until Close: the mount answers the
// CREATE's entry from it (fstat) rather than by resolving the name again.
func (w *Writer) Fd() int { return int(w.file.Fd()) }

// WriteAt appends p at off, which must be the current end of the file. On a
// failed or short store write, the tmp's size and checksum cover only the
// bytes that landed, and the capacity reserved for the rest is returned.
func (w *Writer) WriteAt(p []byte, off int64) (int, error) {
	w.tmp.mu.Lock()
	defer w.tmp.mu.Unlock()
	if w.file == nil {
		return 0, newError("write", w.rel, syscall.EBADF, "tmp file is closed")
	}
	if w.tmp.sealed {
		return 0, newError("write", w.rel, syscall.EBADF, "tmp file was already renamed to its block, which is immutable")
	}
	w.leavePassthroughLocked()
	if !w.tmp.canCover(off, off+int64(len(p))) {
		w.s.counters.RejectedWrites.Add(1)
		return 0, newError("write", w.rel, syscall.EDQUOT, "the tmp's writes left %d disjoint byte ranges, the most a tmp may have", maxTmpRanges)
	}
	w.tmp.attempted = max(w.tmp.attempted, off+int64(len(p)))
	if off != w.tmp.size {
		// Out of order (or after a truncate): the checksum and probe
		// windows are read from the file at the rename.
		w.tmp.sequential = false
	}
	// All-zero pages are left as holes in the store file, so sparse rows
	// (the zero slots of other nodes) cost no disk.
	runs := block.NonZeroRuns(p, off)
	var data int64
	for _, r := range runs {
		data += int64(r.End - r.Start)
	}
	if err := w.s.reserve(data, w.rel); err != nil {
		return 0, err
	}
	n := len(p)
	var written int64
	var werr error
	for _, r := range runs {
		landed, err := w.pwrite(p[r.Start:r.End], off+int64(r.Start))
		written += int64(landed)
		if err != nil {
			n, werr = r.Start+landed, err
			break
		}
	}
	w.s.mu.Lock()
	w.tmp.allocated += written
	w.s.used -= data - written // reserved for bytes that never landed
	w.s.mu.Unlock()
	if w.tmp.sequential {
		w.tmp.sum.Write(p[:n])
		w.tmp.captureProbes(p[:n], off)
	}
	w.tmp.size = max(w.tmp.size, off+int64(n))
	w.tmp.cover(off, off+int64(n))
	if werr != nil {
		if why := refusedWrite(werr, off+int64(len(p))); why != "" {
			w.s.counters.RejectedWrites.Add(1)
			return n, newError("write", w.rel, Errno(werr), "store write refused after %d of %d bytes: %s (%v)", n, len(p), why, werr)
		}
		w.s.counters.IOErrors.Add(1)
		return n, newError("write", w.rel, Errno(werr), "store write failed after %d of %d bytes: %v", n, len(p), werr)
	}
	w.s.counters.WriteBytes.Add(int64(n))
	return n, nil
}

// refusedWrite says why the store filesystem's err for a write ending at
// end was the caller's request, not a fault of the store ("" where it was
// one). A write past the largest file the store filesystem holds (EFBIG;
// ext4's is 16 TiB at 4 KiB blocks, and FUSE passes offsets up to 8 EiB)
// or one it finds invalid (EINVAL) is the engine's doing, and counted as a
// rejected write: the engine's uid could otherwise raise store_io_errors,
// whose warning sends the operator to the disk. EFBIG past the daemon's
// own file size limit (RLIMIT_FSIZE, the operator's) is the store's side,
// as is every other errno (EIO, ENOSPC, EDQUOT of a filesystem quota).
func refusedWrite(err error, end int64) string {
	switch {
	case errors.Is(err, syscall.EFBIG):
		var lim unix.Rlimit
		if unix.Getrlimit(unix.RLIMIT_FSIZE, &lim) == nil && lim.Cur != unix.RLIM_INFINITY && uint64(end) > lim.Cur {
			return ""
		}
		return fmt.Sprintf("the write ends at %d bytes, past the largest file the store filesystem holds", end)
	case errors.Is(err, syscall.EINVAL):
		return "the store filesystem found the write invalid"
	}
	return ""
}

// pwriteAt is the store's positioned write, a variable so that tests can
// make the store filesystem fail or write short.
var pwriteAt = unix.Pwrite

// pwriteFull writes all of data at off, going on after a short write; a
// write that makes no progress fails. It returns the bytes that landed.
func pwriteFull(fd int, data []byte, off int64) (int, error) {
	done := 0
	for done < len(data) {
		n, err := pwriteAt(fd, data[done:], off+int64(done))
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return done, err
		}
		if n <= 0 {
			return done, io.ErrShortWrite
		}
		done += n
	}
	return done, nil
}

// pwrite writes data at off, through the bounce buffer for O_DIRECT; a piece
// O_DIRECT cannot take (not page aligned) is written buffered. It returns the
// bytes that landed.
func (w *Writer) pwrite(data []byte, off int64) (int, error) {
	fd := int(w.file.Fd())
	if w.direct && w.bounce == nil {
		w.bounce = w.s.buffers.get(bounceBytes)
	}
	if !w.direct || off%int64(block.PageSize) != 0 || len(data)%block.PageSize != 0 {
		if w.direct {
			if err := setFlag(fd, unix.O_DIRECT, false); err != nil {
				return 0, err
			}
			defer setFlag(fd, unix.O_DIRECT, true)
		}
		return pwriteFull(fd, data, off)
	}
	done := 0
	for done < len(data) {
		chunk := copy(w.bounce, data[done:])
		n, err := pwriteFull(fd, w.bounce[:chunk], off+int64(done))
		done += n
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

// setDirect turns O_DIRECT on or off for an open file.
func setDirect(fd int, on bool) error { return setFlag(fd, unix.O_DIRECT, on) }

// setFlag turns a file status flag (O_DIRECT, O_NONBLOCK) on or off for an open file.
func setFlag(fd int, flag int, on bool) error {
	flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		return err
	}
	if on {
		flags |= flag
	} else {
		flags &^= flag
	}
	_, err = unix.FcntlInt(uintptr(fd), unix.F_SETFL, flags)
	return err
}

// maxTmpRanges bounds the disjoint byte ranges a tmp's writes leave: an
// engine's writes of a row leave one, or a few while the kernel's requests
// of one write land out of order. Writes of one byte every other byte left
// one range each, and the merge of each new write with all of them made a
// tmp's writes quadratic (50,000 took 43 s, the last 10,000 12 s).
const maxTmpRanges = 4096

// canCover reports whether a write of [start, end) may be recorded: it
// touches a range already written, or the tmp has room for one more.
func (t *tmpFile) canCover(start, end int64) bool {
	if start >= end || len(t.written) < maxTmpRanges {
		return true
	}
	i, j := t.touching(start, end)
	return i < j
}

// touching returns the ranges written that [start, end) overlaps or
// adjoins: t.written[i:j].
func (t *tmpFile) touching(start, end int64) (i, j int) {
	i, _ = slices.BinarySearchFunc(t.written, start, func(sp [2]int64, at int64) int { return cmp.Compare(sp[1], at) })
	j = i
	for j < len(t.written) && t.written[j][0] <= end {
		j++
	}
	return i, j
}

// cover records that [start, end) of the tmp was written, merged with the
// ranges it touches; the ranges stay sorted and disjoint.
func (t *tmpFile) cover(start, end int64) {
	if start >= end {
		return
	}
	i, j := t.touching(start, end)
	if i < j {
		start, end = min(start, t.written[i][0]), max(end, t.written[j-1][1])
	}
	t.written = slices.Replace(t.written, i, j, [2]int64{start, end})
}

// uncoverFrom forgets what was written at and after end (a truncate).
func (t *tmpFile) uncoverFrom(end int64) {
	kept := t.written[:0]
	for _, sp := range t.written {
		if sp[0] < end {
			kept = append(kept, [2]int64{sp[0], min(sp[1], end)})
		}
	}
	t.written = kept
	t.attempted = min(t.attempted, end)
}

// coversAll reports whether every byte of the tmp, and every byte a write
// was asked for, was written: a write refused and never retried leaves a gap.
func (t *tmpFile) coversAll() bool {
	return len(t.written) == 1 && t.written[0] == [2]int64{0, max(t.size, t.attempted)}
}

// captureProbes keeps the digest's probe windows of a tmp whose final size is
// expected to be its tier's row size, so Publish need not read them back.
func (t *tmpFile) captureProbes(p []byte, off int64) {
	if t.probes == nil {
		return
	}
	for _, o := range block.ProbeOffsets(t.expect) {
		if o >= off && o+8 <= off+int64(len(p)) {
			t.probes[o] = binary.LittleEndian.Uint64(p[o-off:])
		}
	}
}

// Close ends the writer; the tmp stays ready for Publish or RemoveTmp, which
// work on the descriptor the store keeps (buffered from now on), and it is
// removed if no rename comes within Config.TmpMaxAge.
func (w *Writer) Close() error {
	w.tmp.mu.Lock()
	defer w.tmp.mu.Unlock()
	if w.file == nil {
		return nil
	}
	var err error
	if w.direct {
		err = setDirect(int(w.file.Fd()), false)
	}
	if w.bounce != nil {
		w.s.buffers.put(w.bounce)
		w.bounce = nil
	}
	w.file = nil
	w.s.mu.Lock()
	if w.tmp.passthrough {
		w.s.settlePassthroughLocked(w.tmp)
		close(w.tmp.released)
	}
	w.tmp.open = false
	w.tmp.closedAt = w.s.nowNano()
	if w.tmp.orphaned {
		w.s.used -= w.tmp.allocated
	}
	if w.tmp.passthrough {
		w.s.dropOvergrownLocked(w.rel, w.tmp)
	}
	w.tmp.closeIfRetired()
	w.s.mu.Unlock()
	return err
}

// untrackLocked stops tracking a tmp file: its bytes leave the capacity now,
// or when its writer closes it if it is still open.
func (s *Store) untrackLocked(rel string, t *tmpFile) {
	if s.tmps[rel] == t {
		s.countUnderLocked(rel, -1)
		delete(s.tmps, rel)
	}
	t.untracked = true
	t.giveBackLeaseLocked()
	if t.open {
		t.orphaned = true
	} else {
		s.used -= t.allocated
	}
}

// closeIfRetired closes the tmp's descriptor once the store no longer tracks
// the tmp and no writer holds it. The caller holds t.mu and Store.mu.
func (t *tmpFile) closeIfRetired() {
	if t.untracked && !t.open && t.file != nil {
		t.file.Close()
		t.file = nil
	}
}

// sweepInterval is how often CreateTmp looks for expired tmp files.
const sweepInterval = time.Second

// sweepTmps expires tmp files at most once per sweepInterval.
func (s *Store) sweepTmps() {
	now := s.nowNano()
	last := s.lastSweep.Load()
	if now-last < int64(sweepInterval) || !s.lastSweep.CompareAndSwap(last, now) {
		return
	}
	s.expireTmps()
}

// expireTmps removes the tmp files whose writer closed them more than
// Config.TmpMaxAge ago and that were never renamed (their writer was killed
// or gave up), returning their bytes to the capacity. A tmp whose mutex is
// held (a Publish in progress) is left for the next sweep. It returns how
// many it removed.
func (s *Store) expireTmps() int {
	now := s.nowNano()
	type stale struct {
		rel string
		t   *tmpFile
	}
	var found []stale
	s.mu.Lock()
	for rel, t := range s.tmps {
		if !t.open && now-t.closedAt > int64(s.cfg.TmpMaxAge) {
			found = append(found, stale{rel, t})
		}
	}
	s.mu.Unlock()
	removed := 0
	for _, st := range found {
		if !st.t.mu.TryLock() {
			continue
		}
		s.mu.Lock()
		if s.tmps[st.rel] == st.t && !st.t.open {
			if err := s.unlinkTmpLocked(st.rel, st.t); err != nil {
				s.cfg.Logger.Warn("removing expired tmp file", "path", s.Path(st.rel), "err", err)
			}
			s.untrackLocked(st.rel, st.t)
			st.t.closeIfRetired()
			s.counters.TmpsExpired.Add(1)
			removed++
			s.cfg.Logger.Warn("removed a tmp file its writer closed but never renamed", "path", s.Path(st.rel),
				"bytes", st.t.allocated, "closed_for", time.Duration(now-st.t.closedAt).String())
		}
		s.mu.Unlock()
		st.t.mu.Unlock()
	}
	return removed
}

// unlinkTmpLocked unlinks a tmp's name if it still names the file written.
func (s *Store) unlinkTmpLocked(rel string, t *tmpFile) error {
	dirfd, err := s.openDir(rel)
	if err != nil {
		return err
	}
	defer unix.Close(dirfd)
	base := path.Base(rel)
	if id, err := nameID(dirfd, base); err != nil || id != t.id {
		return err
	}
	return unix.Unlinkat(dirfd, base, 0)
}

// reserve makes room for n more bytes, evicting blocks if needed; it fails with
// ENOSPC, evicting nothing, when the capacity or the filesystem reserve cannot
// be met even after expiring abandoned tmp files.
func (s *Store) reserve(n int64, forRel string) error {
	err := s.reserveOnce(n, forRel)
	if errors.Is(err, syscall.ENOSPC) && s.expireTmps() > 0 {
		err = s.reserveOnce(n, forRel)
	}
	if err != nil {
		s.counters.NoSpace.Add(1)
	}
	return err
}

func (s *Store) reserveOnce(n int64, forRel string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.makeRoomLocked(n, forRel); err != nil {
		return err
	}
	s.used += n
	return nil
}

// limitLocked is the number of bytes the store may use now: the capacity, or
// less when the filesystem is filling up from outside. It asks through the
// root's descriptor: no path is resolved under the store's lock.
func (s *Store) limitLocked() int64 {
	var st unix.Statfs_t
	if err := unix.Fstatfs(s.rootFD, &st); err != nil {
		return s.capacity
	}
	avail := int64(st.Bavail) * st.Bsize
	return min(s.capacity, s.used+avail-s.fsReserve)
}

// digest builds the published block's digest from the probe windows captured
// while it was written, or by reading them from the file.
func (t *tmpFile) digest(f *os.File, sum *block.Sum) (block.Digest, error) {
	offsets := block.ProbeOffsets(t.size)
	if t.expect != t.size || !t.sequential || len(t.probes) != len(offsets) {
		return digestFile(f, sum)
	}
	return block.NewDigest(sum, func(off int64) (uint64, error) { return t.probes[off], nil })
}

// RemoveTmp unlinks a tmp file and returns its bytes to the capacity.
func (s *Store) RemoveTmp(rel string) error {
	s.mu.Lock()
	t := s.tmps[rel]
	s.mu.Unlock()
	if t != nil {
		t.mu.Lock()
		defer t.mu.Unlock()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.unlink(rel); err != nil {
		return err
	}
	if t != nil && s.tmps[rel] == t {
		s.untrackLocked(rel, t)
		t.closeIfRetired()
	}
	return nil
}

// ForgetTmp stops tracking a tmp file that was renamed to renamedTo, a name
// outside the block layout: its bytes now count as that file's (other.go).
func (s *Store) ForgetTmp(rel, renamedTo string) {
	s.mu.Lock()
	t := s.tmps[rel]
	s.mu.Unlock()
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tmps[rel] == t {
		s.untrackLocked(rel, t)
		t.closeIfRetired()
		s.countOtherFileLocked(renamedTo)
	}
}

// TmpOpen reports whether rel is a tracked tmp file its writer still holds
// open: the kernel may write it until the release, so only a publication,
// which awaits that, may move it (a tmp renamed elsewhere would be written
// on past the store's accounting).
func (s *Store) TmpOpen(rel string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.tmps[rel]
	return t != nil && t.open
}

// IsTracked reports whether rel is a tmp file being written through the store.
func (s *Store) IsTracked(rel string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.tmps[rel]
	return ok
}

// Remove unlinks a block at the engine's request.
func (s *Store) Remove(rel string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.unlink(rel); err != nil {
		return err
	}
	if b := s.blocks[rel]; b != nil {
		s.dropLocked(b)
		s.queue(Event{Kind: Unlinked, Rel: rel})
	}
	return nil
}

// Truncate sets the tmp's size, as an engine sizing the file to its row
// before writing does; the checksum is then read from the file at the rename.
func (w *Writer) Truncate(size int64) error {
	w.tmp.mu.Lock()
	defer w.tmp.mu.Unlock()
	if err := w.writableLocked("truncate"); err != nil {
		return err
	}
	if err := w.file.Truncate(size); err != nil {
		return err
	}
	if size != w.tmp.size {
		w.tmp.sequential = false
	}
	if size < w.tmp.size {
		w.tmp.uncoverFrom(size)
	}
	w.tmp.size = size
	return nil
}

// Allocate runs fallocate(2) on the tmp, counting what it allocates against
// the capacity first; a passthrough tmp's row is counted already.
func (w *Writer) Allocate(off, size int64, mode uint32) error {
	w.tmp.mu.Lock()
	defer w.tmp.mu.Unlock()
	if err := w.writableLocked("fallocate"); err != nil {
		return err
	}
	t := w.tmp
	reserved := size
	if mode&(unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_COLLAPSE_RANGE) != 0 || t.passthrough && off+size <= t.expect {
		reserved = 0
	}
	if reserved > 0 {
		if err := w.s.reserve(reserved, w.rel); err != nil {
			return err
		}
	}
	err := unix.Fallocate(int(w.file.Fd()), mode, off, size)
	w.s.mu.Lock()
	if err != nil {
		w.s.used -= reserved
	} else {
		t.allocated += reserved
	}
	w.s.mu.Unlock()
	if err != nil {
		return err
	}
	if mode&unix.FALLOC_FL_KEEP_SIZE == 0 && off+size > t.size {
		t.size = off + size
		t.sequential = false
	}
	if mode&(unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_ZERO_RANGE) != 0 {
		// Bytes already written may be zeros now: the checksum taken as
		// they arrived no longer holds, it is read from the file.
		t.sequential = false
	}
	return nil
}

// writableLocked checks that the tmp still takes changes. The caller holds t.mu.
func (w *Writer) writableLocked(op string) error {
	if w.file == nil {
		return newError(op, w.rel, syscall.EBADF, "tmp file is closed")
	}
	if w.tmp.sealed {
		return newError(op, w.rel, syscall.EBADF, "tmp file was already renamed to its block, which is immutable")
	}
	return nil
}

// Sync flushes the tmp file to stable storage.
func (w *Writer) Sync() error {
	w.tmp.mu.Lock()
	defer w.tmp.mu.Unlock()
	if w.file == nil {
		return nil
	}
	return w.file.Sync()
}
