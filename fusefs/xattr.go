package fusefs

import (
	"bytes"
	"context"
	"strings"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
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

var _ = (fs.NodeGetxattrer)((*node)(nil))

// Getxattr reads an xattr of the store file.
func (n *node) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	if reservedXattr(attr) {
		return 0, syscall.ENODATA
	}
	return n.LoopbackNode.Getxattr(ctx, attr, dest)
}

var _ = (fs.NodeSetxattrer)((*node)(nil))

// Setxattr sets an xattr of the store file.
func (n *node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	if reservedXattr(attr) {
		return syscall.EPERM
	}
	return n.LoopbackNode.Setxattr(ctx, attr, data, flags)
}

var _ = (fs.NodeRemovexattrer)((*node)(nil))

// Removexattr removes an xattr of the store file.
func (n *node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	if reservedXattr(attr) {
		return syscall.EPERM
	}
	return n.LoopbackNode.Removexattr(ctx, attr)
}

var _ = (fs.NodeListxattrer)((*node)(nil))

// Listxattr lists the store file's xattrs without the store's own.
func (n *node) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	p := n.fsys.store.Path(n.self())
	size, err := unix.Llistxattr(p, nil)
	if err != nil {
		return 0, disk.Errno(err)
	}
	buf := make([]byte, size)
	size, err = unix.Llistxattr(p, buf)
	if err != nil {
		return 0, disk.Errno(err)
	}
	var out []byte
	for _, name := range bytes.Split(buf[:size], []byte{0}) {
		if len(name) > 0 && !reservedXattr(string(name)) {
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
