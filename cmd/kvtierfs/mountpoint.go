package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/fusefs"
	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
	"github.com/kvtierfs/kvtierfs/fusefs/mountinfo"
)

// fsImmutableFlag is FS_IMMUTABLE_FL of linux/fs.h, an inode flag of
// FS_IOC_GETFLAGS/FS_IOC_SETFLAGS: nobody, root included, creates, removes
// or renames an entry of an immutable directory.
const fsImmutableFlag = 0x10

// guardedMode is the mountpoint's mode while no daemon serves it: nobody
// but root may write into it (and root neither once it is immutable).
const guardedMode = 0o555

// mountpoint is the bare directory a daemon mounts over, opened before the
// mount so that it is guarded itself, not whatever the path reaches later.
type mountpoint struct {
	dir  *os.File
	path string
}

// prepareMountpoint creates a missing mountpoint, detaches the mount of a
// crashed daemon, refuses one that is live, and refuses a non-empty one
// unless nonempty: files there were written while no daemon served it (the
// mount would hide them).
func prepareMountpoint(mnt string, nonempty bool) (*mountpoint, error) {
	if err := clearStaleMount(mnt); err != nil {
		return nil, err
	}
	dir, abs, err := openMountpoint(mnt)
	if err != nil {
		return nil, err
	}
	// The path walked, so that every later use of it means the same
	// directory (Abs cleans "..", which the kernel would take through a
	// link).
	m := &mountpoint{dir: dir, path: abs}
	names, err := m.dir.Readdirnames(4)
	if err != nil && err != io.EOF {
		m.close()
		return nil, fmt.Errorf("listing mountpoint %s: %w", mnt, err)
	}
	if len(names) > 0 && !nonempty {
		m.close()
		return nil, fmt.Errorf("mountpoint %s is not empty (%s): the engine wrote there while no daemon served it, and the mount would hide those files; "+
			"move them away, or add --nonempty to mount over them", mnt, strings.Join(names, ", "))
	}
	return m, nil
}

// openMountpoint opens the mountpoint directory, creating what is missing
// of its path one directory at a time beneath the directory opened before
// (mkdirat, then openat O_NOFOLLOW). os.MkdirAll resolved the whole path
// anew for each directory, following links, so a user owning an ancestor
// made a root daemon create directories wherever its link led. A link on
// the way is followed only when root or the daemon's user made it
// (followTrustedLink); the mountpoint itself must be a directory, no link.
// It returns the directory and the absolute path walked.
func openMountpoint(mnt string) (*os.File, string, error) {
	abs, err := filepath.Abs(mnt)
	if err != nil {
		return nil, "", err
	}
	if abs == "/" {
		return nil, "", fmt.Errorf("mountpoint %s: the root directory", mnt)
	}
	dir, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, "", err
	}
	names := strings.Split(abs[1:], "/")
	at := ""
	for i, name := range names {
		at += "/" + name
		last := i == len(names)-1
		next, err := openOrMakeDir(dir, name, last)
		if err == nil {
			unix.Close(dir)
			dir = next
			continue
		}
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			if last {
				err = fmt.Errorf("mountpoint %s is not a directory", mnt)
			} else {
				next, err = followTrustedLink(dir, name, at, mnt)
			}
		} else {
			err = fmt.Errorf("mountpoint %s: %s: %w", mnt, at, err)
		}
		unix.Close(dir)
		if err != nil {
			return nil, "", err
		}
		dir = next
	}
	return os.NewFile(uintptr(dir), abs), abs, nil
}

// openOrMakeDir opens the directory name beneath dir without following a
// link, making it first (mode 0755) when it is missing: O_PATH on the way,
// readable for the mountpoint itself (last).
func openOrMakeDir(dir int, name string, last bool) (int, error) {
	flags := unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
	if last {
		flags = unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
	}
	fd, err := unix.Openat(dir, name, flags, 0)
	if !errors.Is(err, unix.ENOENT) {
		return fd, err
	}
	if err := unix.Mkdirat(dir, name, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
		return -1, err
	}
	return unix.Openat(dir, name, flags, 0)
}

// followTrustedLink opens the directory that the link name beneath dir
// (reached as at) leads to, when root or the daemon's user made the link;
// a link of another user is refused, since its owner chooses where the
// path leads and the daemon would create, guard and mount over whatever
// directory of the mountpoint's name it finds there (a link to / makes
// .../mnt root's /mnt). The link's owner and target are read from one
// descriptor of it, so it cannot be swapped between the two; links inside
// its target are the kernel's to follow.
func followTrustedLink(dir int, name, at, mnt string) (int, error) {
	link, err := unix.Openat(dir, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("mountpoint %s: %s: %w", mnt, at, err)
	}
	defer unix.Close(link)
	var st unix.Stat_t
	if err := unix.Fstat(link, &st); err != nil {
		return -1, fmt.Errorf("mountpoint %s: %s: %w", mnt, at, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFLNK {
		return -1, fmt.Errorf("mountpoint %s: %s is not a directory", mnt, at)
	}
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(link, "", buf)
	if err != nil {
		return -1, fmt.Errorf("mountpoint %s: %s: %w", mnt, at, err)
	}
	target := string(buf[:n])
	if st.Uid != 0 && int(st.Uid) != os.Geteuid() {
		return -1, fmt.Errorf("mountpoint %s is reached through %s, a link of uid %d (to %s), which chooses where the mount lands: "+
			"give the mountpoint's own path, and keep it out of directories that others than root may write", mnt, at, st.Uid, target)
	}
	fd, err := unix.Openat(dir, target, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("mountpoint %s: %s, a link to %s: %w", mnt, at, target, err)
	}
	return fd, nil
}

// guard makes the bare mountpoint one the engine cannot write into while no
// daemon serves it; it stays so after the daemon ends. As root: owned by
// root, mode 0555 and immutable. Otherwise (fusermount3 needs the
// mountpoint writable by the user mounting) writable by its owner only
// until seal.
func (m *mountpoint) guard(logger *slog.Logger) error {
	fd := int(m.dir.Fd())
	if os.Geteuid() != 0 {
		if err := unix.Fchmod(fd, 0o700); err != nil {
			return fmt.Errorf("mountpoint %s: making it writable for fusermount3: %w (a mountpoint guarded by a root daemon needs 'chattr -i' and chown by root)", m.path, err)
		}
		return nil
	}
	// An immutable directory takes no chown or chmod, root's included: the
	// flag is lifted for them (the guard of an earlier daemon). The guard
	// is kept as far as the filesystem allows (one that squashes root, or
	// knows no inode flags, refuses part of it): what is missing is logged.
	flags, flagsErr := unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS)
	if flagsErr == nil && flags&fsImmutableFlag != 0 {
		flags &^= fsImmutableFlag
		flagsErr = unix.IoctlSetPointerInt(fd, unix.FS_IOC_SETFLAGS, int(flags))
	}
	if err := unix.Fchown(fd, 0, 0); err != nil {
		logger.Warn("the mountpoint cannot be given to root: its owner could write into it while no daemon serves it", "mountpoint", m.path, "err", err)
	}
	if err := unix.Fchmod(fd, guardedMode); err != nil {
		logger.Warn("the mountpoint cannot be made read-only: the engine could write into it while no daemon serves it", "mountpoint", m.path, "err", err)
	}
	if flagsErr == nil {
		flagsErr = unix.IoctlSetPointerInt(fd, unix.FS_IOC_SETFLAGS, int(flags|fsImmutableFlag))
	}
	if flagsErr != nil {
		logger.Warn("the mountpoint's filesystem cannot make it immutable: an engine running as root could still write into it while no daemon serves it",
			"mountpoint", m.path, "err", flagsErr)
	}
	return nil
}

// seal, after the mount, takes the owner's write permission back from a
// mountpoint of another user than root. The mountpoint stays open: a root
// daemon unmounts through it.
func (m *mountpoint) seal() error {
	if os.Geteuid() != 0 {
		if err := unix.Fchmod(int(m.dir.Fd()), guardedMode); err != nil {
			return fmt.Errorf("mountpoint %s: %w", m.path, err)
		}
	}
	return nil
}

func (m *mountpoint) close() { m.dir.Close() }

// mountpointChecked, when set (by tests), runs between the last check of
// the mountpoint's path and the mount.
var mountpointChecked func()

// mount mounts the store (opts, mount source source) over the mountpoint.
// Whoever may write into the mountpoint's parent or an ancestor (the
// engine's uid, when the operator put the mountpoint in one of its
// directories) can swap the path for a link after the daemon opened it
// (the store's indexing, minutes long, lies between them); mount(2) by
// path then landed on the link's target, and a root daemon mounted the
// engine's store over /etc. So the path must still lead to the directory
// opened and guarded (stillHere); a root daemon then mounts onto that
// directory itself (fusefs.Options.MountpointDir), never resolving the
// path again, and the mount must be where the path led at that check
// (landed): a directory moved meanwhile has the mount detached.
func (m *mountpoint) mount(opts fusefs.Options, source string) (*fusefs.FS, error) {
	checkedAt, err := m.stillHere()
	if err != nil {
		return nil, err
	}
	if mountpointChecked != nil {
		mountpointChecked()
	}
	before, err := mountinfo.Read("self")
	if err != nil {
		return nil, err
	}
	opts.MountpointDir = m.dir
	fsys, err := fusefs.Mount(m.path, opts)
	if err != nil {
		return nil, explainMountError(err, opts.AllowOther)
	}
	if err := m.landed(fsys, before, source, checkedAt); err != nil {
		return nil, err
	}
	return fsys, nil
}

// stillHere checks that the mountpoint's path still leads to the directory
// opened and guarded, and returns where that directory is.
func (m *mountpoint) stillHere() (string, error) {
	fd, err := unix.Open(m.path, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("mountpoint %s was replaced while the daemon started (%w): not mounted", m.path, err)
	}
	defer unix.Close(fd)
	var now, opened unix.Stat_t
	if err := unix.Fstat(fd, &now); err != nil {
		return "", err
	}
	if err := unix.Fstat(int(m.dir.Fd()), &opened); err != nil {
		return "", err
	}
	if now.Dev != opened.Dev || now.Ino != opened.Ino {
		return "", fmt.Errorf("mountpoint %s was replaced while the daemon started (it leads to another directory now): not mounted; "+
			"keep the mountpoint out of directories that others than root may write", m.path)
	}
	return os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
}

// landed checks, after the mount, that the mounts of source made since
// before are one, at checkedAt; else the mount is detached and landed
// fails. A root daemon's mount covers the opened directory wherever it is
// (moved after stillHere, it is elsewhere); another user's mount is made by
// path (fusermount3) and lands wherever the path leads.
func (m *mountpoint) landed(fsys *fusefs.FS, before []mountinfo.Mount, source, checkedAt string) error {
	mounts, err := mountinfo.Read("self")
	if err != nil {
		fsys.Detach()
		return err
	}
	var elsewhere []string
	here := false
	for _, mount := range mounts {
		switch {
		case mount.FSType != ctlabi.FSType || mount.Source != source || slices.Contains(before, mount):
		case mount.Mountpoint == checkedAt:
			here = true
		default:
			elsewhere = append(elsewhere, mount.Mountpoint)
		}
	}
	if here && len(elsewhere) == 0 {
		return nil
	}
	fsys.Detach()
	return fmt.Errorf("mountpoint %s was replaced while the daemon started: the mount landed at %q, not at %s, and was detached; "+
		"keep the mountpoint out of directories that others than root may write", m.path, elsewhere, checkedAt)
}

// explainMountError adds to a failed FUSE mount the cause a user other than
// root usually meets, which go-fuse reports only as fusermount's exit code:
// no fusermount3, a /dev/fuse the user cannot open, or --allow-other
// without user_allow_other in /etc/fuse.conf.
func explainMountError(err error, allowOther bool) error {
	if os.Geteuid() == 0 {
		return err
	}
	// go-fuse's message of a failed fusermount ends with a newline.
	failed := strings.TrimSpace(err.Error())
	if _, lookErr := exec.LookPath("fusermount3"); lookErr != nil {
		return fmt.Errorf("%s: fusermount3 is missing, which mounts for users other than root (make deps, or install fuse3)", failed)
	}
	if accessErr := unix.Access("/dev/fuse", unix.R_OK|unix.W_OK); accessErr != nil {
		return fmt.Errorf("%s: /dev/fuse: %v: uid %d cannot open it for reading and writing (give it mode 0666, as distributions ship it, or mount as root)",
			failed, accessErr, os.Getuid())
	}
	if allowOther {
		return fmt.Errorf("%s: --allow-other as a user other than root needs user_allow_other in /etc/fuse.conf", failed)
	}
	return err
}
