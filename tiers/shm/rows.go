package shm

import "github.com/kvtierfs/kvtierfs/tiers/block"

// RowRef names one row of one region: the region's path, and the identity of
// the file it named when the row was found, so that a row of a region the
// engine recreated under the same name is never taken for a row of the old one.
type RowRef struct {
	Region string
	File   FileID
	Row    int
}

// Fits reports whether some region is made of rows of size bytes, so that a
// load of a block of that size lands in a row the daemon can see.
func (s *Set) Fits(size int64) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, r := range s.regions {
		if size > 0 && r.size >= size && r.size%size == 0 && !r.faulted.Load() {
			return true
		}
	}
	return false
}

// Candidates lists the rows whose sampled windows match the digest now. A
// load started after this call and found later in a row not listed here
// proves that the load delivered the block's bytes.
func (s *Set) Candidates(d block.Digest) []RowRef {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []RowRef
	s.eachRowLocked(d.Size, func(ref RowRef, row []byte) bool {
		if d.SamplesMatch(row) {
			out = append(out, ref)
		}
		return true
	})
	return out
}

// Confirm finds the one row that holds exactly the digest's bytes now (samples
// then CRC32C) and was not among before. ok is false when no such row exists,
// when several do, when the samples match too many rows to check, or when a
// region faulted while it was searched.
func (s *Set) Confirm(d block.Digest, before []RowRef) (RowRef, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	old := make(map[RowRef]bool, len(before))
	for _, ref := range before {
		old[ref] = true
	}
	var found []RowRef
	candidates := 0
	complete := s.eachRowLocked(d.Size, func(ref RowRef, row []byte) bool {
		if !d.SamplesMatch(row) {
			return true
		}
		if candidates++; candidates > maxCandidates+len(before) {
			found = nil
			return false
		}
		if !old[ref] && block.CRC32C(row) == d.CRC {
			found = append(found, ref)
		}
		return len(found) < 2
	})
	if !complete || len(found) != 1 {
		return RowRef{}, false
	}
	return found[0], true
}

// eachRowLocked calls fn for every row of every region made of size-byte rows
// until fn returns false. A region that faults while fn reads it (truncated
// by another user) is left at once, marked for Refresh to drop; ok is false
// then, as the rows fn saw may be incomplete.
func (s *Set) eachRowLocked(size int64, fn func(ref RowRef, row []byte) bool) (ok bool) {
	if size <= 0 {
		return true
	}
	ok = true
	for path, r := range s.regions {
		if r.data == nil || r.size%size != 0 || r.faulted.Load() {
			continue
		}
		more := true
		if !s.guard(r, func() {
			for i := int64(0); i < r.size/size && more; i++ {
				more = fn(RowRef{Region: path, File: r.id, Row: int(i)}, r.data[i*size:(i+1)*size])
			}
		}) {
			ok = false
		}
		if !more {
			break
		}
	}
	return ok
}

// PathFor returns the region made of rows of rowBytes bytes; ok is false when
// none or several regions are.
func (s *Set) PathFor(rowBytes int64) (string, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var found []string
	for path, r := range s.regions {
		if rowBytes > 0 && r.size >= rowBytes && r.size%rowBytes == 0 && !r.faulted.Load() {
			found = append(found, path)
		}
	}
	if len(found) != 1 {
		return "", false
	}
	return found[0], true
}

// maxCandidates bounds the rows checksummed for one block: a block whose
// samples match more rows than this (an all-zero block) is not identified.
const maxCandidates = 4
