package fusefs

import (
	"context"
	"encoding/json"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// statsFile is MOUNTPOINT/.kvtier/stats.json: each open takes a snapshot that
// the descriptor then reads, so any user who can see the mount can run stat.
type statsFile struct {
	fs.Inode
	fsys *FS
}

var _ = (fs.NodeGetattrer)((*statsFile)(nil))

// Getattr reports a read-only file; its size is unknown until opened.
func (s *statsFile) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = syscall.S_IFREG | 0o444
	return 0
}

var _ = (fs.NodeOpener)((*statsFile)(nil))

// Open snapshots the stats.
func (s *statsFile) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
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
	if off >= int64(len(h.data)) {
		return fuse.ReadResultData(nil), 0
	}
	return fuse.ReadResultData(h.data[off:min(int64(len(h.data)), off+int64(len(dest)))]), 0
}
