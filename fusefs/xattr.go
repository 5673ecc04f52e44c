package fusefs

import (
	"bytes"
	"context"
	"strings"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/tiers/block"
	"github.com/kvtierfs/kvtierfs/tiers/disk"
)

// The store keeps block checksums in xattrs of its own namespace; the mount
// hides them and refuses changes, while every other user.* xattr (the engine's
// user.vllm.kv_crc32c) is stored as it comes.

// reservedXattr reports whether an xattr name belongs to the store.
func reservedXattr(name string) bool {
	return strings.HasPrefix(name, block.ReservedXattrPrefix)
}

// onStoreFile runs fn on the store's descriptor of this node's file when it
// is a published block or a block tmp file written through the mount,
// through on: disk.Store.ReadOnFile, or ChangeOnFile where fn changes the
// file. handled is false for every other file, which the loopback serves
// by path. A block the store does not hold is ENOENT.
func (n *node) onStoreFile(on func(rel string, fn func(fd int) error) (bool, error), fn func(fd int) error) (handled bool, errno syscall.Errno) {
	rel := n.self()
	kind, _ := block.Parse(rel)
	if kind != block.File && kind != block.TmpFile {
		return false, 0
	}
	ok, err := on(rel, fn)
	switch {
	case ok:
		return true, disk.Errno(err)
	case kind == block.File:
		return true, syscall.ENOENT
	}
	return false, 0
}

var _ = (fs.NodeGetxattrer)((*node)(nil))

// Getxattr reads an xattr of the store file.
func (n *node) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	if reservedXattr(attr) {
		return 0, syscall.ENODATA
	}
	var size int
	if handled, errno := n.onStoreFile(n.fsys.store.ReadOnFile, func(fd int) (err error) {
		size, err = unix.Fgetxattr(fd, attr, dest)
		return err
	}); handled {
		return uint32(max(size, 0)), errno
	}
	return n.getxattrStore(attr, dest)
}

var _ = (fs.NodeSetxattrer)((*node)(nil))

// Setxattr sets an xattr of the store file.
func (n *node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	if reservedXattr(attr) {
		return syscall.EPERM
	}
	if handled, errno := n.onStoreFile(n.fsys.store.ChangeOnFile, func(fd int) error { return unix.Fsetxattr(fd, attr, data, int(flags)) }); handled {
		return errno
	}
	return n.setxattrStore(attr, data, flags)
}

var _ = (fs.NodeRemovexattrer)((*node)(nil))

// Removexattr removes an xattr of the store file.
func (n *node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	if reservedXattr(attr) {
		return syscall.EPERM
	}
	if handled, errno := n.onStoreFile(n.fsys.store.ChangeOnFile, func(fd int) error { return unix.Fremovexattr(fd, attr) }); handled {
		return errno
	}
	return n.removexattrStore(attr)
}

// trustedXattr reports whether an xattr name is in the trusted namespace,
// which the store's filesystem lists only to CAP_SYS_ADMIN (the replication
// note lives there, "Multi-node"). The daemon lists as root and the kernel
// passes a FUSE server's list on unfiltered, so the mount lists such names to
// root callers alone.
func trustedXattr(name string) bool {
	return strings.HasPrefix(name, "trusted.")
}

var _ = (fs.NodeListxattrer)((*node)(nil))

// Listxattr lists the store file's xattrs without the store's own, and
// without the trusted ones for callers other than root.
func (n *node) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	caller, ok := fuse.FromContext(ctx)
	root := ok && caller.Uid == 0
	var names []byte
	handled, errno := n.onStoreFile(n.fsys.store.ReadOnFile, func(fd int) error {
		k, err := unix.Flistxattr(fd, nil)
		if err != nil {
			return err
		}
		buf := make([]byte, k)
		if k, err = unix.Flistxattr(fd, buf); err != nil {
			return err
		}
		names = buf[:k]
		return nil
	})
	if !handled {
		names, errno = n.listxattrStore()
	}
	if errno != 0 {
		return 0, errno
	}
	var out []byte
	for _, name := range bytes.Split(names, []byte{0}) {
		if len(name) > 0 && !reservedXattr(string(name)) && (root || !trustedXattr(string(name))) {
			out = append(append(out, name...), 0)
		}
	}
	if len(dest) == 0 {
		return uint32(len(out)), 0
	}
	if len(out) > len(dest) {
		return uint32(len(out)), syscall.ERANGE
	}
	return uint32(copy(dest, out)), 0
}
