package fusefs

import (
	"context"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/staging"
	"github.com/kvtierfs/kvtierfs/tiers/disk"
	"github.com/kvtierfs/kvtierfs/tiers/shm"
)

// tmpHandle is the descriptor of a block tmp file being written. Writes reach
// the daemon (FOPEN_DIRECT_IO) so each one is checked, counted against the
// capacity and checksummed as it arrives. disk.Writer serialises them.
type tmpHandle struct {
	w     *disk.Writer
	fsys  *FS
	start time.Time
}

var _ = (fs.FileWriter)((*tmpHandle)(nil))

// Write appends a chunk of the engine's row.
func (h *tmpHandle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	n, err := h.w.WriteAt(data, off)
	if err != nil {
		h.fsys.logger.Warn("block write refused", "err", err)
		return uint32(n), disk.Errno(err)
	}
	return uint32(n), 0
}

var _ = (fs.FileFlusher)((*tmpHandle)(nil))

// Flush has nothing to do: bytes are in the store file once Write returns.
func (h *tmpHandle) Flush(ctx context.Context) syscall.Errno { return 0 }

var _ = (fs.FileFsyncer)((*tmpHandle)(nil))

// Fsync makes the tmp file durable.
func (h *tmpHandle) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	return disk.Errno(h.w.Sync())
}

var _ = (fs.FileReleaser)((*tmpHandle)(nil))

// Release closes the tmp file; publication happens at rename.
func (h *tmpHandle) Release(ctx context.Context) syscall.Errno {
	h.fsys.metrics.writeSeconds.Observe(time.Since(h.start).Seconds())
	return disk.Errno(h.w.Close())
}

// loadMode is how the kernel reads a block handle.
type loadMode uint8

const (
	// passthrough: the kernel reads the store file itself.
	passthrough loadMode = iota
	// cached: reads reach the daemon as READ requests of at most the
	// mount's request size; the kernel sends the requests of one O_DIRECT
	// read together (async direct I/O), so daemon threads copy a row's
	// pieces in parallel. Buffered reads would go through the kernel's page
	// cache in readahead-sized requests, so only O_DIRECT loads use it.
	cached
	// direct: reads reach the daemon one request at a time
	// (FOPEN_DIRECT_IO), a mode that coexists with either of the others.
	direct
)

// loadModes counts a node's open block handles by mode. The kernel refuses
// (EIO) to open an inode for passthrough while it has cached opens, and the
// reverse, so a load that would cause that takes the direct mode instead.
// The daemon's counts drop at RELEASE, after the kernel's, so they never
// undercount what the kernel holds.
type loadModes struct {
	mu                  sync.Mutex
	passthrough, cached int
}

// acquire chooses the mode of a new load: an O_DIRECT load from memory
// (staged) cached, a load from the store passthrough, unless the kernel
// holds the node open in the other; anything else direct.
func (m *loadModes) acquire(fromMemory, oDirect bool) loadMode {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case fromMemory && !oDirect:
		return direct
	case fromMemory && m.passthrough == 0:
		m.cached++
		return cached
	case !fromMemory && m.cached == 0:
		m.passthrough++
		return passthrough
	}
	return direct
}

// release forgets a handle of mode mode.
func (m *loadModes) release(mode loadMode) {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch mode {
	case cached:
		m.cached--
	case passthrough:
		m.passthrough--
	}
}

// blockHandle is the descriptor of a block opened for a load. A load served
// from staged memory is copied by the daemon (cached mode, so the pieces of
// a row travel in parallel); any other passes through to the store file,
// with Read as the fallback through the daemon. The block is pinned until
// Release.
//
// The bytes are proven before the engine can count the load as done: a load
// served from staged memory was verified when it was staged; otherwise at
// open by reading the file when no shm region can hold the block, or at FLUSH
// by finding a row of the engine's region that did not hold the block at open
// and now holds exactly its bytes (digest samples, then CRC32C). A FLUSH that
// cannot find one falls back to reading the file. With peers, the row is
// looked for in every case, since it is the row to mirror. mu guards the outcome.
type blockHandle struct {
	r     *disk.Reader
	fsys  *FS
	start time.Time
	// mode is how the kernel reads this handle, counted in modes until Release.
	mode  loadMode
	modes *loadModes

	mu sync.Mutex
	// digest and before are set when the load is proven at FLUSH in a region row.
	digest shm.Digest
	before []shm.RowRef
	// verifiedAtOpen is set when the block file was verified at open.
	verifiedAtOpen bool
	// staged holds the block's verified bytes when staging had them; the
	// load is then served from memory, and servedStaged records that it was.
	staged       []byte
	servedStaged bool
	// readingStore is set while a load not served from staging counts as a
	// store read in flight for the stager (until its first FLUSH or Release).
	readingStore bool
	// flushed, err, identified and row are the outcome of the first FLUSH.
	flushed    bool
	err        syscall.Errno
	identified bool
	row        shm.RowRef
}

// openBlock pins a block, chooses how its load will be proven and how the
// kernel will read it (oDirect: the caller opened with O_DIRECT), counting
// the handle in modes.
func (f *FS) openBlock(rel string, oDirect bool, modes *loadModes) (*blockHandle, error) {
	h, err := f.pinForLoad(rel)
	if err != nil {
		return nil, err
	}
	h.modes = modes
	h.mode = modes.acquire(h.staged != nil, oDirect)
	if h.staged == nil && f.stager != nil {
		f.stager.StoreLoadStarted()
		h.readingStore = true
	}
	return h, nil
}

// storeReadDone ends the handle's store read for the stager. h.mu is held.
func (h *blockHandle) storeReadDone() {
	if h.readingStore {
		h.readingStore = false
		h.fsys.stager.StoreLoadDone()
	}
}

// pinForLoad pins a block and chooses how its load will be proven.
func (f *FS) pinForLoad(rel string) (*blockHandle, error) {
	r, err := f.store.PinBlock(rel)
	if err != nil {
		return nil, err
	}
	h := &blockHandle{r: r, fsys: f, start: time.Now()}
	if f.stager != nil {
		h.staged, _ = f.stager.Take(staging.Key(rel))
	}
	f.diagnostics.Read(staging.Key(rel), r.Size())
	mirrors := f.sync != nil && f.sync.Mirrors()
	if h.staged != nil && !mirrors {
		return h, nil // served from verified memory: nothing to find at FLUSH
	}
	if d, ok := r.Digest(); ok && f.regions != nil && f.regions.Fits(d.Size) {
		h.digest, h.before = d, f.regions.Candidates(d)
		return h, nil
	}
	if h.staged != nil {
		return h, nil
	}
	if err := r.Verify(); err != nil {
		r.Close()
		return nil, err
	}
	h.verifiedAtOpen = true
	return h, nil
}

// openFlags are the FUSE open flags of the handle's mode.
func (h *blockHandle) openFlags() uint32 {
	if h.mode == direct {
		return fuse.FOPEN_DIRECT_IO
	}
	return 0
}

var _ = (fs.FilePassthroughFder)((*blockHandle)(nil))

// PassthroughFd hands the store file to the kernel in passthrough mode.
func (h *blockHandle) PassthroughFd() (int, bool) {
	if h.mode != passthrough {
		return 0, false
	}
	return int(h.r.File().Fd()), true
}

var _ = (fs.FileReader)((*blockHandle)(nil))

// Read fills dest completely unless the block ends first: a short read makes
// the engine delete the block.
func (h *blockHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	h.mu.Lock()
	staged := h.staged
	h.servedStaged = staged != nil
	h.mu.Unlock()
	if staged != nil {
		return readFrom(staged, off, len(dest)), 0
	}
	fd := int(h.r.File().Fd())
	n := 0
	for n < len(dest) {
		m, err := unix.Pread(fd, dest[n:], off+int64(n))
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return nil, disk.Errno(err)
		}
		if m == 0 {
			break
		}
		n += m
	}
	return fuse.ReadResultData(dest[:n]), 0
}

var _ = (fs.FileFlusher)((*blockHandle)(nil))

// Flush is the barrier before the engine counts the load as done: it fails
// with EIO unless the load's bytes are proven and, on a multi-node group,
// every peer holds the same row. Later flushes (dup'd descriptors) repeat
// the first outcome.
func (h *blockHandle) Flush(ctx context.Context) syscall.Errno {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.flushed {
		// Counted here, not at the asynchronous RELEASE, so a load is in the
		// stats by the time its close returns.
		h.flushed = true
		h.storeReadDone()
		h.fsys.store.CountRead(h.r.Size())
		if h.err = h.prove(); h.err == 0 {
			// A signal to the closing thread makes the kernel send an
			// INTERRUPT, but it still waits for this answer: finish the
			// mirror (bounded by --sync-deadline) instead of failing the load.
			h.err = h.fsys.mirror(context.WithoutCancel(ctx), h)
		}
		h.fsys.metrics.readSeconds.Observe(time.Since(h.start).Seconds())
	}
	return h.err
}

// prove checks the bytes of the load: found in a row of the engine's region
// that did not hold them at open, or else by reading the block file again.
func (h *blockHandle) prove() syscall.Errno {
	if h.verifiedAtOpen {
		return 0
	}
	if h.servedStaged && (h.fsys.sync == nil || !h.fsys.sync.Mirrors() || h.fsys.regions == nil || !h.fsys.regions.Fits(h.digest.Size)) {
		return 0 // served from verified memory; no row to find for mirroring
	}
	if ref, ok := h.fsys.regions.Confirm(h.digest, h.before); ok {
		h.identified, h.row = true, ref
		h.fsys.rowsIdentified.Add(1)
		return 0
	}
	h.fsys.rowsUnidentified.Add(1)
	if h.servedStaged {
		return 0
	}
	if err := h.r.Verify(); err != nil {
		h.fsys.logger.Error("load failed verification at close", "err", err)
		return disk.Errno(err)
	}
	return 0
}

var _ = (fs.FileReleaser)((*blockHandle)(nil))

// Release unpins the block and recycles its staged buffer: the kernel sends
// RELEASE only after every READ of the handle has been answered.
func (h *blockHandle) Release(ctx context.Context) syscall.Errno {
	h.mu.Lock()
	h.storeReadDone()
	if h.staged != nil {
		h.fsys.store.RecycleBlock(h.staged)
		h.staged = nil
	}
	h.mu.Unlock()
	h.modes.release(h.mode)
	return disk.Errno(h.r.Close())
}
