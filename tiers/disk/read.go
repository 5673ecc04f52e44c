package disk

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync"
	"syscall"
	"time"

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

// Digest returns a present block's digest, once its proof is done (publish.go);
// ok is false for an absent block, or one that failed its proof.
func (s *Store) Digest(rel string) (block.Digest, bool) {
	s.mu.Lock()
	b := s.blocks[rel]
	s.mu.Unlock()
	if b == nil || s.awaitProof(b) != nil {
		return block.Digest{}, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return b.digest, true
}

// awaitProof waits for the proof of a block published through the mount, if
// it is still running, and returns its error.
func (s *Store) awaitProof(b *entry) error {
	if b.proof == nil {
		return nil
	}
	select {
	case <-b.proof.done:
	default:
		defer s.TimePhase(PhaseLoadProofWait, time.Now())
		<-b.proof.done
	}
	return b.proof.err
}

// CountMissedLookup counts a block lookup that failed before reaching the
// block's name (a directory of the layout is missing).
func (s *Store) CountMissedLookup() { s.counters.Lookups.Add(1) }

// PinBlock opens a block for a load without reading it, pinning it until the
// Reader is closed, and waits for the block's proof (publish.go). The
// caller must prove the load's bytes before the load counts as done:
// Verify, or find them in the engine's region by Digest.
//
// The file is opened outside the store's lock: with cold caches an open
// reads directories and an inode from the disk, and sixteen loads would
// otherwise take those reads one at a time. Every change to the file behind
// a block's name (publish, remove, eviction, a corrupt block dropped) also
// replaces or drops its index entry under the lock, so a descriptor opened
// while the entry stayed the same is that entry's file.
func (s *Store) PinBlock(rel string) (*Reader, error) {
	for range pinAttempts {
		s.mu.Lock()
		b := s.blocks[rel]
		s.mu.Unlock()
		if b == nil {
			return nil, newError("open", rel, syscall.ENOENT, "no such block")
		}
		f, err := s.openPinned(b)
		s.mu.Lock()
		if s.blocks[rel] != b {
			// Published again, removed or evicted while opening: look again.
			s.mu.Unlock()
			if f != nil {
				f.Close()
			}
			continue
		}
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, errNotRegular) {
			s.cfg.Logger.Warn("block file vanished from the store behind its back", "path", s.Path(rel), "err", err)
			s.dropLocked(b)
			s.mu.Unlock()
			s.queueRemoval(rel)
			return nil, newError("open", rel, syscall.ENOENT, "block file vanished from the store")
		}
		if err != nil {
			s.mu.Unlock()
			if errors.Is(err, syscall.EIO) {
				s.counters.IOErrors.Add(1)
				s.cfg.Logger.Error("the store filesystem failed to open a block", "path", s.Path(rel), "err", err)
			}
			return nil, err
		}
		b.readers++
		s.mu.Unlock()
		r := &Reader{s: s, b: b, file: f}
		if err := s.awaitProof(b); err != nil {
			r.Close()
			return nil, newError("open", rel, syscall.EIO, "the block was dropped after its rename: %v", err)
		}
		return r, nil
	}
	return nil, newError("open", rel, syscall.EAGAIN, "the block was replaced %d times while being opened", pinAttempts)
}

// openPinned opens a block's file for PinBlock: a duplicate of the
// descriptor of its mapping kept under its store's write lease, which any
// open of the file (the daemon's too) would break, or of such a mapping no
// longer kept whose lease is being broken but which a load still serves
// (entry.draining: an open would wait for that load's end; the load given
// its descriptor cannot map it under a read lease and copies and checks
// the file), else the file by its name. A name that holds another file by
// now (the engine's uid replaced it in the store) drops the kept mapping,
// so the load opens and checks that file.
func (s *Store) openPinned(b *entry) (*os.File, error) {
	s.mu.Lock()
	m := b.mapped
	if m == nil {
		m = b.draining
	}
	s.mu.Unlock()
	if m != nil && m.lease == unix.F_WRLCK {
		// An O_PATH open, which leaves leases alone.
		st, err := s.Lstat(b.rel)
		s.mu.Lock()
		if (b.mapped == m || b.draining == m) && err == nil && (fileID{st.Dev, st.Ino}) == m.id {
			dup, err := unix.FcntlInt(m.file.Fd(), unix.F_DUPFD_CLOEXEC, 0)
			s.mu.Unlock()
			if err != nil {
				return nil, err
			}
			return os.NewFile(uintptr(dup), s.Path(b.rel)), nil
		}
		if b.mapped == m {
			s.uncacheLocked(m)
		}
		s.mu.Unlock()
	}
	return s.openForReading(b.rel)
}

// pinAttempts bounds how often PinBlock looks again at a block replaced while
// it was being opened.
const pinAttempts = 8

// Digest returns the block's digest, recorded at publish: every indexed block
// has one (a block found without a record is not indexed).
func (r *Reader) Digest() block.Digest {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	return r.b.digest
}

// FileChecked reports whether the block file's bytes were checked against
// its digest since it was published or indexed: only then does a row whose
// bytes match the digest hold the file's bytes.
func (r *Reader) FileChecked() bool {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	return !r.b.unchecked
}

// checked records that the block file matched its digest.
func (r *Reader) checked() {
	r.s.mu.Lock()
	r.b.unchecked = false
	r.s.mu.Unlock()
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
		return s.corrupt(r, "file has %d bytes, the block was published with %d", size, b.size)
	}
	sum, err := fileSum(f, size)
	if err != nil {
		return s.corrupt(r, "%v", err)
	}
	crc := sum.CRC()
	s.mu.Lock()
	want := b.digest.CRC
	s.mu.Unlock()
	if crc != want {
		return s.corrupt(r, "crc32c %08x, recorded %08x", crc, want)
	}
	r.checked()
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
// it against its checksum (see ReadInto). A mismatch removes the block and
// returns EIO. Hand the buffer back with RecycleBlock once nothing reads it
// any more.
func (r *Reader) ReadAll() ([]byte, error) {
	buf := r.s.buffers.get(int(r.b.size))
	if err := r.ReadInto(buf, nil); err != nil {
		r.s.buffers.put(buf)
		return nil, err
	}
	return buf, nil
}

// ReadChunk is the unit ReadInto reads and proves the block in (the
// digest's chunks): a load may serve the block's first chunks once they
// matched while the rest is still on its way from the disk.
const ReadChunk = block.ChunkSize

// maxChunksInFlight bounds the chunk reads of one block in flight at once:
// enough to keep as many requests at the disk as one read of the whole row.
const maxChunksInFlight = 8

// ReadInto reads the whole pinned block into buf, a Buffer of its size, and
// checks it against its checksum. It reads O_DIRECT where the store
// filesystem allows, so the block moves straight from the disk into buf and
// leaves the page cache alone, in chunks of ReadChunk bytes, several in
// flight at once, each checked against its chunk CRC as it lands. Each time
// the run of proven chunks from the block's start grows, proven (when not
// nil) is called with its length in bytes, one call at a time; a block whose
// digest has no chunk CRCs (an older record) is proven only whole, by a nil
// return. A mismatch or a short file removes the block and returns EIO.
func (r *Reader) ReadInto(buf []byte, proven func(prefix int)) error {
	s := r.s
	d := r.Digest()
	size := int(r.b.size)
	if len(buf) != size || cap(buf)%block.PageSize != 0 {
		return fmt.Errorf("read %s: a buffer of %d bytes (capacity %d) for a block of %d", r.b.rel, len(buf), cap(buf), size)
	}
	fd := int(r.file.Fd())
	n := block.ChunkCount(int64(size))
	in := &inFlight{direct: setDirect(fd, true) == nil, size: size, crcs: make([]uint32, n), done: make([]bool, n)}
	in.piece = s.readPiece(in.direct)
	if len(d.Chunks) == n {
		in.want, in.proven = d.Chunks, proven
	}
	workers := min(n, maxChunksInFlight)
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for c := w; c < n; c += workers {
				crc, err := r.readChunk(fd, buf, c, in)
				if err == nil {
					err = in.land(c, crc)
				}
				if errs[w] = err; err != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		var short *shortBlock
		var mismatch *chunkMismatch
		switch {
		case errors.As(err, &short):
			return s.corrupt(r, "file ends at %d bytes, the block was published with %d", short.at, size)
		case errors.As(err, &mismatch):
			return s.corrupt(r, "%v", err)
		case err != nil:
			s.counters.IOErrors.Add(1)
			return s.corrupt(r, "%v", err)
		}
	}
	return s.wholeChecked(r, d, in, n)
}

// wholeChecked ends a check that summed every chunk of the block: the
// chunks' CRC32C must combine to the digest's, the block then counts as
// checked, and an older record without chunk CRCs gets them.
func (s *Store) wholeChecked(r *Reader, d block.Digest, in *inFlight, n int) error {
	if in.crc != d.CRC {
		return s.corrupt(r, "crc32c %08x, recorded %08x", in.crc, d.CRC)
	}
	r.checked()
	if in.want == nil && n <= block.MaxChunks {
		r.addChunks(d, in.crcs)
	}
	return nil
}

// addChunks rewrites the record of a block whose digest had no chunk CRCs
// (an older record), now that a read proved the whole block and summed its
// chunks, so that its later loads are proven chunk by chunk. A failure only
// leaves the old record.
func (r *Reader) addChunks(d block.Digest, chunks []uint32) {
	s, b := r.s, r.b
	d.Chunks = chunks
	if _, err := r.ownChange(func(int) error { return writeDigest(r.file, b.name, d) }); err != nil {
		s.cfg.Logger.Warn("adding chunk CRCs to a block's digest record", "path", s.Path(b.rel), "err", err)
		return
	}
	_, physical, err := fileSize(r.file)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.blocks[b.rel] != b {
		return
	}
	b.digest = d
	if err == nil && physical != b.physical {
		s.totals.add(b, -1)
		s.used += physical - b.physical
		b.physical = physical
		s.totals.add(b, 1)
	}
}

// inFlight is the state of one ReadInto: which chunks landed and their
// CRCs, the CRC32C of the run of landed chunks from the block's start, and
// whether reads still go O_DIRECT.
type inFlight struct {
	mu     sync.Mutex
	direct bool
	// piece is how many bytes one read request moves (readPiece).
	piece int
	size  int
	crcs  []uint32
	done  []bool
	next  int // first chunk not yet in the checksum
	crc   uint32
	// want are the digest's chunk CRCs, nil when it has none; proven is
	// then never called.
	want   []uint32
	proven func(prefix int)
}

// chunkMismatch is a chunk whose bytes fail its chunk CRC.
type chunkMismatch struct {
	chunk     int
	got, want uint32
}

func (e *chunkMismatch) Error() string {
	return fmt.Sprintf("chunk %d: crc32c %08x, recorded %08x", e.chunk, e.got, e.want)
}

// land checks chunk c, just read with CRC32C crc, against its chunk CRC and
// extends the checksum over the chunks from next on that all landed.
func (in *inFlight) land(c int, crc uint32) error {
	if in.want != nil && crc != in.want[c] {
		return &chunkMismatch{chunk: c, got: crc, want: in.want[c]}
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	in.crcs[c], in.done[c] = crc, true
	grew := false
	for in.next < len(in.done) && in.done[in.next] {
		in.crc = block.CombineCRC32C(in.crc, in.crcs[in.next], int64(min(ReadChunk, in.size-in.next*ReadChunk)))
		in.next++
		grew = true
	}
	if grew && in.proven != nil {
		in.proven(min(in.next*ReadChunk, in.size))
	}
	return nil
}

// readChunk reads chunk c of the block into buf, in requests of in.piece
// bytes, and returns its CRC32C, each request's bytes summed as soon as they
// landed. An O_DIRECT read reads whole pages, so the last request reads up to
// buf's capacity and ends at EOF; bytes past the block's size are never summed.
func (r *Reader) readChunk(fd int, buf []byte, c int, in *inFlight) (uint32, error) {
	size := len(buf)
	start, end := c*ReadChunk, min((c+1)*ReadChunk, size)
	whole := buf[:cap(buf)]
	var crc uint32
	for n := start; n < end; {
		stop := min(n+in.piece, end)
		if stop == size {
			stop = cap(buf)
		}
		m, err := unix.Pread(fd, whole[n:stop], int64(n))
		if err == syscall.EINTR {
			continue
		}
		if err == syscall.EINVAL {
			// A short O_DIRECT read left the rest unaligned: go on buffered.
			in.mu.Lock()
			wasDirect := in.direct
			in.direct = false
			in.mu.Unlock()
			if wasDirect {
				if err := setDirect(fd, false); err != nil {
					return 0, err
				}
				continue
			}
		}
		if err != nil {
			return 0, fmt.Errorf("reading %d bytes at %d: %w", end-n, n, err)
		}
		if m == 0 {
			return 0, &shortBlock{at: n}
		}
		crc = block.UpdateCRC32C(crc, buf[n:min(n+m, end)])
		n += m
	}
	return crc, nil
}

// readPiece is the size of one read request of a chunk. Where the kernel
// copies the bytes out of memory (a filesystem in memory, or a read that is
// not O_DIRECT) a request moves block.CachePiece bytes, so that they are
// checksummed while in the core's cache: the copy and its check cost one
// pass over memory instead of two. An O_DIRECT read of a disk, which the
// device writes into memory without the CPU, reads the whole chunk in one
// request, as large as the disk likes them.
func (s *Store) readPiece(direct bool) int {
	if direct && !s.inMemory {
		return ReadChunk
	}
	return block.CachePiece
}

// shortBlock is a block file that ends before the block's size.
type shortBlock struct{ at int }

func (e *shortBlock) Error() string { return fmt.Sprintf("file ends at %d bytes", e.at) }

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
	return r.s.corrupt(r, "%s", reason)
}

// corrupt drops a block whose bytes fail verification and returns EIO. The
// load that drops it counts the failure and logs it: loads of the block
// already under way that fail too are the same failure. A block whose file
// changed since the daemon last saw it counts as changed outside the daemon
// (changed.go), any other as a checksum failure.
func (s *Store) corrupt(r *Reader, format string, args ...any) error {
	b := r.b
	e := newError("read", b.rel, syscall.EIO, format, args...)
	outside := r.changedOutside()
	s.mu.Lock()
	if s.blocks[b.rel] == b {
		if outside {
			s.counters.ChangedOutside.Add(1)
		} else {
			s.counters.ChecksumFailures.Add(1)
		}
		s.cfg.Logger.Error("corrupt block removed from the store", "path", s.Path(b.rel), "reason", e.Msg, "changed_outside_the_daemon", outside)
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
