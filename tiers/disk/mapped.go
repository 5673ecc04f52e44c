package disk

import (
	"container/list"
	"fmt"
	"math"
	"os"
	"os/signal"
	"runtime/debug"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// Mapped is a block of a store kept in memory (tmpfs, ramfs) mapped
// read-only under a read lease, so that loads serve the store's own pages
// with no copy into a daemon buffer. The engine's uid owns the store tree and
// could write the file after it was checked; the lease is granted only while
// nobody has the file open for writing, and any later open for writing or
// truncate(2) of it then waits in the kernel until the lease is given back
// or lease-break-time (45 s by default) passed. Held tells whether that wait
// has begun, so a load asks it around every reply.
//
// A proven mapping is kept after its load (up to mappedBound, least
// recently used dropped first), so later loads of the block neither map it
// again nor check it again: its bytes cannot have changed since they matched
// the digest while the lease has been held. It is dropped when the block
// leaves the index (evicted, replaced, removed) and when its lease breaks:
// the kernel signals the break (SIGIO) and the store gives the lease back at
// once unless a load still serves the mapping, which then fails its next
// read (DESIGN.md "Passes over a loaded byte").
//
// A block stored into a store in memory is kept mapped from its store on
// (ProvenAtStore), so not even its first load checks it: written through the
// daemon, under the write lease its tmp held since it was created (every
// byte of the file is one the daemon wrote and summed); passed through,
// under the read lease its proof summed the file under.
type Mapped struct {
	s *Store
	b *entry
	// file is the daemon's own descriptor of the block file (a duplicate
	// of the pinning Reader's): the lease belongs to it.
	file *os.File
	data []byte
	// lease is the lease file holds: unix.F_RDLCK (on a read-only
	// descriptor: a load's, or a passthrough store's in memory) or
	// unix.F_WRLCK (the store's, on the descriptor the daemon wrote the
	// block through, which any other open of the file breaks: Store.openPinned).
	lease int
	// atStore is set for a mapping kept from the block's store.
	atStore bool
	// id is the file's identity, which a block kept from its store must
	// still have behind its name to be served so (Store.openPinned).
	id fileID

	// Under s.mu: refs counts the loads serving the mapping; proven is set
	// once it matched the digest; cached is its element of s.mapped while
	// it is kept between loads.
	refs   int
	proven bool
	cached *list.Element
}

// maxMappedBlocks bounds the mappings kept between loads: each holds a
// descriptor and a lease (the pages are the store's own, counted there).
const maxMappedBlocks = 4096

// mappedBound is how many mappings a store keeps between loads under the
// daemon's descriptor limit (soft RLIMIT_NOFILE): at most a quarter of it,
// which with the quarter kept free for the daemon's own work
// (internal/descriptors) leaves half to the engine's opens. At 4,096 the
// store's 4,096 mappings alone had refused every open with ENFILE.
func mappedBound(limit uint64) int { return int(min(maxMappedBlocks, limit/4)) }

// descriptorLimit is this process's soft RLIMIT_NOFILE, or no limit where
// it cannot be read.
func descriptorLimit() uint64 {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return math.MaxUint64
	}
	return rl.Cur
}

// Map returns the block mapped for a load to serve in place: the kept
// mapping, already proven, or a new one to check with VerifyMapped. ok is
// false where the load copies the block instead (ReadInto): a store on a
// disk, a writer holding the file open, a file of another size or with holes.
// Release the mapping before closing the Reader.
func (r *Reader) Map() (m *Mapped, ok bool) {
	if m, ok := r.Mapped(); ok {
		return m, true
	}
	s := r.s
	size := int(r.b.size)
	if !s.inMemory || size == 0 {
		return nil, false
	}
	f := s.leaseOn(r.file, unix.F_RDLCK)
	if f == nil {
		return nil, false
	}
	// Sized under the lease: a file of another size goes to ReadInto,
	// which drops it as corrupt; a sparse one is copied.
	data := mapLeased(f, int64(size))
	if data == nil {
		f.Close()
		return nil, false
	}
	return &Mapped{s: s, b: r.b, file: f, data: data, lease: unix.F_RDLCK, refs: 1}, true
}

// Mapped returns the block's kept mapping, proven, if it has one whose lease
// still holds.
func (r *Reader) Mapped() (*Mapped, bool) {
	s := r.s
	s.mu.Lock()
	m := r.b.mapped
	if m != nil {
		m.refs++
		s.mapped.MoveToFront(m.cached)
	}
	s.mu.Unlock()
	if m == nil {
		return nil, false
	}
	if !m.Held() {
		s.mu.Lock()
		s.uncacheLocked(m)
		s.mu.Unlock()
		m.Release()
		return nil, false
	}
	return m, true
}

// Bytes are the mapped block: serve a range only while Held.
func (m *Mapped) Bytes() []byte { return m.data }

// Proven reports whether the mapping matched the block's digest under its
// lease (a kept mapping, or one VerifyMapped passed).
func (m *Mapped) Proven() bool {
	m.s.mu.Lock()
	defer m.s.mu.Unlock()
	return m.proven
}

// ProvenAtStore reports whether the mapping is kept from the block's store,
// proven there rather than by a load's check.
func (m *Mapped) ProvenAtStore() bool { return m.atStore }

// Held reports whether the lease is still held with no break begun: no one
// has since opened the file for writing (a write lease: at all) or truncated
// it, so the mapped bytes are still those that were proven, and stay so for
// at least lease-break-time after the first false.
func (m *Mapped) Held() bool { return leaseOf(m.file) == m.lease }

// KeepsWritersOut reports whether no one can change the mapped bytes yet: the
// lease is held, or it is a write lease kept from the block's store that an
// open for reading is breaking (F_GETLEASE reads F_RDLCK: a read lease, which
// an open for writing or a truncate must break in turn, to F_UNLCK). So a
// reader of the store file (a backup) waits for the loads that serve the
// mapping instead of failing them; the mapping is no longer kept for later
// loads once the break began (Held is false).
func (m *Mapped) KeepsWritersOut() bool {
	lease := leaseOf(m.file)
	return lease == m.lease || m.lease == unix.F_WRLCK && lease == unix.F_RDLCK
}

// leaseOf is the lease f holds (F_GETLEASE): the kind a break would leave
// once one began, F_UNLCK for none.
func leaseOf(f *os.File) int {
	lease, err := unix.FcntlInt(f.Fd(), unix.F_GETLEASE, 0)
	if err != nil {
		return unix.F_UNLCK
	}
	return lease
}

// leaseOn takes a lease of kind on a new duplicate of f's descriptor, which
// it returns; nil where the kernel refuses it.
func (s *Store) leaseOn(f *os.File, kind int) *os.File {
	dup, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	lease := os.NewFile(uintptr(dup), f.Name())
	s.watchLeaseBreaks()
	if _, err := unix.FcntlInt(lease.Fd(), unix.F_SETLEASE, kind); err != nil {
		lease.Close()
		return nil
	}
	return lease
}

// leaseTmp takes a write lease for a new tmp of a store in memory, on a
// duplicate of its descriptor f: the kernel grants it only while f's is the
// file's only open description, and breaks it at any other open or
// truncate(2) of the file (the daemon's own writes, truncates and xattrs
// leave it), so while it holds every byte of the file is one the daemon
// wrote. nil on a disk or where it is refused.
func (s *Store) leaseTmp(f *os.File) *os.File {
	if !s.inMemory {
		return nil
	}
	return s.leaseOn(f, unix.F_WRLCK)
}

// giveBackLeaseLocked ends a tmp's lease, so that an open that broke it goes
// on at once. The caller holds Store.mu.
func (t *tmpFile) giveBackLeaseLocked() {
	if t.lease == nil {
		return
	}
	unix.FcntlInt(t.lease.Fd(), unix.F_SETLEASE, unix.F_UNLCK)
	t.lease.Close()
	t.lease = nil
}

// mapLeased maps a block's file of size bytes read-only through lease, a
// descriptor holding a lease on it (a load's, or a tmp's for
// keepStoredLocked); nil where the file is not the block's size or is
// sparse (a fault of a shared mapping on tmpfs allocates its holes, which
// would grow the store past its accounting), which loads then copy and
// check.
func mapLeased(lease *os.File, size int64) []byte {
	n, physical, err := fileSize(lease)
	if err != nil || n != size || size == 0 || physical < int64(roundUpToPage(int(size))) {
		return nil
	}
	data, err := unix.Mmap(int(lease.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil
	}
	return data
}

// keepStoredLocked keeps a proven block mapped from its store (data) under
// its tmp's lease, if that lease still holds: the write lease held since the
// tmp's creation (written through the daemon: the bytes mapped are those
// the daemon wrote and summed into the block's digest, from mapLeased), or
// the read lease a passthrough tmp's proof summed the file under
// (sealInMemory). It reports whether it kept it, taking the lease from the
// tmp. The caller holds s.mu.
func (s *Store) keepStoredLocked(t *tmpFile, b *entry, data []byte) bool {
	if data == nil || t.lease == nil || b.mapped != nil || !b.present || s.blocks[b.rel] != b {
		return false
	}
	kind := unix.F_WRLCK
	if t.passthrough {
		kind = unix.F_RDLCK // a passthrough tmp gave its write lease up (Writer.Passthrough)
	}
	m := &Mapped{s: s, b: b, file: t.lease, data: data, lease: kind, atStore: true, id: t.id, proven: true}
	// Asked under the lock, as VerifyMapped does.
	if !m.Held() {
		return false
	}
	t.lease = nil
	b.mapped = m
	m.cached = s.mapped.PushFront(m)
	s.trimMappedLocked()
	return true
}

// VerifyMapped checks a new mapping of the pinned block against its digest,
// chunk by chunk (up to maxChunksInFlight at once), calling proven as
// ReadInto does, and keeps it for later loads once it matched. A mismatch
// removes the block and returns EIO.
func (r *Reader) VerifyMapped(m *Mapped, proven func(prefix int)) error {
	s, d := r.s, r.Digest()
	size := len(m.data)
	n := block.ChunkCount(int64(size))
	in := &inFlight{size: size, crcs: make([]uint32, n), done: make([]bool, n)}
	if len(d.Chunks) == n {
		in.want, in.proven = d.Chunks, proven
	}
	workers := min(n, maxChunksInFlight)
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for c := w; c < n && errs[w] == nil; c += workers {
				var crc uint32
				if crc, errs[w] = sumMapped(m.data[c*ReadChunk : min((c+1)*ReadChunk, size)]); errs[w] == nil {
					errs[w] = in.land(c, crc)
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return s.corrupt(r, "%v", err)
		}
	}
	if err := s.wholeChecked(r, d, in, n); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m.proven = true
	// Asked under the lock: a break that begins after this signals the
	// watcher, which then finds the mapping kept.
	if b := m.b; b.present && s.blocks[b.rel] == b && b.mapped == nil && m.Held() {
		b.mapped = m
		m.cached = s.mapped.PushFront(m)
		s.trimMappedLocked()
	}
	return nil
}

// sumMapped is the CRC32C of part of a mapped file; a file cut short under
// the mapping (possible only once a lease break outlasted lease-break-time)
// is an error, not a crash.
func sumMapped(b []byte) (crc uint32, err error) {
	err = faultsAsEIO(func() { crc = block.CRC32C(b) })
	return crc, err
}

// faultsAsEIO runs read, which reads a mapped file: a fault there (the file
// cut short under the mapping) fails it with EIO instead of crashing the
// daemon.
func faultsAsEIO(read func()) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("file cut short while being checked: %v: %w", r, syscall.EIO)
		}
	}()
	read()
	return nil
}

// Release ends a load's use of the mapping. One no longer kept (never
// proven, its block gone, its lease broken, or past the bound) is unmapped
// and its lease given back once no load serves it.
func (m *Mapped) Release() {
	s := m.s
	s.mu.Lock()
	m.refs--
	unused := m.refs == 0 && m.cached == nil
	if m.refs == 0 && m.cached != nil {
		// One whose lease broke while it was served (uncacheLocked
		// closes it) and any past the bound.
		if !m.Held() {
			s.uncacheLocked(m)
		}
		s.trimMappedLocked()
	}
	if unused && m.b.draining == m {
		m.b.draining = nil
	}
	s.mu.Unlock()
	if unused {
		m.close()
	}
}

// uncacheLocked stops keeping m between loads; it is closed by the last
// Release, or now in the background if no load serves it.
func (s *Store) uncacheLocked(m *Mapped) {
	if m.cached == nil {
		return
	}
	s.mapped.Remove(m.cached)
	m.cached = nil
	m.b.mapped = nil
	switch {
	case m.refs == 0:
		go m.close()
	case m.lease == unix.F_WRLCK:
		m.b.draining = m
	}
}

// trimMappedLocked drops the least recently used unserved mappings beyond
// maxMapped.
func (s *Store) trimMappedLocked() {
	for e := s.mapped.Back(); e != nil && s.mapped.Len() > s.maxMapped; {
		m, prev := e.Value.(*Mapped), e.Prev()
		if m.refs == 0 {
			s.uncacheLocked(m)
		}
		e = prev
	}
}

// close gives the lease back, letting an open waiting for it go on at once
// (no load serves the mapping any more), and unmaps the block.
func (m *Mapped) close() {
	unix.FcntlInt(m.file.Fd(), unix.F_SETLEASE, unix.F_UNLCK)
	unix.Munmap(m.data)
	m.data = nil
	m.file.Close()
}

// watchLeaseBreaks starts, once, the goroutine that drops kept mappings
// whose lease the kernel is breaking: it signals the lease's owner (SIGIO)
// when someone opens a leased file for writing.
func (s *Store) watchLeaseBreaks() {
	s.leaseWatch.Do(func() {
		breaks := make(chan os.Signal, 1)
		signal.Notify(breaks, unix.SIGIO)
		go func() {
			defer signal.Stop(breaks)
			for {
				select {
				case <-s.stopRemoval:
					return
				case <-breaks:
				}
				s.dropBrokenLeases()
			}
		}()
	})
}

// dropBrokenLeases stops keeping the mappings whose lease is being broken
// and gives back the broken write leases of tmps.
func (s *Store) dropBrokenLeases() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range s.tmps {
		if t.lease != nil && leaseOf(t.lease) != unix.F_WRLCK {
			t.giveBackLeaseLocked()
		}
	}
	for e := s.mapped.Front(); e != nil; {
		m, next := e.Value.(*Mapped), e.Next()
		if !m.Held() {
			s.uncacheLocked(m)
		}
		e = next
	}
}

// closeMapped unmaps every kept mapping no load serves, at Close.
func (s *Store) closeMapped() {
	s.mu.Lock()
	var unused []*Mapped
	for e := s.mapped.Front(); e != nil; e = e.Next() {
		if m := e.Value.(*Mapped); m.refs == 0 {
			unused = append(unused, m)
		}
	}
	for _, m := range unused {
		s.mapped.Remove(m.cached)
		m.cached, m.b.mapped = nil, nil
	}
	s.mu.Unlock()
	for _, m := range unused {
		m.close()
	}
}
