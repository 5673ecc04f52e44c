package fusefs

import (
	"context"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
	"github.com/kvtierfs/kvtierfs/internal/descriptors"
	"github.com/kvtierfs/kvtierfs/tiers/block"
	"github.com/kvtierfs/kvtierfs/tiers/disk"
	"github.com/kvtierfs/kvtierfs/tiers/tier"
)

// node is a file or directory of the store. It is go-fuse's loopback node with
// the block-specific operations routed through the store.
type node struct {
	*fs.LoopbackNode
	fsys *FS
}

var _ = (fs.NodeWrapChilder)((*node)(nil))

// WrapChild makes every node the loopback creates below the root a node of
// this filesystem.
func (n *node) WrapChild(ctx context.Context, ops fs.InodeEmbedder) fs.InodeEmbedder {
	if lb, ok := ops.(*fs.LoopbackNode); ok {
		return &node{LoopbackNode: lb, fsys: n.fsys}
	}
	return ops
}

// rel is the store-relative path of child name of this directory. The
// kernel's names are single components and the tree's paths are clean, so
// a join needs no cleaning (it runs for every LOOKUP).
func (n *node) rel(name string) string {
	if dir := n.Path(n.Root()); dir != "" {
		return dir + "/" + name
	}
	return name
}

// self is the store-relative path of this node.
func (n *node) self() string { return n.Path(n.Root()) }

// isRoot reports whether this is the mount root.
func (n *node) isRoot() bool { return n.EmbeddedInode() == n.Root() }

// callerThread is the kernel thread id behind a request, which tells lookup batches apart.
func callerThread(ctx context.Context) uint32 {
	if c, ok := fuse.FromContext(ctx); ok {
		return c.Pid
	}
	return 0
}

// errno logs a rejected or failed operation and returns its errno.
func (n *node) errno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	if e := disk.Errno(err); e != syscall.ENOENT {
		n.fsys.logger.Warn("request refused", "err", err)
		return e
	}
	return syscall.ENOENT
}

var _ = (fs.NodeLookuper)((*node)(nil))

// Lookup answers lookups of the block layout from memory (DESIGN "Lookups and
// the kernel's caches"): blocks from the store's index, the two directory
// levels from the lookup index; other names from the store.
func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if n.isRoot() && name == ctlabi.Dir {
		return n.fsys.control, 0
	}
	rel := n.rel(name)
	switch kind, blockName := block.Parse(rel); kind {
	case block.File:
		return n.blockEntry(ctx, name, block.Ref{Rel: rel, Name: blockName}, out)
	case block.TmpFile:
		defer n.fsys.store.TimePhase(disk.PhaseTmpLookup, time.Now())
		return n.lookupStore(ctx, name, out)
	}
	dir := block.ParseDir(rel)
	if dir.Level == block.PrefixDir {
		// The kernel had forgotten this name: it may have dropped the
		// tier's other prefix names too.
		n.fsys.primeTier(ctx, dir.Tier)
	}
	if dir.Level != block.NotLayoutDir {
		// The index sees every directory the store gains: through the
		// mount, from the shared level's lookups and its fetches (FS.indexEvent).
		switch e, exists, known := n.fsys.index.layoutAnswer(rel); {
		case exists:
			return n.cached(out)(n.indexedChild(ctx, e, out), 0)
		case known && !n.fsys.tier.SharedDir(rel):
			n.fsys.tier.MissedDir(rel, callerThread(ctx))
			out.SetEntryTimeout(n.fsys.absentTimeout(rel))
			return nil, syscall.ENOENT
		case known:
			// Made just now: the shared store holds it.
			n.fsys.namespaceChanged(rel)
		}
	}
	child, errno := n.cached(out)(n.lookupStore(ctx, name, out))
	if errno == syscall.ENOENT && n.fsys.tier.SharedDir(rel) {
		n.fsys.namespaceChanged(rel)
		child, errno = n.cached(out)(n.lookupStore(ctx, name, out))
	}
	if errno == syscall.ENOENT {
		n.fsys.tier.MissedDir(rel, callerThread(ctx))
		out.SetEntryTimeout(n.fsys.negativeTimeout)
	}
	if errno == 0 && n.isRoot() && out.Attr.Mode&syscall.S_IFMT == syscall.S_IFDIR {
		n.fsys.primeTier(ctx, name)
	}
	return child, errno
}

// blockEntry answers a block's lookup as the tier decides (tier.Tier.Lookup).
// An absent block is cached by the kernel as long as the layout's other
// absent names; a withheld one not at all.
func (n *node) blockEntry(ctx context.Context, name string, ref block.Ref, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	start := time.Now()
	verdict := n.fsys.tier.Lookup(ref, callerThread(ctx))
	n.fsys.metrics.lookupSeconds.Observe(time.Since(start).Seconds())
	switch verdict.Answer {
	case tier.Withheld:
		// Not cached: the next request's lookup asks again.
		return nil, syscall.ENOENT
	case tier.Absent:
		out.SetEntryTimeout(n.fsys.absentTimeout(ref.Rel))
		return nil, syscall.ENOENT
	}
	child, errno := n.presentBlockEntry(ctx, name, ref, verdict.Answer == tier.InShared, out)
	if errno == 0 && verdict.AskEachTime {
		out.SetEntryTimeout(0)
	}
	return child, errno
}

// presentBlockEntry is the entry of a block the store, or the shared store,
// holds. The kernel keeps a stored block's entry and attributes as long as
// the store extends its lookup protection (FS.blockEntryTimeout).
func (n *node) presentBlockEntry(ctx context.Context, name string, ref block.Ref, inShared bool, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if inShared {
		return n.sharedBlockEntry(ctx, ref.Rel, out)
	}
	var child *fs.Inode
	errno := syscall.Errno(0)
	if e, ok := n.fsys.blockAttr(ref.Rel); ok {
		child = n.indexedChild(ctx, e, out)
	} else {
		child, errno = n.lookupStore(ctx, name, out)
	}
	if errno == 0 {
		out.SetEntryTimeout(n.fsys.blockEntryTimeout)
		out.SetAttrTimeout(n.fsys.blockEntryTimeout)
	}
	return child, errno
}

// indexedChild is the child inode of an entry answered from the lookup
// index, the one go-fuse's loopback would have made from the store.
func (n *node) indexedChild(ctx context.Context, e storeEntry, out *fuse.EntryOut) *fs.Inode {
	out.Attr = e.attr
	return n.NewInode(ctx, &fs.LoopbackNode{RootData: n.RootData}, e.id)
}

// cached sets the kernel's entry timeout on a successful entry reply:
// `return n.cached(out)(n.mkdirStore(…, out))`.
func (n *node) cached(out *fuse.EntryOut) func(*fs.Inode, syscall.Errno) (*fs.Inode, syscall.Errno) {
	return func(child *fs.Inode, errno syscall.Errno) (*fs.Inode, syscall.Errno) {
		switch {
		case errno != 0:
		case out.Attr.Mode&syscall.S_IFMT == syscall.S_IFDIR:
			// Directories change only through the mount (the daemon never
			// removes one), which keeps the kernel's view right: every
			// lookup of a key walks them without asking the daemon.
			out.SetEntryTimeout(DirTimeout)
			out.SetAttrTimeout(DirTimeout)
		default:
			out.SetEntryTimeout(n.fsys.entryTimeout)
		}
		return child, errno
	}
}

// created records a name the mount created in the lookup index:
// `return n.created(name)(n.cached(out)(n.mknodStore(…)))`.
func (n *node) created(name string) func(*fs.Inode, syscall.Errno) (*fs.Inode, syscall.Errno) {
	return func(child *fs.Inode, errno syscall.Errno) (*fs.Inode, syscall.Errno) {
		if errno == 0 {
			n.fsys.namespaceChanged(n.rel(name))
		}
		return child, errno
	}
}

// refuseName rejects names that the layout reserves: the control directory and
// block names that cannot be created directly. kind is what the name is (block.Parse).
func (n *node) refuseName(name string, kind block.Kind) syscall.Errno {
	if n.isRoot() && name == ctlabi.Dir {
		return syscall.EEXIST
	}
	switch kind {
	case block.Malformed:
		n.fsys.logger.Warn("refused malformed block name: blocks are named <hex hash>.bin", "path", n.rel(name))
		return syscall.EINVAL
	case block.File:
		n.fsys.logger.Warn("refused direct creation of a block: publish it by renaming a tmp file written beside it", "path", n.rel(name))
		return syscall.EPERM
	}
	return 0
}

var _ = (fs.NodeCreater)((*node)(nil))

// Create creates block tmp files through the store (checked, checksummed
// writes) and every other file in the store directory as it is, once the
// descriptor reserve admits the open (admit).
func (n *node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	held, errno := n.admit(ctx)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	child, fh, fuseFlags, errno := n.create(ctx, name, flags, mode, out, held)
	held.Opened()
	if errno != 0 {
		held.Release()
	}
	return child, fh, fuseFlags, errno
}

// create is Create once admitted: the handle releases held.
func (n *node) create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut, held *descriptors.Held) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	rel := n.rel(name)
	kind, _ := block.Parse(rel)
	if errno := n.refuseName(name, kind); errno != 0 {
		return nil, nil, 0, errno
	}
	if kind != block.TmpFile {
		return n.createOther(ctx, name, flags, mode, out, held)
	}
	defer n.fsys.store.TimePhase(disk.PhaseCreate, time.Now())
	w, err := n.fsys.store.CreateTmp(rel, int(flags))
	if err != nil {
		return nil, nil, 0, n.errno(err)
	}
	n.fsys.tier.NoteIOThread(callerThread(ctx))
	e, err := n.fsys.index.entryAt(w.Fd(), "")
	if err != nil {
		w.Close()
		return nil, nil, 0, n.errno(err)
	}
	child := n.indexedChild(ctx, e, out)
	h := &tmpHandle{w: w, fsys: n.fsys, start: time.Now(), passthroughFd: -1, held: held}
	if fd, ok := w.Passthrough(); ok {
		h.passthroughFd = fd
	}
	return child, h, h.openFlags(), 0
}

// admit asks the descriptor reserve for an open of the engine's that holds
// the daemon's descriptors until its handle is released: ENFILE, counted,
// when it would leave too few for the daemon's own work (internal/descriptors).
func (n *node) admit(ctx context.Context) (*descriptors.Held, syscall.Errno) {
	held, err := n.fsys.reserve.Admit(callerThread(ctx))
	if err != nil {
		return nil, syscall.ENFILE
	}
	return held, 0
}

var _ = (fs.NodeOpener)((*node)(nil))

// Open opens a block for a load (core.Loads.Open), whose bytes are proven
// before the read that completes it returns, and every other file as it
// is, once the descriptor reserve admits the open (admit); blocks are
// immutable once published.
func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	held, errno := n.admit(ctx)
	if errno != 0 {
		return nil, 0, errno
	}
	fh, fuseFlags, errno := n.open(ctx, flags, held)
	held.Opened()
	if errno != 0 {
		held.Release()
	}
	return fh, fuseFlags, errno
}

// open is Open once admitted: the handle releases held.
func (n *node) open(ctx context.Context, flags uint32, held *descriptors.Held) (fs.FileHandle, uint32, syscall.Errno) {
	rel := n.self()
	writing := flags&syscall.O_ACCMODE != syscall.O_RDONLY || flags&syscall.O_TRUNC != 0
	switch kind, blockName := block.Parse(rel); {
	case kind == block.File && writing:
		n.fsys.logger.Warn("refused write access to a published block: blocks are replaced by renaming a new tmp file over them", "path", rel)
		return nil, 0, syscall.EPERM
	case kind == block.File:
		h, err := n.fsys.openBlock(ctx, block.Ref{Rel: rel, Name: blockName}, flags&syscall.O_DIRECT != 0, held)
		if err != nil {
			return nil, 0, n.errno(err)
		}
		return h, h.openFlags(), 0
	case kind == block.TmpFile && writing && n.fsys.store.IsTracked(rel):
		return nil, 0, syscall.EBUSY
	}
	return n.openOther(ctx, flags, held)
}

var _ = (fs.NodeRenamer)((*node)(nil))

// Rename publishes blocks (tmp → block name) and moves everything else as it is.
func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	if _, control := newParent.(*controlDir); control {
		return syscall.EPERM
	}
	dst, ok := newParent.(*node)
	if !ok {
		return syscall.EXDEV
	}
	if n.isRoot() && name == ctlabi.Dir || dst.isRoot() && newName == ctlabi.Dir {
		return syscall.EPERM
	}
	srcRel, dstRel := n.rel(name), dst.rel(newName)
	srcKind, _ := block.Parse(srcRel)
	dstKind, dstName := block.Parse(dstRel)
	dstRef := block.Ref{Rel: dstRel, Name: dstName}
	switch {
	case dstKind == block.Malformed:
		return dst.refuseName(newName, dstKind)
	case srcKind == block.File:
		n.fsys.logger.Warn("refused rename of a published block", "path", srcRel, "to", dstRel)
		return syscall.EPERM
	case dstKind == block.File:
		if flags != 0 {
			return syscall.EINVAL
		}
		defer n.fsys.store.TimePhase(disk.PhaseRename, time.Now())
		if err := n.fsys.tier.Publish(srcRel, dstRef); err != nil {
			return n.errno(err)
		}
		n.fsys.sampleStore(context.WithoutCancel(ctx), dstRel)
		return 0
	case flags&unix.RENAME_EXCHANGE != 0 && (srcKind != block.OtherFile || dstKind != block.OtherFile || n.fsys.store.HasBlocksUnder(dstRel)):
		// The other side moves too: a block tmp, or a directory holding
		// blocks, exchanged away would leave the store's index behind.
		n.fsys.logger.Warn("refused a rename exchange with a block tmp file or a directory holding blocks", "path", srcRel, "with", dstRel)
		return syscall.EPERM
	case srcKind == block.TmpFile && n.fsys.store.TmpOpen(srcRel):
		n.fsys.logger.Warn("refused rename of a block tmp file still open for writing", "path", srcRel, "to", dstRel)
		return syscall.EBUSY
	case n.fsys.store.HasBlocksUnder(srcRel):
		n.fsys.logger.Warn("refused rename of a directory holding blocks", "path", srcRel)
		return syscall.EBUSY
	}
	replaced := func() {}
	if flags&unix.RENAME_EXCHANGE == 0 {
		replaced = n.fsys.store.RemovingOther(dstRel)
	}
	if errno := n.renameStore(name, dst, newName, flags); errno != 0 {
		return errno
	}
	replaced()
	if srcKind == block.TmpFile {
		n.fsys.store.ForgetTmp(srcRel, dstRel)
	}
	n.fsys.namespaceMoved(srcRel)
	n.fsys.namespaceMoved(dstRel)
	return 0
}

var _ = (fs.NodeUnlinker)((*node)(nil))

// Unlink removes blocks and tmp files through the store, keeping the index and
// the capacity accounting exact.
func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	rel := n.rel(name)
	switch kind, blockName := block.Parse(rel); {
	case kind == block.File:
		return n.errno(n.fsys.tier.Unlink(block.Ref{Rel: rel, Name: blockName}))
	case kind == block.TmpFile && n.fsys.store.IsTracked(rel):
		return n.errno(n.fsys.store.RemoveTmp(rel))
	}
	gone := n.fsys.store.RemovingOther(rel)
	errno := n.removeStore(name, 0)
	if errno == 0 {
		gone()
		n.fsys.namespaceChanged(rel)
	}
	return errno
}

var _ = (fs.NodeIoctler)((*node)(nil))

// Ioctl refuses every ioctl the kernel forwards (ENOTTY), on files and
// directories alike: go-fuse's loopback handles run any of them on the
// store's descriptor, with the daemon's capabilities (a directory
// listing's handle did: the engine's uid could have had FITRIM or
// EXT4_IOC_SHUTDOWN run as root on the store filesystem). go-fuse asks the
// node before the handle.
func (n *node) Ioctl(ctx context.Context, f fs.FileHandle, cmd uint32, arg uint64, input []byte, output []byte) (int32, syscall.Errno) {
	return 0, syscall.ENOTTY
}

var _ = (fs.NodeTmpfiler)((*node)(nil))

// Tmpfile refuses O_TMPFILE: such a file is written past the daemon (no
// name to count it by) and cannot be linked into the store.
func (n *node) Tmpfile(ctx context.Context, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	return nil, nil, 0, syscall.EOPNOTSUPP
}

var _ = (fs.NodeMkdirer)((*node)(nil))

// Mkdir creates a directory, except over the control directory's name,
// owned by the engine's uid and private to it.
func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if n.isRoot() && name == ctlabi.Dir {
		return nil, syscall.EEXIST
	}
	child, errno := n.mkdirStore(ctx, name, mode&0o700, out)
	if errno == syscall.EEXIST && block.ParseDir(n.rel(name)).Level != block.NotLayoutDir {
		// Made in the store, not through the mount: index it and drop the
		// kernel's cached absence (after this request, which holds the
		// directory's lock), so the engine's next lookup finds it.
		n.fsys.namespaceMoved(n.rel(name))
		go n.EmbeddedInode().NotifyEntry(name)
	}
	if errno != 0 {
		return nil, errno
	}
	n.fsys.namespaceChanged(n.rel(name))
	return n.cached(out)(child, 0)
}

// mkdirStore makes a directory owned by the engine's uid, private to it.
func (n *node) mkdirStore(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (child *fs.Inode, errno syscall.Errno) {
	errno = n.inParent(n.rel(name), func(dirfd int, base string) error {
		if err := unix.Mkdirat(dirfd, base, mode); err != nil {
			return err
		}
		fd, err := unix.Openat(dirfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err == nil {
			defer unix.Close(fd)
			err = n.fsys.privatize(fd, mode, &out.Attr)
		}
		var e storeEntry
		if err == nil {
			e, err = n.fsys.index.entryAt(fd, "")
		}
		if err != nil {
			n.fsys.logger.Warn("could not give a new directory to the engine's uid", "path", n.rel(name), "err", err)
			unix.Unlinkat(dirfd, base, unix.AT_REMOVEDIR)
			return syscall.EIO
		}
		child = n.indexedChild(ctx, e, out)
		return nil
	})
	return child, errno
}

var _ = (fs.NodeMknoder)((*node)(nil))

// Mknod creates special files outside the block layout only.
func (n *node) Mknod(ctx context.Context, name string, mode, rdev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if errno := n.refuseLayoutName(name); errno != 0 {
		return nil, errno
	}
	return n.created(name)(n.cached(out)(n.mknodStore(ctx, name, mode, rdev, out)))
}

var _ = (fs.NodeSymlinker)((*node)(nil))

// Symlink creates links outside the block layout only.
func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if errno := n.refuseLayoutName(name); errno != 0 {
		return nil, errno
	}
	return n.created(name)(n.cached(out)(n.symlinkStore(ctx, target, name, out)))
}

var _ = (fs.NodeLinker)((*node)(nil))

// Link creates hard links outside the block layout only, and never to a
// block or a block tmp file: a second name would let the block be written,
// or the tmp be changed after it is published, past the store's rules.
func (n *node) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if errno := n.refuseLayoutName(name); errno != 0 {
		return nil, errno
	}
	t, ok := target.(*node)
	if !ok {
		return nil, syscall.EXDEV
	}
	if kind, _ := block.Parse(t.self()); kind == block.File || kind == block.TmpFile {
		n.fsys.logger.Warn("refused a hard link to a block or block tmp file", "path", t.self(), "link", n.rel(name))
		return nil, syscall.EPERM
	}
	return n.created(name)(n.cached(out)(n.linkStore(ctx, t, name, out)))
}

// refuseLayoutName rejects block and tmp names for anything but the tmp → rename path.
func (n *node) refuseLayoutName(name string) syscall.Errno {
	kind, _ := block.Parse(n.rel(name))
	if errno := n.refuseName(name, kind); errno != 0 {
		return errno
	}
	if kind == block.TmpFile {
		return syscall.EPERM
	}
	return 0
}

var _ = (fs.NodeSetattrer)((*node)(nil))

// Setattr changes only the times of a published block (setBlockAttr), and
// refuses size changes of tmp files being written except through their
// writer's descriptor (ftruncate to the row size).
func (n *node) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if kind, _ := block.Parse(n.self()); kind == block.File {
		return n.setBlockAttr(ctx, in, out)
	}
	if size, sizeChange := in.GetSize(); sizeChange {
		rel := n.self()
		kind, _ := block.Parse(rel)
		if h, ok := f.(*tmpHandle); ok && kind == block.TmpFile {
			if err := h.w.Truncate(int64(size)); err != nil {
				return n.errno(err)
			}
			in.Valid &^= fuse.FATTR_SIZE
		} else if kind == block.File || kind == block.TmpFile && n.fsys.store.IsTracked(rel) {
			n.fsys.logger.Warn("refused truncate of a block or block tmp file", "path", rel)
			return syscall.EPERM
		}
	}
	errno := n.setattrStore(ctx, f, in, out)
	if _, sizeChange := in.GetSize(); sizeChange && f == nil && errno == 0 {
		n.fsys.settlePath(n.self())
	}
	return errno
}

var _ = (fs.NodeStatfser)((*node)(nil))

// Statfs reports the tier, not its filesystem: what it can hold now and
// may still use (disk.Store.Reach), so df's used is the tier's own bytes,
// counted in the fragments (f_frsize) that df multiplies them by. Only the
// engine's uid and root learn the tier's figures, as only they may read
// stats.json: with --allow-other any local user can statfs the mount, and
// its usage over time tells the engine's traffic. Others get no counts, as
// the kernel answers those a mount does not allow.
func (n *node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	if errno := n.statfsStore(out); errno != 0 {
		return errno
	}
	if !n.fsys.mayControl(ctx) {
		out.Blocks, out.Bfree, out.Bavail, out.Files, out.Ffree = 0, 0, 0, 0, 0
		return 0
	}
	capacity, free := n.fsys.store.Reach()
	unit := int64(out.Frsize)
	if unit == 0 {
		unit = int64(out.Bsize)
	}
	if unit == 0 {
		unit = int64(block.PageSize)
		out.Frsize = uint32(unit)
	}
	out.Blocks = uint64(capacity / unit)
	out.Bfree = uint64(free / unit)
	out.Bavail = out.Bfree
	return 0
}
