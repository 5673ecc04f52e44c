package disk

import (
	"encoding/binary"
	"hash/crc32"
	"os"
	"path"
	"syscall"

	"golang.org/x/sys/unix"
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
}

// CreateTmp creates the tmp file of a block (a BlockTmp path) with the caller's
// open flags (O_EXCL is honoured; O_DIRECT and O_APPEND are dropped: the store
// writes through its page cache and checksums as the bytes arrive).
func (s *Store) CreateTmp(rel string, flags int, mode uint32) (*Writer, error) {
	if kind, _ := Classify(rel); kind != BlockTmp {
		return nil, newError("create", rel, syscall.EINVAL, "not a block tmp file name")
	}
	flags &^= syscall.O_DIRECT | syscall.O_APPEND | syscall.O_ACCMODE
	flags |= syscall.O_CREAT | syscall.O_RDWR | syscall.O_CLOEXEC
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, ok := s.tmps[rel]; ok && t.open {
		return nil, newError("create", rel, syscall.EBUSY, "tmp file is already open for writing")
	}
	f, err := os.OpenFile(s.Path(rel), flags, os.FileMode(mode&0o7777))
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
	s.used += size
	s.tmps[rel] = t
	return &Writer{s: s, rel: rel, tmp: t, file: f}, nil
}

// File is the open tmp file, for attribute calls of the FUSE layer.
func (w *Writer) File() *os.File { return w.file }

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
		if _, err := unix.Pwrite(int(w.file.Fd()), p[r.start:r.end], off+int64(r.start)); err != nil {
			n, werr = r.start, err
			break
		}
	}
	w.tmp.crc = crc32.Update(w.tmp.crc, castagnoli, p[:n])
	w.tmp.size += int64(n)
	if werr != nil {
		return n, newError("write", w.rel, Errno(werr), "store write failed: %v", werr)
	}
	w.s.counters.WriteBytes.Add(int64(n))
	return n, nil
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
	digest, err := digestFile(f, t.size, crc)
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
