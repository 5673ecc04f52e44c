package fusefs

import (
	"context"
	"hash/fnv"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/kvtierfs/kvtierfs/tiers/block"
	"github.com/kvtierfs/kvtierfs/tiers/disk"
	"github.com/kvtierfs/kvtierfs/tiers/shared"
	"github.com/kvtierfs/kvtierfs/tiers/tier"
)

// SharedLevel is the shared second level as the mount uses it
// (tiers/shared.Level; DESIGN.md "The shared level").
type SharedLevel interface {
	// tier.Shared's Lookup also answers whether the shared store holds a
	// directory of the layout.
	tier.Shared
	// Size is the size of a block the shared store was found holding.
	Size(rel string) (int64, bool)
	// Fetch copies a block from the shared store into the local store,
	// verified, and returns its bytes (core.Fetcher).
	Fetch(rel string) ([]byte, error)
	Stats() shared.Stats
}

// sharedBlockEntry answers the lookup of a block only the shared store holds:
// an inode with the block's attributes, which a load opens like any block
// (core.Loads.Open fetches it first).
func (n *node) sharedBlockEntry(ctx context.Context, rel string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	size, ok := n.fsys.shared.Size(rel)
	if !ok {
		return nil, syscall.ENOENT
	}
	ino := sharedIno(rel)
	n.fsys.sharedAttr(size, ino, &out.Attr)
	out.SetEntryTimeout(n.fsys.entryTimeout)
	out.SetAttrTimeout(n.fsys.entryTimeout)
	child := &node{LoopbackNode: &fs.LoopbackNode{RootData: n.RootData}, fsys: n.fsys}
	return n.NewInode(ctx, child, fs.StableAttr{Mode: syscall.S_IFREG, Ino: ino}), 0
}

// sharedAttr fills the attributes of a block not yet fetched from the shared store.
func (f *FS) sharedAttr(size int64, ino uint64, out *fuse.Attr) {
	owner := f.store.Owner()
	st := syscall.Stat_t{Ino: ino, Mode: syscall.S_IFREG | disk.PrivateFileMode, Nlink: 1, Size: size,
		Uid: uint32(owner.UID), Gid: uint32(owner.GID), Blocks: (size + 511) / 512}
	convertTo(&st.Blksize, block.PageSize)
	out.FromStat(&st)
}

// sharedIno numbers the inode of a block known only in the shared store,
// far from the local filesystem's numbers and below the control files'.
func sharedIno(rel string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(rel))
	return 1<<61 | h.Sum64()&(1<<61-1)
}

var _ = (fs.NodeGetattrer)((*node)(nil))

// Getattr answers a published block from memory (FS.blockAttr), and for a
// block known only in the shared store until it is fetched; everything else
// as the loopback does. The kernel keeps the answer as long as the entry it
// belongs to (node.cached, presentBlockEntry): a directory's below the root
// for DirTimeout (the kernel drops a directory's attributes itself when the
// mount changes it; with 1 s, each leaf a lookup batch walks cost a GETATTR
// every second), a block's for the block entry timeout. The root's stays
// short: a client holding a descriptor of it tells a dead daemon by fstat's
// ENOTCONN (tiers/shared does), which the kernel's cache would hide.
func (n *node) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if e, ok := n.fsys.blockAttr(n.self()); ok {
		out.Attr = e.attr
		out.SetTimeout(n.fsys.blockEntryTimeout)
		return 0
	}
	errno := n.getattrStore(ctx, f, out)
	if errno == 0 && out.Mode&syscall.S_IFMT == syscall.S_IFDIR && !n.isRoot() {
		out.SetTimeout(DirTimeout)
	}
	if errno != syscall.ENOENT || n.fsys.shared == nil {
		return errno
	}
	rel := n.self()
	if kind, _ := block.Parse(rel); kind != block.File {
		return errno
	}
	size, ok := n.fsys.shared.Size(rel)
	if !ok {
		return errno
	}
	n.fsys.sharedAttr(size, n.StableAttr().Ino, &out.Attr)
	out.SetTimeout(n.fsys.entryTimeout)
	return 0
}
