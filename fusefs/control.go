package fusefs

import (
	"context"
	"encoding/json"
	"sync"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
)

// The control directory and its files belong to the engine's uid (the
// store's owner) with modes 0700 and 0600, and each open checks the caller:
// only that uid and root may read stats or match keys (DESIGN "Threat model").

// controlDir is MOUNTPOINT/.kvtier.
type controlDir struct {
	fs.Inode
	fsys *FS
}

var _ = (fs.NodeGetattrer)((*controlDir)(nil))

// Getattr reports a directory private to the engine's uid.
func (d *controlDir) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	d.fsys.privateAttr(&out.Attr, syscall.S_IFDIR|0o700)
	return 0
}

// privateAttr sets the mode and the engine's ownership of a control node.
func (f *FS) privateAttr(out *fuse.Attr, mode uint32) {
	owner := f.store.Owner()
	out.Mode = mode
	out.Uid, out.Gid = uint32(owner.UID), uint32(owner.GID)
}

// mayControl reports whether the caller of a request may use the control
// files: the engine's uid or root.
func (f *FS) mayControl(ctx context.Context) bool {
	caller, ok := fuse.FromContext(ctx)
	return ok && (caller.Uid == 0 || caller.Uid == uint32(f.store.Owner().UID))
}

// refuseCaller logs and refuses a control request from another user.
func (f *FS) refuseCaller(ctx context.Context, file string) syscall.Errno {
	caller, _ := fuse.FromContext(ctx)
	f.logger.Warn("refused a control file to a user who is neither the engine's uid nor root",
		"file", file, "uid", caller.Uid, "engine_uid", f.store.Owner().UID)
	return syscall.EACCES
}

// statsFile is MOUNTPOINT/.kvtier/stats.json: each open takes a snapshot that
// the descriptor then reads.
type statsFile struct {
	fs.Inode
	fsys *FS
}

var _ = (fs.NodeGetattrer)((*statsFile)(nil))

// Getattr reports a file the engine's uid may read; its size is unknown until opened.
func (s *statsFile) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	s.fsys.privateAttr(&out.Attr, syscall.S_IFREG|0o400)
	return 0
}

var _ = (fs.NodeOpener)((*statsFile)(nil))

// Open snapshots the stats.
func (s *statsFile) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if !s.fsys.mayControl(ctx) {
		return nil, 0, s.fsys.refuseCaller(ctx, ctlabi.StatsFile)
	}
	if flags&syscall.O_ACCMODE != syscall.O_RDONLY {
		return nil, 0, syscall.EACCES
	}
	data, err := json.MarshalIndent(s.fsys.Stats(), "", "  ")
	if err != nil {
		return nil, 0, syscall.EIO
	}
	return &snapshotHandle{data: append(data, '\n')}, fuse.FOPEN_DIRECT_IO, 0
}

// snapshotHandle serves a byte snapshot taken at open.
type snapshotHandle struct {
	data []byte
}

var _ = (fs.FileReader)((*snapshotHandle)(nil))

// Read serves the snapshot.
func (h *snapshotHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	return readFrom(h.data, off, len(dest)), 0
}

// readFrom answers a READ of n bytes at off from data held in memory: the
// bytes there are, none past the end.
func readFrom(data []byte, off int64, n int) fuse.ReadResult {
	end := min(int64(len(data)), off+int64(n))
	return fuse.ReadResultData(data[min(off, end):end])
}

// matchFile is MOUNTPOINT/.kvtier/match.
type matchFile struct {
	fs.Inode
	fsys *FS
}

var _ = (fs.NodeGetattrer)((*matchFile)(nil))

// Getattr reports a file the engine's uid may write requests to.
func (m *matchFile) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	m.fsys.privateAttr(&out.Attr, syscall.S_IFREG|0o600)
	return 0
}

var _ = (fs.NodeSetattrer)((*matchFile)(nil))

// Setattr accepts the truncation of an O_TRUNC open; each descriptor holds its own request.
func (m *matchFile) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if !m.fsys.mayControl(ctx) {
		return m.fsys.refuseCaller(ctx, ctlabi.MatchFile)
	}
	m.fsys.privateAttr(&out.Attr, syscall.S_IFREG|0o600)
	return 0
}

var _ = (fs.NodeOpener)((*matchFile)(nil))

// Open starts an empty request.
func (m *matchFile) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if !m.fsys.mayControl(ctx) {
		return nil, 0, m.fsys.refuseCaller(ctx, ctlabi.MatchFile)
	}
	return &matchHandle{fsys: m.fsys, thread: m.fsys.tier.MatchThread()}, fuse.FOPEN_DIRECT_IO, 0
}

// matchHandle collects one request and serves its answer. mu guards both.
type matchHandle struct {
	fsys   *FS
	thread uint32

	mu      sync.Mutex
	request []byte
	answer  []byte
}

var _ = (fs.FileWriter)((*matchHandle)(nil))

// Write appends to the request; writing again after reading starts a new one.
// A request over staging.MaxRequestBytes fails with EFBIG; one that would take
// the requests buffered on all descriptors over maxMatchBuffered, with ENOBUFS.
func (h *matchHandle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	if !h.fsys.mayControl(ctx) {
		return 0, h.fsys.refuseCaller(ctx, ctlabi.MatchFile)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.answer != nil {
		h.answer = nil
		h.dropRequestLocked()
	}
	if len(h.request)+len(data) > ctlabi.MaxRequestBytes {
		return 0, syscall.EFBIG
	}
	if h.fsys.matchBuffered.Add(int64(len(data))) > maxMatchBuffered {
		h.fsys.matchBuffered.Add(-int64(len(data)))
		return 0, syscall.ENOBUFS
	}
	h.request = append(h.request, data...)
	return uint32(len(data)), 0
}

// maxMatchBuffered bounds the match request bytes buffered on all open
// descriptors together.
const maxMatchBuffered = 4 * ctlabi.MaxRequestBytes

// dropRequestLocked forgets the request buffered so far.
func (h *matchHandle) dropRequestLocked() {
	h.fsys.matchBuffered.Add(-int64(len(h.request)))
	h.request = nil
}

var _ = (fs.FileReleaser)((*matchHandle)(nil))

// Release returns the descriptor's buffered request to maxMatchBuffered.
func (h *matchHandle) Release(ctx context.Context) syscall.Errno {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.dropRequestLocked()
	return 0
}

var _ = (fs.FileReader)((*matchHandle)(nil))

// Read answers the request written so far.
func (h *matchHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.answer == nil {
		h.answer = h.fsys.tier.Match(h.request, h.thread)
		h.dropRequestLocked()
	}
	return readFrom(h.answer, off, len(dest)), 0
}

// The control files are the daemon's, not the store's: nothing in
// MOUNTPOINT/.kvtier can be unlinked, renamed, replaced or added, by root
// either, so `kvtierfs stat` finds the mount for as long as it is mounted.

var _ = (fs.NodeUnlinker)((*controlDir)(nil))

// Unlink refuses: the control files live as long as the mount.
func (d *controlDir) Unlink(ctx context.Context, name string) syscall.Errno { return syscall.EPERM }

var _ = (fs.NodeRmdirer)((*controlDir)(nil))

// Rmdir refuses: the control directory holds no directories to remove.
func (d *controlDir) Rmdir(ctx context.Context, name string) syscall.Errno { return syscall.EPERM }

var _ = (fs.NodeRenamer)((*controlDir)(nil))

// Rename refuses moving a control file away or anything over one.
func (d *controlDir) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	return syscall.EPERM
}

var _ = (fs.NodeCreater)((*controlDir)(nil))

// Create refuses new files beside the control files.
func (d *controlDir) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	return nil, nil, 0, syscall.EPERM
}

var _ = (fs.NodeRmdirer)((*node)(nil))

// Rmdir removes a directory of the store and keeps the lookup index right;
// the control directory stays.
func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	if n.isRoot() && name == ctlabi.Dir {
		return syscall.EPERM
	}
	errno := n.removeStore(name, unix.AT_REMOVEDIR)
	if errno == 0 {
		n.fsys.namespaceChanged(n.rel(name))
	}
	return errno
}
