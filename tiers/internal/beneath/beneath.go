// Package beneath opens a path below a directory descriptor without ever
// following a symbolic link or leaving that directory: the one way the store
// (tiers/disk) and the shared level (tiers/shared) resolve names in trees
// that others can write.
//
// # Names
//
// A name is relative to the directory and made of plain components joined by
// "/". "" and "." name the directory itself. An absolute name, or one with a
// ".." component, fails with EXDEV (what openat2's RESOLVE_BENEATH answers for
// an escape), before any system call; an empty or "." component (a doubled or
// trailing slash, "a/./b") fails with EINVAL. A symbolic link in any
// component fails: ELOOP from openat2, ELOOP or ENOTDIR from the walk (an
// O_PATH|O_NOFOLLOW open of a final link opens the link itself, as lstat
// sees it). A component that is a mount point (anything mounted inside the
// tree, a FUSE server that never answers among them) fails with EXDEV: the
// daemon never waits on a filesystem it did not choose. Errors are bare
// errnos: the caller names the path in its own.
//
// # Resolution
//
// Open asks openat2 with RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|
// RESOLVE_NO_MAGICLINKS|RESOLVE_NO_XDEV. Where openat2 answers ENOSYS (kernels before 5.6,
// seccomp sandboxes, qemu-user) the process remembers it and from then on
// walks the name one component at a time: each directory opened from the
// last with O_PATH|O_DIRECTORY|O_NOFOLLOW, the last component with the
// caller's flags and O_NOFOLLOW, each found on the directory's device and
// none the root of a mount (STATX_ATTR_MOUNT_ROOT, which also tells a bind
// mount of the tree's own filesystem), so the rule holds there too; a last
// component opened for I/O is first looked at through O_PATH, so a mount
// point is refused before its filesystem is asked to open. O_NOFOLLOW and
// O_CLOEXEC are always added; the mode is passed only where the flags create
// (O_CREAT, O_TMPFILE), as openat2 requires. EINTR (a signal: Go's runtime
// sends them) is retried without limit, EAGAIN (openat2 racing a rename
// elsewhere in the tree) up to maxRaces times, then returned.
//
// # Tests
//
// WithoutOpenat2 makes every Open walk, as on a kernel without openat2: the
// one switch the callers' tests use to run their link tests both ways.
package beneath

import (
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// resolveFlags are openat2's: nothing above the directory, no link and no
// mount point anywhere.
const resolveFlags = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// walkDirFlags open each directory the walk passes through.
const walkDirFlags = unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC

// maxRaces bounds the retries of an open that answers EAGAIN.
const maxRaces = 8

// noOpenat2 is set once openat2 answered ENOSYS (or a test forced the walk).
var noOpenat2 atomic.Bool

// Open opens name beneath the directory dir with flags (O_NOFOLLOW and
// O_CLOEXEC added) and mode, following no link in any component. The
// caller closes the descriptor.
func Open(dir int, name string, flags int, mode uint32) (int, error) {
	parts, err := Split(name)
	if err != nil {
		return -1, err
	}
	flags |= unix.O_NOFOLLOW | unix.O_CLOEXEC
	if flags&(unix.O_CREAT|unix.O_TMPFILE) == 0 {
		mode = 0
	}
	if len(parts) == 0 {
		return retry(func() (int, error) { return unix.Openat(dir, ".", flags, 0) })
	}
	if !noOpenat2.Load() {
		how := unix.OpenHow{Flags: uint64(flags), Mode: uint64(mode), Resolve: resolveFlags}
		fd, err := retry(func() (int, error) { return unix.Openat2(dir, name, &how) })
		if err != unix.ENOSYS {
			return fd, err
		}
		noOpenat2.Store(true)
	}
	return walk(dir, parts, flags, mode)
}

// Split returns the components of a name as Open accepts it (none for the
// directory itself), or the error Open would answer.
func Split(name string) ([]string, error) {
	if name == "" || name == "." {
		return nil, nil
	}
	if strings.HasPrefix(name, "/") {
		return nil, unix.EXDEV
	}
	parts := strings.Split(name, "/")
	for _, p := range parts {
		if p == ".." {
			return nil, unix.EXDEV
		}
	}
	for _, p := range parts {
		if p == "" || p == "." {
			return nil, unix.EINVAL
		}
	}
	return parts, nil
}

// walk opens parts below dir one component at a time, the directories on
// the way O_PATH and none through a link (a link there is ENOTDIR or ELOOP)
// or onto another device or a mount root (EXDEV).
func walk(dir int, parts []string, flags int, mode uint32) (int, error) {
	dev, err := Device(dir)
	if err != nil {
		return -1, err
	}
	cur := dir
	defer func() {
		if cur != dir {
			unix.Close(cur)
		}
	}()
	for _, p := range parts[:len(parts)-1] {
		next, err := sameDevice(dev, func() (int, error) { return unix.Openat(cur, p, walkDirFlags, 0) })
		if err != nil {
			return -1, err
		}
		if cur != dir {
			unix.Close(cur)
		}
		cur = next
	}
	last := parts[len(parts)-1]
	if flags&unix.O_PATH == 0 {
		// A mount point opened for I/O could already wait on its server:
		// look first, through O_PATH, which asks no filesystem to open.
		probe, err := sameDevice(dev, func() (int, error) { return unix.Openat(cur, last, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0) })
		switch {
		case err == nil:
			unix.Close(probe)
		case err != unix.ENOENT:
			return -1, err
		}
	}
	return sameDevice(dev, func() (int, error) { return unix.Openat(cur, last, flags, mode) })
}

// sameDevice opens (retried as retry does) and passes the descriptor on if
// it is on device dev and not the root of a mount, or closes it and answers
// EXDEV. The mount root catches a bind mount of the tree's own filesystem,
// whose device is the tree's.
func sameDevice(dev uint64, open func() (int, error)) (int, error) {
	fd, err := retry(open)
	if err != nil {
		return fd, err
	}
	got, mountRoot, err := place(fd)
	if err == nil && (got != dev || mountRoot) {
		err = unix.EXDEV
	}
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// Device is the device of an open file, from the attributes the kernel
// holds: AT_STATX_DONT_SYNC asks no filesystem (a FUSE server mounted in the
// tree is never waited on for its root's attributes).
func Device(fd int) (uint64, error) {
	dev, _, err := place(fd)
	return dev, err
}

// place is an open file's device and whether it is the root of a mount
// (IsMountRoot; before Linux 5.8 only the device is told apart), asking no
// filesystem, as Device.
func place(fd int) (dev uint64, mountRoot bool, err error) {
	var stx unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH|unix.AT_STATX_DONT_SYNC, 0, &stx); err != nil {
		return 0, false, err
	}
	return unix.Mkdev(stx.Dev_major, stx.Dev_minor), IsMountRoot(&stx), nil
}

// IsMountRoot reports whether statx said the file is the root of a mount
// (STATX_ATTR_MOUNT_ROOT; false from a kernel before 5.8, which does not say).
func IsMountRoot(stx *unix.Statx_t) bool {
	return stx.Attributes_mask&stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0
}

// retry repeats an open that a signal interrupted, and one that raced a
// rename at most maxRaces times.
func retry(open func() (int, error)) (int, error) {
	for races := 0; ; {
		fd, err := open()
		switch {
		case err == unix.EINTR:
		case err == unix.EAGAIN && races < maxRaces:
			races++
		default:
			return fd, err
		}
	}
}

// WithoutOpenat2 makes every Open walk, as where openat2 answers ENOSYS,
// until restore is called; for tests of the walk.
func WithoutOpenat2() (restore func()) {
	was := noOpenat2.Swap(true)
	return func() { noOpenat2.Store(was) }
}
