package disk

import (
	"fmt"
	"runtime/debug"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// InPlace is a pinned block of a store kept in memory (tmpfs, ramfs), served
// where it lies instead of copied into a daemon buffer: the file mapped
// read-only under a read lease. The engine's uid owns the store tree and
// could write the file after it was checked; the lease is granted only while
// nobody has the file open for writing, and any later open for writing or
// truncate(2) of it then waits in the kernel until the lease is given back
// (Close) or lease-break-time (45 s by default) passed. Held tells whether
// that wait has begun, so a load checks it around every reply (DESIGN.md
// "Loads: proven before the read returns").
type InPlace struct {
	r    *Reader
	data []byte
}

// MapInPlace maps the pinned block for a load to serve in place, when the
// store keeps it in memory and the read lease is granted; ok is false
// otherwise (a disk, a writer holding the file open, a file of another size
// or with holes)
// and the load copies the block (ReadInto). Verify the mapping with
// VerifyInPlace before serving it; Close it before closing the Reader.
func (r *Reader) MapInPlace() (p *InPlace, ok bool) {
	fd := int(r.file.Fd())
	size := int(r.b.size)
	var st unix.Statfs_t
	if size == 0 || unix.Fstatfs(fd, &st) != nil || st.Type != unix.TMPFS_MAGIC && st.Type != unix.RAMFS_MAGIC {
		return nil, false
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETLEASE, unix.F_RDLCK); err != nil {
		return nil, false
	}
	// Sized under the lease: a file of another size goes to ReadInto,
	// which drops it as corrupt. A sparse file (the zero pages of a row
	// left as holes) is copied too: a fault of a shared mapping on tmpfs
	// allocates its holes, which would grow the store past its accounting.
	if n, physical, err := fileSize(r.file); err != nil || n != int64(size) || physical < int64(roundUpToPage(size)) {
		unix.FcntlInt(uintptr(fd), unix.F_SETLEASE, unix.F_UNLCK)
		return nil, false
	}
	data, err := unix.Mmap(fd, 0, size, unix.PROT_READ, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		unix.FcntlInt(uintptr(fd), unix.F_SETLEASE, unix.F_UNLCK)
		return nil, false
	}
	return &InPlace{r: r, data: data}, true
}

// Bytes are the mapped block: serve a range only while Held.
func (p *InPlace) Bytes() []byte { return p.data }

// Held reports whether the read lease is still held with no break begun: no
// one has since opened the file for writing or truncated it, so the mapped
// bytes are still those VerifyInPlace checked, and stay so for at least
// lease-break-time after the first false.
func (p *InPlace) Held() bool {
	lease, err := unix.FcntlInt(p.r.file.Fd(), unix.F_GETLEASE, 0)
	return err == nil && lease == unix.F_RDLCK
}

// VerifyInPlace checks the mapped block against its digest, chunk by chunk
// (up to maxChunksInFlight at once), calling proven as ReadInto does. A
// mismatch removes the block and returns EIO.
func (r *Reader) VerifyInPlace(p *InPlace, proven func(prefix int)) error {
	s, d := r.s, r.Digest()
	size := len(p.data)
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
				if crc, errs[w] = sumMapped(p.data[c*ReadChunk : min((c+1)*ReadChunk, size)]); errs[w] == nil {
					errs[w] = in.land(c, crc)
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return s.corrupt(r.b, "%v", err)
		}
	}
	if in.crc != d.CRC {
		return s.corrupt(r.b, "crc32c %08x, recorded %08x", in.crc, d.CRC)
	}
	r.checked()
	if in.want == nil && n <= block.MaxChunks {
		r.addChunks(d, in.crcs)
	}
	return nil
}

// sumMapped is the CRC32C of part of a mapped file; a file cut short under
// the mapping (possible only once a lease break outlasted lease-break-time)
// is an error, not a crash.
func sumMapped(b []byte) (crc uint32, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("file cut short while being checked: %v: %w", r, syscall.EIO)
		}
	}()
	return block.CRC32C(b), nil
}

// Close unmaps the block and gives the lease back, letting a writer waiting
// for it go on.
func (p *InPlace) Close() {
	unix.Munmap(p.data)
	p.data = nil
	unix.FcntlInt(p.r.file.Fd(), unix.F_SETLEASE, unix.F_UNLCK)
}
