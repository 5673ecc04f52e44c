package fusefs

import (
	"context"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/tiers/disk"
)

// A published block's attributes are answered from memory: the lookup
// index's (size, mode, identity) with the times the store keeps for it
// (disk.Times: set by utimensat, moved by loads), so a lookup's entry, a
// stat and an evictor's scan agree.

// withTimes overlays a block's times from the store on its attributes.
func withTimes(attr *fuse.Attr, t disk.Times) {
	attr.Atime, attr.Atimensec = uint64(t.Atime.Sec), uint32(t.Atime.Nsec)
	attr.Mtime, attr.Mtimensec = uint64(t.Mtime.Sec), uint32(t.Mtime.Nsec)
	attr.Ctime, attr.Ctimensec = uint64(t.Ctime.Sec), uint32(t.Ctime.Nsec)
}

// blockAttr is a published block's attributes, if the index and the store
// both hold it.
func (f *FS) blockAttr(rel string) (storeEntry, bool) {
	e, ok := f.index.block(rel)
	if !ok {
		return storeEntry{}, false
	}
	t, ok := f.store.Times(rel)
	if !ok {
		return storeEntry{}, false
	}
	withTimes(&e.attr, t)
	return e, true
}

// setBlockAttr changes a published block's times, on its file through the
// store; a block's size, mode and owner are the store's and never change.
func (n *node) setBlockAttr(ctx context.Context, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	rel := n.self()
	if in.Valid&fuse.FATTR_SIZE != 0 {
		n.fsys.logger.Warn("refused truncate of a block or block tmp file", "path", rel)
		return syscall.EPERM
	}
	if in.Valid&(fuse.FATTR_MODE|fuse.FATTR_UID|fuse.FATTR_GID) != 0 {
		n.fsys.logger.Warn("refused a change of a block's mode or owner: blocks are the store's", "path", rel)
		return syscall.EPERM
	}
	if in.Valid&(fuse.FATTR_ATIME|fuse.FATTR_MTIME) != 0 {
		atime := setTime(in.Valid, fuse.FATTR_ATIME, fuse.FATTR_ATIME_NOW, in.Atime, in.Atimensec)
		mtime := setTime(in.Valid, fuse.FATTR_MTIME, fuse.FATTR_MTIME_NOW, in.Mtime, in.Mtimensec)
		if _, err := n.fsys.store.SetTimes(rel, atime, mtime); err != nil {
			return n.errno(err)
		}
	}
	return n.Getattr(ctx, nil, out)
}

// setTime is the utimensat time a SETATTR asks for one of a file's times.
func setTime(valid, set, now uint32, sec uint64, nsec uint32) unix.Timespec {
	switch {
	case valid&set == 0:
		return unix.Timespec{Nsec: unix.UTIME_OMIT}
	case valid&now != 0:
		return unix.Timespec{Nsec: unix.UTIME_NOW}
	}
	return unix.Timespec{Sec: int64(sec), Nsec: int64(nsec)}
}
