package disk

import "os"

// Helpers the tests use to look into the store; the filesystem does not need them.

// OpenBlock is PinBlock followed by Verify.
func (s *Store) OpenBlock(rel string) (*Reader, error) {
	r, err := s.PinBlock(rel)
	if err != nil {
		return nil, err
	}
	if err := r.Verify(); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// Contains reports whether a block is indexed once its proof is done,
// without recording a lookup.
func (s *Store) Contains(rel string) bool {
	s.mu.Lock()
	b := s.blocks[rel]
	s.mu.Unlock()
	if b == nil || s.awaitProof(b) != nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.blocks[rel] == b
}

// RowBytes returns the block size of each tier directory that holds blocks.
func (s *Store) RowBytes() map[string]int64 { return s.Stats().RowBytes }

// File is the open tmp file of a writer.
func (w *Writer) File() *os.File { return w.file }

// Used returns the bytes counted against the capacity: blocks, tmp files
// and other files.
func (s *Store) Used() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.used
}

// Misrecord changes the digest the store holds for a block, as if the disk
// had changed the block's bytes under its file: the file, unchanged, then
// fails its checksum with nothing to show for a change (changed.go).
func (s *Store) Misrecord(rel string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.blocks[rel]
	b.digest.CRC ^= 1
	chunks := append([]uint32(nil), b.digest.Chunks...)
	for i := range chunks {
		chunks[i] ^= 1
	}
	b.digest.Chunks = chunks
}
