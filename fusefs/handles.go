package fusefs

import (
	"context"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/kvtierfs/kvtierfs/fusefs/core"
	"github.com/kvtierfs/kvtierfs/internal/descriptors"
	"github.com/kvtierfs/kvtierfs/tiers/block"
	"github.com/kvtierfs/kvtierfs/tiers/disk"
)

// tmpHandle is the descriptor of a block tmp file being written. With a
// passthrough fd, the kernel writes the engine's row straight into the store
// file and the rename learns its checksum (disk.Writer.Passthrough); else
// writes reach the daemon (FOPEN_DIRECT_IO), each one counted against the
// capacity and checksummed as it arrives. disk.Writer serialises them.
type tmpHandle struct {
	w     *disk.Writer
	fsys  *FS
	start time.Time
	// passthroughFd is the store file the kernel writes to; -1 for none.
	passthroughFd int
	// held is the open the descriptor reserve admitted.
	held *descriptors.Held
}

var _ = (fs.FilePassthroughFder)((*tmpHandle)(nil))

// PassthroughFd hands the kernel the tmp's store file when its row's bytes
// are reserved.
func (h *tmpHandle) PassthroughFd() (int, bool) { return h.passthroughFd, h.passthroughFd >= 0 }

// openFlags are the tmp's FOPEN flags: FOPEN_DIRECT_IO would override
// passthrough in the kernel. FOPEN_NOFLUSH spares the engine's close the
// FLUSH round trip (Linux 5.16 on; older kernels ignore the flag and send
// it): a tmp has nothing to flush.
func (h *tmpHandle) openFlags() uint32 {
	if h.passthroughFd >= 0 {
		return fuse.FOPEN_NOFLUSH
	}
	return fuse.FOPEN_DIRECT_IO | fuse.FOPEN_NOFLUSH
}

var _ = (fs.FileAllocater)((*tmpHandle)(nil))

// Allocate runs fallocate on the tmp within the capacity.
func (h *tmpHandle) Allocate(ctx context.Context, off, size uint64, mode uint32) syscall.Errno {
	return disk.Errno(h.w.Allocate(int64(off), int64(size), mode))
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
// Only kernels before FOPEN_NOFLUSH send it (openFlags).
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
	defer h.held.Release()
	return disk.Errno(h.w.Close())
}

// blockHandle is the descriptor of a block opened for a load: the kernel's
// requests translated into calls on a core.Load, which holds the block's
// bytes and proves them before the READ that completes the block returns.
// Every READ is served by the daemon from them, never through the page
// cache, so no page of an unproven block is cached. An O_DIRECT
// load is opened in the kernel's cached mode, where its one read goes out as
// parallel READs (async direct I/O) that daemon threads copy at once; a
// buffered one FOPEN_DIRECT_IO, so it moves in whole requests rather than
// through the page cache in readahead-sized ones.
type blockHandle struct {
	load   *core.Load
	fsys   *FS
	direct bool
	start  time.Time
	// held is the open the descriptor reserve admitted.
	held *descriptors.Held
}

// openBlock opens a block for a load (oDirect: the caller opened with
// O_DIRECT); the handle releases held.
func (f *FS) openBlock(ctx context.Context, ref block.Ref, oDirect bool, held *descriptors.Held) (*blockHandle, error) {
	l, err := f.loads.Open(ctx, ref)
	if err != nil {
		return nil, err
	}
	f.tier.Loaded(ref, callerThread(ctx), l.Size())
	return &blockHandle{load: l, fsys: f, direct: !oDirect, start: time.Now(), held: held}, nil
}

// openFlags are the FUSE open flags of the handle.
func (h *blockHandle) openFlags() uint32 {
	if h.direct {
		return fuse.FOPEN_DIRECT_IO
	}
	return 0
}

var _ = (fs.FileReader)((*blockHandle)(nil))

// Read answers a READ from the load's bytes once they landed (core.Load.Read);
// the reply tells the load when it was delivered.
func (h *blockHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	data, err := h.load.Read(ctx, off, len(dest))
	if err != nil {
		return nil, disk.Errno(err)
	}
	return &loadReply{data: data, load: h.load, off: off}, 0
}

// loadReply is a READ reply of a load. go-fuse writes its slices to the
// kernel and calls Done after that write, which for a direct read means the
// bytes are in the reader's buffer.
type loadReply struct {
	data []byte
	load *core.Load
	off  int64
}

func (r *loadReply) Size() int { return len(r.data) }

func (r *loadReply) Bytes([]byte) ([]byte, fuse.Status) { return r.data, fuse.OK }

// Slices makes go-fuse write the reply first and call Done after it.
func (r *loadReply) Slices() ([][]byte, fuse.Status) { return [][]byte{r.data}, fuse.OK }

func (r *loadReply) Done() { r.load.Delivered(r.off, r.off+int64(len(r.data))) }

var _ = (fs.FileFlusher)((*blockHandle)(nil))

// Flush repeats a failed load's error for engines that honour close errors,
// and counts a completed load by the time its close returns.
func (h *blockHandle) Flush(ctx context.Context) syscall.Errno {
	err := h.load.Flush()
	h.fsys.metrics.readSeconds.Observe(time.Since(h.start).Seconds())
	return disk.Errno(err)
}

var _ = (fs.FileReleaser)((*blockHandle)(nil))

// Release unpins the block and recycles its bytes: the kernel sends RELEASE
// only after every READ of the handle has been answered.
func (h *blockHandle) Release(ctx context.Context) syscall.Errno {
	defer h.held.Release()
	return disk.Errno(h.load.Release())
}
