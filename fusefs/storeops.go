package fusefs

import (
	"context"
	"strconv"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/internal/descriptors"
	"github.com/kvtierfs/kvtierfs/tiers/disk"
)

// The store tree belongs to the engine's uid, which can swap any of its
// directories for a link while the mount holds the directory's inode
// (DESIGN "Threat model"). So no operation of the mount on the store takes a
// path: each resolves its name beneath the store's root without following a
// link in any component (disk.Store.OpenAt, OpenParent), then acts on the
// directory descriptor with *at calls or on an O_PATH descriptor of the
// file. go-fuse's LoopbackNode, which joins paths, serves nothing but the
// inode plumbing.

// inParent runs op on rel's last component in its parent directory.
func (n *node) inParent(rel string, op func(dirfd int, name string) error) syscall.Errno {
	dirfd, name, err := n.fsys.store.OpenParent(rel)
	if err != nil {
		return disk.Errno(err)
	}
	defer unix.Close(dirfd)
	return disk.Errno(op(dirfd, name))
}

// asError is errno as an error: nil for 0.
func asError(errno syscall.Errno) error {
	if errno == 0 {
		return nil
	}
	return errno
}

// lookupStore looks name up in the store.
func (n *node) lookupStore(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	e, err := n.fsys.index.statEntry(n.rel(name))
	if err != nil {
		return nil, disk.Errno(err)
	}
	return n.indexedChild(ctx, e, out), 0
}

// createdChild gives the file or link just made at name in dirfd to the
// engine's uid and returns its inode. It acts on an O_PATH descriptor of
// what is there now, and only if that is what the daemon made (its type,
// owned by the daemon, one link): a name swapped in the meantime is left
// alone. A name it cannot give is removed.
func (n *node) createdChild(ctx context.Context, dirfd int, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, error) {
	e, err := n.giveToEngine(dirfd, name, mode)
	if err != nil {
		unix.Unlinkat(dirfd, name, 0)
		return nil, err
	}
	return n.indexedChild(ctx, e, out), nil
}

// giveToEngine is createdChild's check and chown.
func (n *node) giveToEngine(dirfd int, name string, mode uint32) (storeEntry, error) {
	fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return storeEntry{}, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return storeEntry{}, err
	}
	if st.Mode&unix.S_IFMT != mode&unix.S_IFMT || int(st.Uid) != unix.Geteuid() || st.Nlink != 1 {
		n.fsys.logger.Warn("a name the mount just created was replaced in the store", "path", n.rel(name))
		return storeEntry{}, syscall.EIO
	}
	owner := n.fsys.store.Owner()
	if err := unix.Fchownat(fd, "", owner.UID, owner.GID, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return storeEntry{}, err
	}
	return n.fsys.index.entryAt(fd, "")
}

// mknodStore makes a special file, owned by the engine's uid.
func (n *node) mknodStore(ctx context.Context, name string, mode, rdev uint32, out *fuse.EntryOut) (child *fs.Inode, errno syscall.Errno) {
	errno = n.inParent(n.rel(name), func(dirfd int, base string) (err error) {
		if err = unix.Mknodat(dirfd, base, mode, int(rdev)); err == nil {
			child, err = n.createdChild(ctx, dirfd, base, mode, out)
		}
		return err
	})
	return child, errno
}

// symlinkStore makes a symbolic link, owned by the engine's uid.
func (n *node) symlinkStore(ctx context.Context, target, name string, out *fuse.EntryOut) (child *fs.Inode, errno syscall.Errno) {
	errno = n.inParent(n.rel(name), func(dirfd int, base string) (err error) {
		if err = unix.Symlinkat(target, dirfd, base); err == nil {
			child, err = n.createdChild(ctx, dirfd, base, unix.S_IFLNK, out)
		}
		return err
	})
	return child, errno
}

// linkStore makes name a hard link to the store file of target. The store
// may hold another file under target's name than the one the kernel knows
// (the engine's uid replaced it): the link is then removed again and the
// call fails with ESTALE, so that a link the kernel would refuse is never
// left behind.
func (n *node) linkStore(ctx context.Context, target *node, name string, out *fuse.EntryOut) (child *fs.Inode, errno syscall.Errno) {
	if _, parent := target.EmbeddedInode().Parent(); parent == nil {
		return nil, syscall.EXDEV // no name to link from
	}
	errno = target.inParent(target.self(), func(srcDir int, srcName string) error {
		return asError(n.inParent(n.rel(name), func(dirfd int, base string) error {
			if err := unix.Linkat(srcDir, srcName, dirfd, base, 0); err != nil {
				return err
			}
			e, err := n.fsys.index.entryAt(dirfd, base)
			if err == nil && e.id.Ino != target.StableAttr().Ino {
				n.fsys.logger.Warn("refused a hard link through a name the store holds another file under", "path", target.self(), "link", n.rel(name))
				err = syscall.ESTALE
			}
			if err != nil {
				unix.Unlinkat(dirfd, base, 0)
				return err
			}
			child = n.indexedChild(ctx, e, out)
			return nil
		}))
	})
	return child, errno
}

// removeStore removes name (a directory with unix.AT_REMOVEDIR).
func (n *node) removeStore(name string, flags int) syscall.Errno {
	return n.inParent(n.rel(name), func(dirfd int, base string) error {
		return unix.Unlinkat(dirfd, base, flags)
	})
}

// renameStore moves name to dst's newName with renameat2's flags.
func (n *node) renameStore(name string, dst *node, newName string, flags uint32) syscall.Errno {
	return n.inParent(n.rel(name), func(srcDir int, srcName string) error {
		return asError(dst.inParent(dst.rel(newName), func(dstDir int, dstName string) error {
			return unix.Renameat2(srcDir, srcName, dstDir, dstName, uint(flags))
		}))
	})
}

// storeOpenFlags are the engine's open flags the daemon applies to a store
// file outside the block layout: not append (the kernel sends offsets), exec
// (the kernel's own), O_DIRECT (such files are served buffered) nor creation
// (Create asks for it).
func storeOpenFlags(flags uint32) int {
	return int(flags &^ (syscall.O_APPEND | fuse.FMODE_EXEC | syscall.O_DIRECT | syscall.O_CREAT | syscall.O_EXCL))
}

var _ = (fs.NodeOpendirHandler)((*node)(nil))

// OpendirHandle opens the store directory for listing, once the descriptor
// reserve admits the open (admit): the listing holds a descriptor of the
// daemon's until it is released.
func (n *node) OpendirHandle(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	held, errno := n.admit(ctx)
	if errno != 0 {
		return nil, 0, errno
	}
	ds, errno := n.Readdir(ctx)
	held.Opened()
	if errno != 0 {
		held.Release()
		return nil, 0, errno
	}
	return &heldDir{dirStream: ds.(dirStream), held: held}, 0, 0
}

// dirStream is what go-fuse's loopback listing of a store directory
// (fs.NewLoopbackDirStreamFd) does.
type dirStream interface {
	fs.DirStream
	fs.FileReaddirenter
	fs.FileSeekdirer
	fs.FileFsyncdirer
	fs.FileReleasedirer
}

// heldDir is a listing's handle, which gives its open back to the
// descriptor reserve once released.
type heldDir struct {
	dirStream
	held *descriptors.Held
}

// Releasedir closes the listing's descriptor.
func (d *heldDir) Releasedir(ctx context.Context, flags uint32) {
	d.dirStream.Releasedir(ctx, flags)
	d.held.Release()
}

var _ = (fs.NodeReaddirer)((*node)(nil))

// Readdir lists the store directory.
func (n *node) Readdir(ctx context.Context) (fs.DirStream, syscall.Errno) {
	fd, err := n.fsys.store.OpenAt(n.self(), unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, disk.Errno(err)
	}
	return fs.NewLoopbackDirStreamFd(fd)
}

var _ = (fs.NodeReadlinker)((*node)(nil))

// Readlink reads a link of the store.
func (n *node) Readlink(ctx context.Context) (target []byte, errno syscall.Errno) {
	errno = n.inParent(n.self(), func(dirfd int, name string) error {
		for size := 256; ; size *= 2 {
			buf := make([]byte, size)
			got, err := unix.Readlinkat(dirfd, name, buf)
			if err != nil {
				return err
			}
			if got < size {
				target = buf[:got]
				return nil
			}
		}
	})
	return target, errno
}

// getattrStore answers from the open file, else from the store.
func (n *node) getattrStore(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if fga, ok := f.(fs.FileGetattrer); ok && fga != nil {
		return fga.Getattr(ctx, out)
	}
	e, err := n.fsys.index.statEntry(n.self())
	if err != nil {
		return disk.Errno(err)
	}
	out.Attr = e.attr
	return 0
}

var _ = (fs.NodeStatxer)((*node)(nil))

// Statx answers from the open file, else from the store.
func (n *node) Statx(ctx context.Context, f fs.FileHandle, flags uint32, mask uint32, out *fuse.StatxOut) syscall.Errno {
	if fsx, ok := f.(fs.FileStatxer); ok && fsx != nil {
		return fsx.Statx(ctx, flags, mask, out)
	}
	return n.inParent(n.self(), func(dirfd int, name string) error {
		var stx unix.Statx_t
		if err := unix.Statx(dirfd, name, int(flags)|unix.AT_SYMLINK_NOFOLLOW, int(mask), &stx); err != nil {
			return err
		}
		out.FromStatx(&stx)
		return nil
	})
}

// storeFile is a store file held by an O_PATH descriptor for the calls
// that act on it: fd itself for the calls that take one, and proc, the
// descriptor's /proc/self/fd path, for those that take only a path (chmod,
// truncate, times, xattrs), which the kernel resolves to that very inode,
// never through the store's path again. Those would follow a link, so a
// link is refused there (noLinks); dirfd and name, where it was found, serve
// the calls with a no-follow form instead.
type storeFile struct {
	fd, dirfd  int
	name, proc string
	st         unix.Stat_t
}

// byInode runs op on this node's store file.
func (n *node) byInode(op func(f *storeFile) error) syscall.Errno {
	return n.inParent(n.self(), func(dirfd int, name string) error {
		fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		f := &storeFile{fd: fd, dirfd: dirfd, name: name, proc: "/proc/self/fd/" + strconv.Itoa(fd)}
		if err := unix.Fstat(fd, &f.st); err != nil {
			return err
		}
		return op(f)
	})
}

// isLink reports whether the file is a symbolic link.
func (f *storeFile) isLink() bool { return f.st.Mode&unix.S_IFMT == unix.S_IFLNK }

// setTimes sets the file's times: through proc, or for a link in its
// directory without following it, once the name is checked to be that link.
func (f *storeFile) setTimes(times []unix.Timespec) error {
	if !f.isLink() {
		return unix.UtimesNanoAt(unix.AT_FDCWD, f.proc, times, 0)
	}
	var now unix.Stat_t
	if err := unix.Fstatat(f.dirfd, f.name, &now, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if now.Dev != f.st.Dev || now.Ino != f.st.Ino {
		return unix.ESTALE
	}
	return unix.UtimesNanoAt(f.dirfd, f.name, times, unix.AT_SYMLINK_NOFOLLOW)
}

// truncate sets the regular file's size through a descriptor opened
// without waiting. The store file's owner, the engine's uid, may hold a
// lease on it: truncate(2) would wait out the lease-break time (45 s) in a
// daemon thread, one per file, until Go's thread limit ended the daemon;
// the open fails with EAGAIN at once instead, and ftruncate breaks no lease
// (DESIGN "Threat model").
func (f *storeFile) truncate(size int64) error {
	fd, err := unix.Open(f.proc, unix.O_WRONLY|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Ftruncate(fd, size)
}

// noLinks refuses a path call on a symbolic link, which it would follow.
func (f *storeFile) noLinks() error {
	if f.isLink() {
		return unix.ELOOP
	}
	return nil
}

// setattrStore applies a change through the open file, else to the store
// file by its O_PATH descriptor, and reports the attributes after it.
func (n *node) setattrStore(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if fsa, ok := f.(fs.FileSetattrer); ok && fsa != nil {
		if errno := fsa.Setattr(ctx, in, out); errno != 0 {
			return errno
		}
		return n.getattrStore(ctx, f, out)
	}
	return n.byInode(func(f *storeFile) error {
		if mode, ok := in.GetMode(); ok {
			if err := f.noLinks(); err != nil {
				return err
			}
			if err := unix.Chmod(f.proc, mode); err != nil {
				return err
			}
		}
		uid, uidSet := in.GetUID()
		gid, gidSet := in.GetGID()
		if uidSet || gidSet {
			newUID, newGID := -1, -1
			if uidSet {
				newUID = int(uid)
			}
			if gidSet {
				newGID = int(gid)
			}
			if err := unix.Fchownat(f.fd, "", newUID, newGID, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return err
			}
		}
		// Truncate before the times, so that an explicit mtime stays.
		if size, ok := in.GetSize(); ok {
			if f.st.Mode&unix.S_IFMT != unix.S_IFREG {
				return unix.EINVAL
			}
			if err := f.truncate(int64(size)); err != nil {
				return err
			}
		}
		if times, ok := setTimes(in); ok {
			if err := f.setTimes(times); err != nil {
				return err
			}
		}
		var after syscall.Stat_t
		if err := syscall.Fstat(f.fd, &after); err != nil {
			return err
		}
		out.FromStat(&after)
		return nil
	})
}

// setTimes is the atime and mtime a SETATTR sets, UTIME_OMIT for one it
// leaves, and whether it sets any.
func setTimes(in *fuse.SetAttrIn) ([]unix.Timespec, bool) {
	times := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, {Nsec: unix.UTIME_OMIT}}
	atime, atimeSet := in.GetATime()
	mtime, mtimeSet := in.GetMTime()
	if atimeSet {
		times[0] = unix.Timespec{Sec: atime.Unix(), Nsec: int64(atime.Nanosecond())}
	}
	if mtimeSet {
		times[1] = unix.Timespec{Sec: mtime.Unix(), Nsec: int64(mtime.Nanosecond())}
	}
	return times, atimeSet || mtimeSet
}

// getxattrStore reads an xattr of the store file.
func (n *node) getxattrStore(attr string, dest []byte) (size uint32, errno syscall.Errno) {
	errno = n.byInode(func(f *storeFile) error {
		if f.isLink() {
			return unix.ENODATA // user xattrs are never set on links
		}
		got, err := unix.Getxattr(f.proc, attr, dest)
		size = uint32(got)
		return err
	})
	return size, errno
}

// setxattrStore sets an xattr of the store file.
func (n *node) setxattrStore(attr string, data []byte, flags uint32) syscall.Errno {
	return n.byInode(func(f *storeFile) error {
		if f.isLink() {
			return unix.EPERM
		}
		return unix.Setxattr(f.proc, attr, data, int(flags))
	})
}

// removexattrStore removes an xattr of the store file.
func (n *node) removexattrStore(attr string) syscall.Errno {
	return n.byInode(func(f *storeFile) error {
		if f.isLink() {
			return unix.ENODATA
		}
		return unix.Removexattr(f.proc, attr)
	})
}

// listxattrStore lists the store file's xattr names.
func (n *node) listxattrStore() (names []byte, errno syscall.Errno) {
	errno = n.byInode(func(f *storeFile) error {
		if f.isLink() {
			return nil
		}
		size, err := unix.Listxattr(f.proc, nil)
		if err != nil {
			return err
		}
		names = make([]byte, size)
		size, err = unix.Listxattr(f.proc, names)
		names = names[:max(size, 0)]
		return err
	})
	return names, errno
}

// statfsStore reports the store filesystem's statfs.
func (n *node) statfsStore(out *fuse.StatfsOut) syscall.Errno {
	fd, err := n.fsys.store.OpenAt(".", unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return disk.Errno(err)
	}
	defer unix.Close(fd)
	var st syscall.Statfs_t
	if err := syscall.Fstatfs(fd, &st); err != nil {
		return disk.Errno(err)
	}
	out.FromStatfsT(&st)
	return 0
}
