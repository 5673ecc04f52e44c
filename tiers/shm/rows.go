package shm

// RowRef names one row of one region.
type RowRef struct {
	Region string
	Row    int
}

// Fits reports whether some region is made of rows of size bytes, so that a
// load of a block of that size lands in a row the daemon can see.
func (s *Set) Fits(size int64) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, r := range s.regions {
		if size > 0 && r.Size >= size && r.Size%size == 0 {
			return true
		}
	}
	return false
}

// Candidates lists the rows whose sampled windows match the digest now. A
// load started after this call and found later in a row not listed here
// proves that the load delivered the block's bytes.
func (s *Set) Candidates(d Digest) []RowRef {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []RowRef
	s.eachRowLocked(d.Size, func(ref RowRef, row []byte) bool {
		if d.samplesMatch(row) {
			out = append(out, ref)
		}
		return true
	})
	return out
}

// Confirm finds the one row that holds exactly the digest's bytes now (samples
// then CRC32C) and was not among before. ok is false when no such row exists,
// when several do, or when the samples match too many rows to check.
func (s *Set) Confirm(d Digest, before []RowRef) (RowRef, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	old := make(map[RowRef]bool, len(before))
	for _, ref := range before {
		old[ref] = true
	}
	var found []RowRef
	candidates := 0
	s.eachRowLocked(d.Size, func(ref RowRef, row []byte) bool {
		if !d.samplesMatch(row) {
			return true
		}
		if candidates++; candidates > maxCandidates+len(before) {
			found = nil
			return false
		}
		if !old[ref] && CRC32C(row) == d.CRC {
			found = append(found, ref)
		}
		return len(found) < 2
	})
	if len(found) != 1 {
		return RowRef{}, false
	}
	return found[0], true
}

// eachRowLocked calls fn for every row of every region made of size-byte rows
// until fn returns false.
func (s *Set) eachRowLocked(size int64, fn func(ref RowRef, row []byte) bool) {
	if size <= 0 {
		return
	}
	for path, r := range s.regions {
		if r.data == nil || r.Size%size != 0 {
			continue
		}
		for i := int64(0); i < r.Size/size; i++ {
			if !fn(RowRef{Region: path, Row: int(i)}, r.data[i*size:(i+1)*size]) {
				return
			}
		}
	}
}

// PathFor returns the region made of rows of rowBytes bytes; ok is false when
// none or several regions are.
func (s *Set) PathFor(rowBytes int64) (string, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var found []string
	for path, r := range s.regions {
		if rowBytes > 0 && r.Size >= rowBytes && r.Size%rowBytes == 0 {
			found = append(found, path)
		}
	}
	if len(found) != 1 {
		return "", false
	}
	return found[0], true
}
