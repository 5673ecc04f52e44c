package disk

import (
	"os"
	"syscall"
)

// Reader is a verified, open block. The block cannot be evicted until Close.
type Reader struct {
	s    *Store
	b    *block
	file *os.File
}

// File is the open block file; it is opened without O_DIRECT so loads that
// pass through to it read the pages the verification just brought in.
func (r *Reader) File() *os.File { return r.file }

// Size is the block's size in bytes.
func (r *Reader) Size() int64 { return r.b.size }

// Lookup answers whether a block is present, and records the lookup: it
// protects the block from eviction and extends the chain that the calling
// thread (stream) is looking up in prefix order.
func (s *Store) Lookup(rel string, stream uint32) bool {
	s.counters.Lookups.Add(1)
	now := s.nowNano()
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.blocks[rel]
	if b == nil {
		return false
	}
	s.counters.LookupHits.Add(1)
	b.lastLookup = now
	b.lastUse = now
	s.lru.MoveToFront(b.lru)
	s.extendChainLocked(b, stream, now)
	return true
}

// Contains reports whether a block is present without recording a lookup.
func (s *Store) Contains(rel string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.blocks[rel] != nil
}

// OpenBlock opens a block for a load, checks its bytes against the checksum
// recorded at publish and pins it until the Reader is closed. A mismatch counts
// a checksum failure, removes the block and fails with EIO: wrong bytes never
// reach a load.
func (s *Store) OpenBlock(rel string) (*Reader, error) {
	s.mu.Lock()
	b := s.blocks[rel]
	if b == nil {
		s.mu.Unlock()
		return nil, newError("open", rel, syscall.ENOENT, "no such block")
	}
	b.readers++
	s.mu.Unlock()

	r := &Reader{s: s, b: b}
	f, err := os.Open(s.Path(rel))
	if err == nil {
		r.file = f
		err = s.verify(b, f)
	}
	if err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// verify checks an open block file against its checksum record, adopting
// blocks that have none (placed in the store by an engine pointed straight at it).
func (s *Store) verify(b *block, f *os.File) error {
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
	adopt := !b.hasCRC
	if adopt {
		b.crc, b.hasCRC = crc, true
	}
	want := b.crc
	s.mu.Unlock()
	if adopt {
		s.cfg.Logger.Info("adopted block without checksum record", "path", s.Path(b.rel))
		return writeChecksum(f, checksumRecord{crc: crc, size: size})
	}
	if crc != want {
		return s.corrupt(b, "crc32c %08x, recorded %08x", crc, want)
	}
	return nil
}

// corrupt drops a block whose bytes fail verification and returns EIO.
func (s *Store) corrupt(b *block, format string, args ...any) error {
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
