package disk

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/tiers/block"
	"github.com/kvtierfs/kvtierfs/tiers/shm"
)

// This file is the passthrough store path (DESIGN.md "The store"): the kernel
// writes the engine's row straight into the tmp file, and the daemon learns
// the block's checksum, probe windows and zero pages at the rename, from the
// engine's row that the file's bytes came from, or by reading the file back.

// WrittenRows finds the engine's row a block was written from (*shm.Set).
type WrittenRows interface {
	// Fits reports whether some region is made of rows of size bytes.
	Fits(size int64) bool
	// ScanWritten finds a row holding pages (offset → page) and reads its
	// checksum, probe windows and all-zero pages.
	ScanWritten(size int64, pages map[int64][]byte) (shm.WrittenRow, bool)
}

// UseRows lets tmp files of a tier whose row size is known, and for which a
// region of such rows is mapped, be written by the kernel without the daemon
// (Writer.Passthrough).
func (s *Store) UseRows(rows WrittenRows) {
	s.mu.Lock()
	s.rows = rows
	s.mu.Unlock()
}

// verifyPages is how many pages of a passthrough tmp file a rename reads
// back, as one run at a random place in one request, to find the row they
// came from. Reads among the writers' stream cost the disk per request, not
// per byte (BENCHMARKS.md "Issues 10 and 14, third round").
const verifyPages = 8

// verifyRuns bounds the runs a rename reads while each one read is all
// zero (a sparse row): zero pages tell no row apart. Run i lies in the i-th
// of verifyRuns equal parts of the file, so a row with half its pages zero
// (another node's slot) is always told by one of them.
const verifyRuns = 3

// releaseWait bounds how long a rename waits for the kernel to release the
// tmp's passthrough descriptor after the writer closed it.
const releaseWait = 2 * time.Second

// DefaultPassthroughMinRow is the mount's --passthrough-min-row: rows below
// it are written through the daemon, whose rename reads nothing, rather than
// passed through, whose rename reads the file to find the row it came from.
// 4 MiB keeps 8 MiB and field rows (8,601,600 B) passed through, where the
// daemon's copy doubles its CPU per GB; BENCHMARKS.md "Small rows through
// the daemon" has the figures.
const DefaultPassthroughMinRow = 4 << 20

// Passthrough reserves the tier's row size against the capacity and returns
// the tmp's descriptor for the kernel to write to directly. ok is false
// (the writes then reach WriteAt) when the tier's row size is not known yet
// or below Config.PassthroughMinRow, no region has rows of that size, or
// the capacity cannot take the row.
func (w *Writer) Passthrough() (fd int, ok bool) {
	w.tmp.mu.Lock()
	defer w.tmp.mu.Unlock()
	t, s := w.tmp, w.s
	s.mu.Lock()
	rows := s.rows
	s.mu.Unlock()
	if w.file == nil || t.expect == 0 || t.expect < s.cfg.PassthroughMinRow || t.size != 0 || rows == nil || !rows.Fits(t.expect) {
		return 0, false
	}
	reserving := time.Now()
	if err := s.reserve(t.expect, w.rel); err != nil {
		return 0, false
	}
	s.TimePhase(PhaseCreateReserve, reserving)
	s.mu.Lock()
	// The kernel opens a backing file of its own, which would break the
	// lease (and wait for it).
	t.giveBackLeaseLocked()
	t.allocated += t.expect
	t.passthrough = true
	t.released = make(chan struct{})
	s.mu.Unlock()
	return int(w.file.Fd()), true
}

// leavePassthroughLocked returns a passthrough reservation when a write
// reaches the daemon after all (the kernel did not take the backing file).
// The caller holds t.mu.
func (w *Writer) leavePassthroughLocked() {
	t := w.tmp
	if !t.passthrough {
		return
	}
	w.s.mu.Lock()
	t.allocated -= t.expect
	w.s.used -= t.expect
	t.passthrough = false
	w.s.mu.Unlock()
	close(t.released)
}

// awaitRelease waits until the writer of a passthrough tmp released it: until
// then the kernel may still write to the file, which a published block must
// never see.
func (t *tmpFile) awaitRelease(rel string) error {
	t.mu.Lock()
	released := t.released
	t.mu.Unlock()
	if released == nil {
		return nil
	}
	deadline := time.After(releaseWait)
	select {
	case <-released:
	case <-deadline:
		return newError("rename", rel, syscall.EBUSY, "the tmp file is still open for writing: close it before renaming it")
	}
	// The kernel sends the release when the writer's descriptor closes, but
	// a MAP_SHARED mapping of the tmp (or an asynchronous write) holds the
	// store file open for writing past it, and could change the block after
	// its digest was taken.
	for {
		t.mu.Lock()
		alone := t.file == nil || soleWriter(int(t.file.Fd()))
		t.mu.Unlock()
		if alone {
			return nil
		}
		select {
		case <-deadline:
			return newError("rename", rel, syscall.EBUSY, "the tmp file is still mapped or open for writing: unmap and close it before renaming it")
		case <-time.After(time.Millisecond):
		}
	}
}

// soleWriter reports whether fd, open for writing, is the only open
// description of its file that can write to it: a write lease is granted
// only then. A filesystem or kernel without leases is not asked again.
func soleWriter(fd int) bool {
	_, err := unix.FcntlInt(uintptr(fd), unix.F_SETLEASE, unix.F_WRLCK)
	if err != nil {
		return err != unix.EAGAIN
	}
	unix.FcntlInt(uintptr(fd), unix.F_SETLEASE, unix.F_UNLCK)
	return true
}

// settlePassthroughLocked counts what a passthrough tmp allocated beyond its
// reservation once its writer released it. The caller holds t.mu and s.mu.
func (s *Store) settlePassthroughLocked(t *tmpFile) {
	if t.file == nil {
		return
	}
	if _, physical, err := fileSize(t.file); err == nil && physical > t.allocated {
		s.used += physical - t.allocated
		t.allocated = physical
	}
}

// dropOvergrownLocked removes a released passthrough tmp that the kernel
// wrote past its tier's row size: it can never become a block, and the bytes
// written past its reservation leave the capacity at the release instead of
// when the tmp expires. The caller holds t.mu and s.mu.
func (s *Store) dropOvergrownLocked(rel string, t *tmpFile) {
	if s.tmps[rel] != t || t.file == nil {
		return
	}
	size, _, err := fileSize(t.file)
	if err != nil || size <= t.expect {
		return
	}
	if err := s.unlinkTmpLocked(rel, t); err != nil {
		s.cfg.Logger.Warn("removing a tmp file written past its row size", "path", s.Path(rel), "err", err)
	}
	s.untrackLocked(rel, t)
	s.cfg.Logger.Warn("removed a tmp file written past its tier's row size: it cannot become a block",
		"path", s.Path(rel), "bytes", size, "row_bytes", t.expect)
}

// written is what a proof learns about a passthrough tmp's bytes.
type written struct {
	sum   *block.Sum
	probe func(off int64) (uint64, error)
	// fromRow is set when the digest is the row's, not read from the file.
	fromRow bool
}

// sealPassthrough learns a passthrough tmp's checksum and probe windows from
// the engine's row its bytes came from (a run of verifyPages pages of the file
// must equal it), or else by reading the file back, and leaves its all-zero
// pages as holes. The tmp's size is its file's, a positive multiple of the
// page size (tmpFile.wholeRow). The caller holds t.mu; the writer has
// released the file.
func (s *Store) sealPassthrough(t *tmpFile, f *os.File) (written, error) {
	var w written
	row, found, err := s.writtenRow(t, f)
	if err != nil {
		return w, err
	}
	if err := punchZeroRuns(f, row.ZeroRuns); err != nil {
		return w, err
	}
	offsets := block.ProbeOffsets(t.size)
	w.sum, w.fromRow = &row.Sum, found
	w.probe = func(off int64) (uint64, error) {
		for i, o := range offsets {
			if o == off {
				return row.Probes[i], nil
			}
		}
		return 0, syscall.EINVAL
	}
	return w, nil
}

// writtenRow is a released passthrough tmp's checksum, probe windows and
// all-zero pages: in a store in memory from its file (sealInMemory), else
// from the engine's row that holds a run of pages read from the file
// (found), else from the file read back.
func (s *Store) writtenRow(t *tmpFile, f *os.File) (row shm.WrittenRow, found bool, err error) {
	size := t.size
	if s.inMemory {
		if row, ok, err := s.sealInMemory(t, f); ok || err != nil {
			return row, false, err
		}
	}
	s.mu.Lock()
	rows := s.rows
	s.mu.Unlock()
	// The file is read O_DIRECT where it allows it (no readahead pulls more
	// of it back from the disk), into recycled page-aligned buffers.
	fd := int(f.Fd())
	direct := setDirect(fd, true) == nil
	defer setDirect(fd, false)
	reading := time.Now()
	run := s.buffers.get(verifyPages * block.PageSize)
	for i := 0; rows != nil && i < verifyRuns; i++ {
		pages, telling, err := readRun(f, size, i, run, &direct)
		if err != nil {
			s.buffers.put(run)
			return row, false, err
		}
		if telling {
			s.TimePhase(PhaseProbeRead, reading)
			row, found = rows.ScanWritten(size, pages)
			break
		}
	}
	s.buffers.put(run)
	s.counters.WriteBytes.Add(size)
	if found {
		s.counters.StoresFromRow.Add(1)
		// The row may have changed since the kernel wrote the file: a page
		// zero in the row is punched only where the file holds zeros too, or
		// the hole would turn the file into the row and hide the change.
		if row.ZeroRuns, err = s.zeroRunsOfFile(f, row.ZeroRuns, &direct); err != nil {
			return row, true, err
		}
		return row, true, nil
	}
	s.counters.StoresReadBack.Add(1)
	row, err = s.readBack(f, size, &direct)
	return row, false, err
}

// punchZeroRuns leaves a tmp's all-zero page runs as holes, through a
// writable descriptor of f's file where f is read-only (readOnlyInMemory).
func punchZeroRuns(f *os.File, runs [][2]int64) error {
	if len(runs) == 0 {
		return nil
	}
	fd := int(f.Fd())
	if flags, err := unix.FcntlInt(f.Fd(), unix.F_GETFL, 0); err == nil && flags&unix.O_ACCMODE == unix.O_RDONLY {
		w, err := reopen(f, unix.O_WRONLY)
		if err != nil {
			return err
		}
		defer w.Close()
		fd = int(w.Fd())
	}
	for _, r := range runs {
		if err := unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, r[0], r[1]-r[0]); err != nil && !errors.Is(err, unix.EOPNOTSUPP) {
			return err
		}
	}
	return nil
}

// reopen opens f's file again through the descriptor (never a name), with
// flags.
func reopen(f *os.File, flags int) (*os.File, error) {
	fd, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", f.Fd()), flags|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}

// readOnlyInMemory replaces a released passthrough tmp's descriptor, in a
// store in memory, by a read-only one of the same file, so that its proof
// can take a read lease (granted only while no one has the file open for
// writing, the daemon included). Where that fails the tmp keeps its own.
// The caller holds t.mu.
func (s *Store) readOnlyInMemory(t *tmpFile) {
	if !t.passthrough || !s.inMemory || t.file == nil {
		return
	}
	ro, err := reopen(t.file, unix.O_RDONLY)
	if err != nil {
		return
	}
	s.mu.Lock()
	t.file.Close()
	t.file = ro
	s.mu.Unlock()
}

// sealInMemory learns a released passthrough tmp's digest, in a store in
// memory, from its file mapped under a read lease taken now on its
// read-only descriptor f (readOnlyInMemory; granted only while no one has
// the file open for writing, the kernel's backing file closed), as a load
// would check it: one pass over the bytes, as the row's scan is, and no
// probe read. A file without zero pages stays mapped under the lease for
// the block's loads (tmpFile.leaseMap, keepStoredLocked), its pages faulted
// in by the scan; one with zero pages is unmapped before they are punched.
// ok is false where the lease or the mapping is refused or the file is
// sparse (a fault of a shared mapping allocates its holes): the row is then
// found as on a disk. The caller holds t.mu.
func (s *Store) sealInMemory(t *tmpFile, f *os.File) (row shm.WrittenRow, ok bool, err error) {
	lease := s.leaseOn(f, unix.F_RDLCK)
	if lease == nil {
		return row, false, nil
	}
	data := mapLeased(lease, t.size)
	if data == nil {
		s.mu.Lock()
		t.lease = lease
		t.giveBackLeaseLocked()
		s.mu.Unlock()
		return row, false, nil
	}
	row, err = scanMapped(data)
	s.counters.WriteBytes.Add(t.size)
	s.counters.StoresReadBack.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	t.lease = lease
	if err != nil || len(row.ZeroRuns) > 0 {
		unix.Munmap(data)
		t.giveBackLeaseLocked()
		return row, true, err
	}
	t.leaseMap = data
	return row, true, nil
}

// scanMapped is shm.ScanRow of a mapped file; a file cut short under the
// mapping (possible only once a lease break outlasted lease-break-time) is
// an error, not a crash.
func scanMapped(data []byte) (row shm.WrittenRow, err error) {
	err = faultsAsEIO(func() { row = shm.ScanRow(data) })
	return row, err
}

// readRun reads a run of up to verifyPages whole pages at a random place in
// part i of verifyRuns of a size-byte file, in one request, into buf (page
// aligned, verifyPages long; the pages returned are slices of it). telling
// is false when every page read is zero.
func readRun(f *os.File, size int64, i int, buf []byte, direct *bool) (pages map[int64][]byte, telling bool, err error) {
	page := int64(block.PageSize)
	total := size / page
	n := min(total, verifyPages)
	first := min(total*int64(i)/verifyRuns, total-n)
	last := max(first, total*int64(i+1)/verifyRuns-n)
	start := (first + rand.Int64N(last-first+1)) * page
	buf = buf[:n*page]
	if _, err := readFullAt(f, buf, start, direct); err != nil {
		return nil, false, err
	}
	pages = make(map[int64][]byte, n)
	for p := range n {
		data := buf[p*page : (p+1)*page]
		pages[start+p*page] = data
		telling = telling || !block.IsZero(data)
	}
	return pages, telling, nil
}

// readBackChunk is how much of a tmp file readBack reads at once.
const readBackChunk = 4 << 20

// readBack reads a tmp file whose row was not found: its checksum, probe
// windows and all-zero page runs.
func (s *Store) readBack(f *os.File, size int64, direct *bool) (shm.WrittenRow, error) {
	buf := s.buffers.get(readBackChunk)
	defer s.buffers.put(buf)
	var w shm.WrittenRow
	offsets := block.ProbeOffsets(size)
	w.Probes = make([]uint64, len(offsets))
	for at := int64(0); at < size; at += readBackChunk {
		chunk := buf[:min(readBackChunk, size-at)]
		if _, err := readFullAt(f, chunk, at, direct); err != nil {
			return w, err
		}
		w.Sum.Write(chunk)
		for _, r := range nonZeroComplement(chunk, at) {
			if n := len(w.ZeroRuns); n > 0 && w.ZeroRuns[n-1][1] == r[0] {
				w.ZeroRuns[n-1][1] = r[1]
			} else {
				w.ZeroRuns = append(w.ZeroRuns, r)
			}
		}
		for i, o := range offsets {
			if o >= at && o+8 <= at+int64(len(chunk)) {
				w.Probes[i] = binary.LittleEndian.Uint64(chunk[o-at:])
			}
		}
	}
	return w, nil
}

// zeroRunsOfFile reads the page runs of f that the row found holds as zeros
// and returns the all-zero page runs among them.
func (s *Store) zeroRunsOfFile(f *os.File, runs [][2]int64, direct *bool) ([][2]int64, error) {
	if len(runs) == 0 {
		return nil, nil
	}
	buf := s.buffers.get(readBackChunk)
	defer s.buffers.put(buf)
	var out [][2]int64
	for _, r := range runs {
		for at := r[0]; at < r[1]; at += readBackChunk {
			chunk := buf[:min(readBackChunk, r[1]-at)]
			if _, err := readFullAt(f, chunk, at, direct); err != nil {
				return nil, err
			}
			for _, z := range nonZeroComplement(chunk, at) {
				if n := len(out); n > 0 && out[n-1][1] == z[0] {
					out[n-1][1] = z[1]
				} else {
					out = append(out, z)
				}
			}
		}
	}
	return out, nil
}

// nonZeroComplement lists the all-zero page runs of a page-aligned chunk at off.
func nonZeroComplement(p []byte, off int64) [][2]int64 {
	var out [][2]int64
	for start := 0; start < len(p); start += block.PageSize {
		if !block.IsZero(p[start : start+block.PageSize]) {
			continue
		}
		a, b := off+int64(start), off+int64(start+block.PageSize)
		if n := len(out); n > 0 && out[n-1][1] == a {
			out[n-1][1] = b
		} else {
			out = append(out, [2]int64{a, b})
		}
	}
	return out
}

// readFullAt fills p from f at off, dropping O_DIRECT if the file refuses it.
func readFullAt(f *os.File, p []byte, off int64, direct *bool) (int, error) {
	done := 0
	for done < len(p) {
		n, err := unix.Pread(int(f.Fd()), p[done:], off+int64(done))
		if *direct && errors.Is(err, syscall.EINVAL) {
			*direct = false
			setDirect(int(f.Fd()), false)
			continue
		}
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return done, err
		}
		if n == 0 {
			return done, errors.New("tmp file shorter than its size")
		}
		done += n
	}
	return done, nil
}
