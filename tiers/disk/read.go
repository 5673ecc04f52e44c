package disk

import (
	"errors"
	"io/fs"
	"os"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// Reader is a verified, open block. The block cannot be evicted until Close.
type Reader struct {
	s    *Store
	b    *entry
	file *os.File
}

// File is the open block file; it is opened without O_DIRECT so loads that
// pass through to it read the pages the verification just brought in.
func (r *Reader) File() *os.File { return r.file }

// Path is the block's store-relative path.
func (r *Reader) Path() string { return r.b.rel }

// Size is the block's size in bytes.
func (r *Reader) Size() int64 { return r.b.size }

// Lookup answers whether a block is present, and records the lookup: it
// protects the block from eviction and extends the prefix that the calling
// thread is looking up in prefix order. thread is the caller's kernel thread
// id, or a match request's own id (bit 31 set, fusefs).
func (s *Store) Lookup(rel string, thread uint32) bool {
	s.counters.Lookups.Add(1)
	now := s.nowNano()
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.blocks[rel]
	if b == nil {
		return false
	}
	s.counters.LookupHits.Add(1)
	if b.lastLookup == 0 {
		s.totals.neverLookedUp--
	}
	b.lastLookup = now
	b.lastUse = now
	s.lru.MoveToFront(b.lru)
	s.extendPrefixLocked(b, thread, now)
	return true
}

// Digest returns a present block's digest; ok is false for an absent block.
func (s *Store) Digest(rel string) (block.Digest, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.blocks[rel]
	if b == nil {
		return block.Digest{}, false
	}
	return b.digest, true
}

// CountMissedLookup counts a block lookup that failed before reaching the
// block's name (a directory of the layout is missing).
func (s *Store) CountMissedLookup() { s.counters.Lookups.Add(1) }

// PinBlock opens a block for a load without reading it, pinning it until the
// Reader is closed. The caller must prove the load's bytes before the load
// counts as done: Verify, or find them in the engine's region by Digest.
func (s *Store) PinBlock(rel string) (*Reader, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.blocks[rel]
	if b == nil {
		return nil, newError("open", rel, syscall.ENOENT, "no such block")
	}
	// Opened under the lock, so a concurrent Publish cannot swap the file
	// between the index entry and the descriptor.
	f, err := s.openFile(rel, unix.O_RDONLY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		s.cfg.Logger.Warn("block file vanished from the store behind its back", "path", s.Path(rel))
		s.dropLocked(b)
		s.queueRemoval(rel)
		return nil, newError("open", rel, syscall.ENOENT, "block file vanished from the store")
	}
	if err != nil {
		if errors.Is(err, syscall.EIO) {
			s.counters.IOErrors.Add(1)
			s.cfg.Logger.Error("the store filesystem failed to open a block", "path", s.Path(rel), "err", err)
		}
		return nil, err
	}
	b.readers++
	return &Reader{s: s, b: b, file: f}, nil
}

// Digest returns the block's digest. Every indexed block has one (a block
// found without a record is not indexed), so ok is always true; it is kept
// for callers written when blocks could lack one.
func (r *Reader) Digest() (block.Digest, bool) {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	return r.b.digest, true
}

// Verify reads the block file and checks it against its digest. A mismatch
// removes the block and returns EIO.
func (r *Reader) Verify() error {
	s, b, f := r.s, r.b, r.file
	size, _, err := fileSize(f)
	if err != nil {
		return err
	}
	if size != b.size {
		return s.corrupt(b, "file has %d bytes, the block was published with %d", size, b.size)
	}
	crc, err := fileCRC(f, size)
	if err != nil {
		return s.corrupt(b, "%v", err)
	}
	s.mu.Lock()
	want := b.digest.CRC
	s.mu.Unlock()
	if crc != want {
		return s.corrupt(b, "crc32c %08x, recorded %08x", crc, want)
	}
	return nil
}

// ReadBlock reads a whole block into a page-aligned buffer and checks it
// against its checksum (see Reader.ReadAll). Hand the buffer back with
// RecycleBlock once nothing reads it any more.
func (s *Store) ReadBlock(rel string) ([]byte, error) {
	r, err := s.PinBlock(rel)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return r.ReadAll()
}

// ReadAll reads the whole pinned block into a page-aligned buffer and checks
// it against its checksum. It reads
// O_DIRECT where the store filesystem allows, so the block moves straight
// from the disk into the buffer, in one request, and leaves the page cache
// alone. A mismatch removes the block and returns EIO. Hand the buffer back
// with RecycleBlock once nothing reads it any more.
func (r *Reader) ReadAll() ([]byte, error) {
	s := r.s
	d, _ := r.Digest()
	size := int(r.b.size)
	fd := int(r.file.Fd())
	direct := setDirect(fd, true) == nil
	buf := s.buffers.get(size)
	whole := buf[:cap(buf)] // O_DIRECT reads whole pages; the last one ends at EOF
	n := 0
	for n < size {
		m, err := unix.Pread(fd, whole[n:], int64(n))
		if err == syscall.EINTR {
			continue
		}
		if err == syscall.EINVAL && direct {
			// A short O_DIRECT read left the rest unaligned: go on buffered.
			direct = false
			if err := setDirect(fd, false); err != nil {
				s.buffers.put(buf)
				return nil, err
			}
			continue
		}
		if err != nil {
			s.buffers.put(buf)
			s.counters.IOErrors.Add(1)
			return nil, s.corrupt(r.b, "reading %d bytes: %v", size, err)
		}
		if m == 0 {
			s.buffers.put(buf)
			return nil, s.corrupt(r.b, "file ends at %d bytes, the block was published with %d", n, size)
		}
		n += m
	}
	if crc := block.CRC32C(buf); crc != d.CRC {
		s.buffers.put(buf)
		return nil, s.corrupt(r.b, "crc32c %08x, recorded %08x", crc, d.CRC)
	}
	return buf, nil
}

// Buffer returns a page-aligned buffer of size bytes from the pool that
// ReadAll fills, for a caller that fills it another way; hand it back with
// RecycleBlock.
func (s *Store) Buffer(size int) []byte { return s.buffers.get(size) }

// RecycleBlock hands back a buffer ReadBlock returned, for a later
// ReadBlock to overwrite: call it only once nothing reads the buffer.
func (s *Store) RecycleBlock(buf []byte) { s.buffers.put(buf) }

// Corrupt reports that a load of this block delivered bytes that do not match
// its digest: the block is removed and the error (EIO) describes it.
func (r *Reader) Corrupt(reason string) error {
	return r.s.corrupt(r.b, "%s", reason)
}

// corrupt drops a block whose bytes fail verification and returns EIO.
func (s *Store) corrupt(b *entry, format string, args ...any) error {
	s.counters.ChecksumFailures.Add(1)
	e := newError("read", b.rel, syscall.EIO, format, args...)
	s.cfg.Logger.Error("corrupt block removed from the store", "path", s.Path(b.rel), "reason", e.Msg)
	s.mu.Lock()
	if s.blocks[b.rel] == b {
		s.dropLocked(b)
		if err := s.removeFile(b.rel); err != nil {
			s.cfg.Logger.Error("removing corrupt block", "path", s.Path(b.rel), "err", err)
		}
	}
	s.mu.Unlock()
	s.queueRemoval(b.rel)
	return e
}

// Close ends the load: the block becomes evictable again and counts as used now.
func (r *Reader) Close() error {
	var err error
	if r.file != nil {
		err = r.file.Close()
		r.file = nil
	}
	s := r.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.b == nil {
		return err
	}
	r.b.readers--
	if r.b.present {
		r.b.lastUse = s.nowNano()
		s.lru.MoveToFront(r.b.lru)
	}
	r.b = nil
	return err
}

// CountRead records a completed load of n bytes.
func (s *Store) CountRead(n int64) {
	s.counters.Reads.Add(1)
	s.counters.ReadBytes.Add(n)
}
