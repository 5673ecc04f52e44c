package fusefs

import (
	"context"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/internal/descriptors"
	"github.com/kvtierfs/kvtierfs/tiers/disk"
)

// Files outside the block layout are stored as they come, with two rules
// (DESIGN "Threat model"): what is created through the mount belongs to the
// engine's uid, and every byte written counts
// against the capacity. So their writes reach the daemon (no passthrough),
// which reserves room before each write or fallocate and then records what
// the file allocates (disk.Store.ReserveOther, SettleOther).

// createOther creates a file outside the block layout, owned by the
// engine's uid. It keeps the mode asked (POSIX): the mount root keeps other
// users out. Only a file the daemon made is given away: a name that exists
// in the store by now (made beside the mount) is opened as it is.
func (n *node) createOther(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut, held *descriptors.Held) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	rel := n.rel(name)
	fd, err := n.fsys.store.OpenFile(rel, storeOpenFlags(flags)|syscall.O_CREAT|syscall.O_EXCL, mode&0o7777)
	created := err == nil
	if err == unix.EEXIST && flags&syscall.O_EXCL == 0 {
		fd, err = n.fsys.store.OpenFile(rel, storeOpenFlags(flags), 0)
	}
	if err != nil {
		return nil, nil, 0, disk.Errno(err)
	}
	if created {
		err = n.fsys.privatize(fd, mode&0o7777, &out.Attr)
	}
	var e storeEntry
	if err == nil {
		e, err = n.fsys.index.entryAt(fd, "")
	}
	if err != nil {
		n.fsys.logger.Warn("could not give a new file to the engine's uid", "path", rel, "err", err)
		unix.Close(fd)
		if created {
			n.removeStore(name, 0)
		}
		return nil, nil, 0, syscall.EIO
	}
	f := n.fsys.newOtherFile(rel, fs.NewLoopbackFile(fd), held)
	f.settle(0)
	n.fsys.namespaceChanged(rel)
	child := n.indexedChild(ctx, e, out)
	out.SetEntryTimeout(n.fsys.entryTimeout)
	return child, f, 0, 0
}

// openOther opens a file outside the block layout through the daemon; the
// handle releases held.
func (n *node) openOther(ctx context.Context, flags uint32, held *descriptors.Held) (fs.FileHandle, uint32, syscall.Errno) {
	fd, err := n.fsys.store.OpenFile(n.self(), storeOpenFlags(flags), 0)
	if err != nil {
		return nil, 0, disk.Errno(err)
	}
	f := n.fsys.newOtherFile(n.self(), fs.NewLoopbackFile(fd), held)
	if flags&syscall.O_TRUNC != 0 {
		f.settle(0)
	}
	return f, 0, 0
}

// privatize gives the file or directory open at fd to the engine's uid with
// mode, and reports its attributes in out.
func (f *FS) privatize(fd int, mode uint32, out *fuse.Attr) error {
	if err := f.store.MakePrivate(fd, mode); err != nil {
		return err
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return err
	}
	out.FromStat(&st)
	return nil
}

// otherFile is an open file outside the block layout: go-fuse's loopback
// file, with its writes counted against the capacity and no passthrough
// (the kernel would write past the daemon).
type otherFile struct {
	*fs.LoopbackFile
	fsys *FS
	rel  string
	fd   int
	// held is the open the descriptor reserve admitted.
	held *descriptors.Held
}

// newOtherFile wraps a loopback file handle, which releases held.
func (f *FS) newOtherFile(rel string, fh fs.FileHandle, held *descriptors.Held) *otherFile {
	lf := fh.(*fs.LoopbackFile)
	fd, _ := lf.PassthroughFd()
	return &otherFile{LoopbackFile: lf, fsys: f, rel: rel, fd: fd, held: held}
}

// Release closes the file and gives its open back to the descriptor reserve.
func (o *otherFile) Release(ctx context.Context) syscall.Errno {
	defer o.held.Release()
	return o.LoopbackFile.Release(ctx)
}

// PassthroughFd declines passthrough, so every write reaches Write.
func (o *otherFile) PassthroughFd() (int, bool) { return 0, false }

// settle records what the file allocates after a change, returning reserved bytes.
func (o *otherFile) settle(reserved int64) {
	var st unix.Stat_t
	if err := unix.Fstat(o.fd, &st); err != nil {
		st = unix.Stat_t{}
	}
	o.fsys.store.SettleOther(&st, reserved)
}

// reserve makes room for n bytes before they are written: ENOSPC past the
// capacity, EDQUOT past the bound on files outside the block layout.
func (o *otherFile) reserve(n int64) syscall.Errno {
	var st unix.Stat_t
	if err := unix.Fstat(o.fd, &st); err != nil {
		return disk.Errno(err)
	}
	if err := o.fsys.store.ReserveOther(n, &st, o.rel); err != nil {
		o.fsys.logger.Warn("refused a write outside the block layout", "path", o.rel, "bytes", n, "err", err)
		return disk.Errno(err)
	}
	return 0
}

// Write writes within the capacity.
func (o *otherFile) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	if errno := o.reserve(int64(len(data))); errno != 0 {
		return 0, errno
	}
	defer o.settle(int64(len(data)))
	return o.LoopbackFile.Write(ctx, data, off)
}

// Writev writes within the capacity.
func (o *otherFile) Writev(ctx context.Context, data [][]byte, off int64) (uint32, syscall.Errno) {
	var n int64
	for _, d := range data {
		n += int64(len(d))
	}
	if errno := o.reserve(n); errno != 0 {
		return 0, errno
	}
	defer o.settle(n)
	return o.LoopbackFile.Writev(ctx, data, off)
}

// Allocate allocates within the capacity.
func (o *otherFile) Allocate(ctx context.Context, off, size uint64, mode uint32) syscall.Errno {
	reserved := int64(size)
	if mode&(unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_COLLAPSE_RANGE) != 0 {
		reserved = 0 // frees space
	}
	if errno := o.reserve(reserved); errno != 0 {
		return errno
	}
	defer o.settle(reserved)
	return o.LoopbackFile.Allocate(ctx, off, size, mode)
}

// Setattr applies a change (truncate included) and records the new size.
func (o *otherFile) Setattr(ctx context.Context, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	defer o.settle(0)
	return o.LoopbackFile.Setattr(ctx, in, out)
}

// settlePath records what the file at rel outside the block layout
// allocates, after a change made without an open handle.
func (f *FS) settlePath(rel string) {
	if st, err := f.store.Lstat(rel); err == nil {
		f.store.SettleOther(&st, 0)
	}
}
