package disk

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"os"
	"path"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/tiers/shm"
)

// Writer writes one block tmp file. The engine writes a row with one write()
// that the kernel splits into sequential requests; anything else is refused.
// The tmp file's mutex serialises writes against each other and against
// Publish, which seals the tmp: the kernel releases a closed descriptor
// asynchronously, so the rename may arrive before the release.
type Writer struct {
	s    *Store
	rel  string
	tmp  *tmpFile
	file *os.File
	// bounce is a page-aligned buffer for O_DIRECT writes (FUSE hands the
	// daemon unaligned request payloads); nil for buffered writes.
	bounce []byte
}

// bounceBytes is the size of an O_DIRECT writer's bounce buffer: one FUSE request.
const bounceBytes = 1 << 20

// CreateTmp creates the tmp file of a block (a BlockTmp path) with the caller's
// open flags: O_EXCL is honoured, O_APPEND dropped, and O_DIRECT kept, so an
// engine writing O_DIRECT writes to the disk as it would without the mount,
// not into dirty pages the kernel then throttles.
func (s *Store) CreateTmp(rel string, flags int, mode uint32) (*Writer, error) {
	kind, name := Classify(rel)
	if kind != BlockTmp {
		return nil, newError("create", rel, syscall.EINVAL, "not a block tmp file name")
	}
	direct := flags&syscall.O_DIRECT != 0
	flags &^= syscall.O_APPEND | syscall.O_ACCMODE
	flags |= syscall.O_CREAT | syscall.O_RDWR | syscall.O_CLOEXEC
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, ok := s.tmps[rel]; ok && t.open {
		return nil, newError("create", rel, syscall.EBUSY, "tmp file is already open for writing")
	}
	f, err := os.OpenFile(s.Path(rel), flags, os.FileMode(mode&0o7777))
	if direct && errors.Is(err, syscall.EINVAL) {
		// The store filesystem has no O_DIRECT (tmpfs): write through its cache.
		direct = false
		f, err = os.OpenFile(s.Path(rel), flags&^syscall.O_DIRECT, os.FileMode(mode&0o7777))
	}
	if err != nil {
		return nil, err
	}
	size, _, err := fileSize(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	if old, ok := s.tmps[rel]; ok {
		s.used -= old.allocated
	}
	t := &tmpFile{size: size, allocated: size, sequential: size == 0, open: true}
	if rowBytes, ok := s.rowBytes[name.Tier]; ok && size == 0 {
		t.expect = rowBytes
		t.probes = make(map[int64]uint64)
	}
	s.used += size
	s.tmps[rel] = t
	w := &Writer{s: s, rel: rel, tmp: t, file: f}
	if direct {
		if w.bounce, err = unix.Mmap(-1, 0, bounceBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE); err != nil {
			f.Close()
			return nil, err
		}
	}
	return w, nil
}

// WriteAt appends p at off, which must be the current end of the file.
func (w *Writer) WriteAt(p []byte, off int64) (int, error) {
	w.tmp.mu.Lock()
	defer w.tmp.mu.Unlock()
	if w.file == nil {
		return 0, newError("write", w.rel, syscall.EBADF, "tmp file is closed")
	}
	if w.tmp.sealed {
		return 0, newError("write", w.rel, syscall.EBADF, "tmp file was already renamed to its block, which is immutable")
	}
	if off != w.tmp.size {
		w.s.counters.RejectedWrites.Add(1)
		w.tmp.refused = true
		return 0, newError("write", w.rel, syscall.EINVAL,
			"block rows are written in one sequential write: got offset %d after %d bytes", off, w.tmp.size)
	}
	runs := nonZeroRuns(p, off)
	var data int64
	for _, r := range runs {
		data += int64(r.end - r.start)
	}
	if err := w.s.reserve(data, w.rel); err != nil {
		return 0, err
	}
	w.tmp.allocated += data
	n := len(p)
	var werr error
	for _, r := range runs {
		if err := w.pwrite(p[r.start:r.end], off+int64(r.start)); err != nil {
			n, werr = r.start, err
			break
		}
	}
	w.tmp.crc = crc32.Update(w.tmp.crc, castagnoli, p[:n])
	w.tmp.captureProbes(p[:n], off)
	w.tmp.size += int64(n)
	if werr != nil {
		return n, newError("write", w.rel, Errno(werr), "store write failed: %v", werr)
	}
	w.s.counters.WriteBytes.Add(int64(n))
	return n, nil
}

// pwrite writes data at off, through the bounce buffer for O_DIRECT; a piece
// O_DIRECT cannot take (not page aligned) is written buffered.
func (w *Writer) pwrite(data []byte, off int64) error {
	fd := int(w.file.Fd())
	if w.bounce == nil || off%PageSize != 0 || len(data)%PageSize != 0 {
		if w.bounce != nil {
			if err := setDirect(fd, false); err != nil {
				return err
			}
			defer setDirect(fd, true)
		}
		_, err := unix.Pwrite(fd, data, off)
		return err
	}
	for len(data) > 0 {
		chunk := copy(w.bounce, data)
		if _, err := unix.Pwrite(fd, w.bounce[:chunk], off); err != nil {
			return err
		}
		data, off = data[chunk:], off+int64(chunk)
	}
	return nil
}

// setDirect turns O_DIRECT on or off for an open file.
func setDirect(fd int, on bool) error {
	flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		return err
	}
	if on {
		flags |= unix.O_DIRECT
	} else {
		flags &^= unix.O_DIRECT
	}
	_, err = unix.FcntlInt(uintptr(fd), unix.F_SETFL, flags)
	return err
}

// captureProbes keeps the digest's probe windows of a tmp whose final size is
// expected to be its tier's row size, so Publish need not read them back.
func (t *tmpFile) captureProbes(p []byte, off int64) {
	if t.probes == nil {
		return
	}
	for _, o := range shm.ProbeOffsets(t.expect) {
		if o >= off && o+8 <= off+int64(len(p)) {
			t.probes[o] = binary.LittleEndian.Uint64(p[o-off:])
		}
	}
}

// run is a byte range [start, end) of a write buffer.
type run struct{ start, end int }

// nonZeroRuns splits a write at offset off into runs of pages that hold a
// non-zero byte; all-zero pages are left as holes in the store file, so
// sparse rows (the zero slots of other nodes) cost no disk.
func nonZeroRuns(p []byte, off int64) []run {
	var runs []run
	for start := 0; start < len(p); {
		end := min(len(p), start+PageSize-int((off+int64(start))%PageSize))
		if !isZero(p[start:end]) {
			if len(runs) > 0 && runs[len(runs)-1].end == start {
				runs[len(runs)-1].end = end
			} else {
				runs = append(runs, run{start, end})
			}
		}
		start = end
	}
	return runs
}

// isZero reports whether every byte of p is zero.
func isZero(p []byte) bool {
	for len(p) >= 8 {
		if binary.LittleEndian.Uint64(p) != 0 {
			return false
		}
		p = p[8:]
	}
	for _, b := range p {
		if b != 0 {
			return false
		}
	}
	return true
}

// Close closes the tmp file; the tmp stays ready for Publish or RemoveTmp.
func (w *Writer) Close() error {
	w.tmp.mu.Lock()
	defer w.tmp.mu.Unlock()
	if w.file == nil {
		return nil
	}
	err := w.file.Close()
	w.file = nil
	if w.bounce != nil {
		unix.Munmap(w.bounce)
		w.bounce = nil
	}
	w.s.mu.Lock()
	w.tmp.open = false
	if w.tmp.orphaned {
		w.s.used -= w.tmp.allocated
	}
	w.s.mu.Unlock()
	return err
}

// reserve makes room for n more bytes, evicting blocks if needed; it fails with
// ENOSPC, evicting nothing, when the capacity or the filesystem reserve cannot be met.
func (s *Store) reserve(n int64, forRel string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.makeRoomLocked(n, forRel); err != nil {
		return err
	}
	s.used += n
	return nil
}

// release returns reserved bytes that were not written.
func (s *Store) release(n int64) {
	s.mu.Lock()
	s.used -= n
	s.mu.Unlock()
}

// limitLocked is the number of bytes the store may use now: the capacity, or
// less when the filesystem is filling up from outside.
func (s *Store) limitLocked() int64 {
	var st unix.Statfs_t
	if err := unix.Statfs(s.root, &st); err != nil {
		return s.capacity
	}
	avail := int64(st.Bavail) * st.Bsize
	return min(s.capacity, s.used+avail-s.fsReserve)
}

// Publish renames a closed tmp file over its block atomically, with the block's
// checksum recorded beside it. Readers see the whole old block, the whole new
// one, or ENOENT.
func (s *Store) Publish(tmpRel, destRel string) error {
	kind, name := Classify(destRel)
	if kind != Block {
		return newError("rename", destRel, syscall.EINVAL, "not a block name")
	}
	if path.Dir(tmpRel) != path.Dir(destRel) {
		return newError("rename", tmpRel, syscall.EXDEV,
			"a block is published from a tmp file in its own directory, not from %s", path.Dir(tmpRel))
	}
	s.mu.Lock()
	t, ok := s.tmps[tmpRel]
	s.mu.Unlock()
	if !ok {
		return newError("rename", tmpRel, syscall.EINVAL, "not a tmp file written through this mount")
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.sealed {
		return newError("rename", tmpRel, syscall.ENOENT, "tmp file was already published")
	}
	if t.refused {
		return newError("rename", tmpRel, syscall.EINVAL, "a write to this tmp file was refused: it does not hold a whole row")
	}
	if t.size == 0 || t.size%PageSize != 0 {
		return newError("rename", tmpRel, syscall.EINVAL,
			"block size %d is not a positive multiple of the page size %d", t.size, PageSize)
	}
	f, err := os.OpenFile(s.Path(tmpRel), os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if size, _, err := fileSize(f); err != nil {
		return err
	} else if size < t.size {
		if err := f.Truncate(t.size); err != nil {
			return err
		}
	}
	crc := t.crc
	if !t.sequential {
		if crc, err = fileCRC(f, t.size); err != nil {
			return err
		}
	}
	digest, err := t.digest(f, crc)
	if err != nil {
		return err
	}
	if err := writeDigest(f, digest); err != nil {
		return err
	}
	_, physical, err := fileSize(f)
	if err != nil {
		return err
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if want, ok := s.rowBytes[name.Tier]; ok && want != t.size {
		if old := s.blocks[destRel]; s.tierBlocks[name.Tier] > 1 || old == nil {
			return newError("rename", destRel, syscall.EINVAL,
				"block size %d differs from the %d-byte rows of the other blocks in %s", t.size, want, name.Tier)
		}
	}
	if extra := physical - t.allocated; extra > 0 {
		if err := s.makeRoomLocked(extra, destRel); err != nil {
			return err
		}
	}
	if err := unix.Rename(s.Path(tmpRel), s.Path(destRel)); err != nil {
		return err
	}
	t.sealed = true
	delete(s.tmps, tmpRel)
	s.used -= t.allocated
	b := &block{rel: destRel, name: name, size: t.size, physical: physical,
		digest: digest, hasDigest: true, lastUse: s.nowNano(), present: true}
	if old := s.blocks[destRel]; old != nil {
		b.lastLookup, b.chain = old.lastLookup, old.chain
		s.replaceInChainLocked(old, b)
		s.dropLocked(old)
	}
	s.insertLocked(b)
	s.counters.Writes.Add(1)
	return nil
}

// digest builds the published block's digest from the probe windows captured
// while it was written, or by reading them from the file.
func (t *tmpFile) digest(f *os.File, crc uint32) (shm.Digest, error) {
	offsets := shm.ProbeOffsets(t.size)
	if t.expect != t.size || !t.sequential || len(t.probes) != len(offsets) {
		return digestFile(f, t.size, crc)
	}
	return shm.NewDigest(t.size, crc, func(off int64) (uint64, error) { return t.probes[off], nil })
}

// RemoveTmp unlinks a tmp file and returns its bytes to the capacity.
func (s *Store) RemoveTmp(rel string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := unix.Unlink(s.Path(rel)); err != nil {
		return err
	}
	if t, ok := s.tmps[rel]; ok {
		delete(s.tmps, rel)
		if t.open {
			t.orphaned = true
		} else {
			s.used -= t.allocated
		}
	}
	return nil
}

// ForgetTmp stops tracking a tmp file that was renamed to a name outside the
// block layout; its bytes no longer count against the capacity.
func (s *Store) ForgetTmp(rel string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, ok := s.tmps[rel]; ok {
		s.used -= t.allocated
		delete(s.tmps, rel)
	}
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
	if err := unix.Unlink(s.Path(rel)); err != nil {
		return err
	}
	if b := s.blocks[rel]; b != nil {
		s.dropLocked(b)
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
