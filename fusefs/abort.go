package fusefs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/fusefs/mountinfo"
)

// A mount copied into another mount namespace (a container started with its
// own, `unshare -m`) keeps the FUSE connection alive after the daemon's own
// unmount, and the daemon's serve loop with it: only aborting the connection
// ends it. The kernel's fusectl filesystem offers that per connection.

// connectionsDir is where fusectl lists the FUSE connections, each named by
// its superblock's device number.
const connectionsDir = "/sys/fs/fuse/connections"

// connectionOf names the FUSE connection mounted at mountpoint: the kernel's
// dev_t of the mount (major<<20 | minor), from this namespace's mount table,
// so that the daemon never touches its own mount to learn it. A path the
// kernel named (resolved) is looked up as it is: resolving its
// components again would follow a link an ancestor's owner swapped in since,
// to another FUSE mount, whose connection the shutdown would then abort.
func connectionOf(mountpoint string, resolved bool) (string, error) {
	abs := mountpoint
	if !resolved {
		var err error
		if abs, err = filepath.Abs(mountpoint); err != nil {
			return "", err
		}
		// The mount table holds the real path; resolving the mountpoint
		// itself would ask this daemon.
		parent, err := filepath.EvalSymlinks(filepath.Dir(abs))
		if err != nil {
			return "", err
		}
		abs = filepath.Join(parent, filepath.Base(abs))
	}
	mounts, err := mountinfo.Read("self")
	if err != nil {
		return "", err
	}
	at := mountinfo.At(mounts, abs)
	if len(at) == 0 || !strings.HasPrefix(at[len(at)-1].FSType, "fuse") {
		return "", fmt.Errorf("no FUSE mount at %s in /proc/self/mountinfo", abs)
	}
	majorText, minorText, _ := strings.Cut(at[len(at)-1].Device, ":")
	major, err1 := strconv.ParseUint(majorText, 10, 32)
	minor, err2 := strconv.ParseUint(minorText, 10, 32)
	if err1 != nil || err2 != nil {
		return "", fmt.Errorf("mount %s: device %q", abs, at[len(at)-1].Device)
	}
	return strconv.FormatUint(major<<20|minor, 10), nil
}

// Abort ends the mount's FUSE connection: every request of every copy of the
// mount, in any namespace, fails from now on, and the serve loop returns, so
// Wait does. Where the system has no fusectl mounted, the daemon mounts one
// in a mount namespace of one thread's own, which ends with the thread: the
// system's mounts stay as they were.
func (f *FS) Abort() error {
	if f.connection == "" {
		return errors.New("the mount's FUSE connection is unknown")
	}
	mounted, err := fusectlMounted()
	if err != nil {
		return err
	}
	if mounted {
		return writeAbort(f.connection)
	}
	done := make(chan error, 1)
	go func() {
		// Never unlocked: the thread, and the namespace it enters, end
		// with this goroutine.
		runtime.LockOSThread()
		done <- abortInOwnNamespace(f.connection)
	}()
	return <-done
}

// fusectlMounted reports whether fusectl is mounted at connectionsDir in the
// daemon's mount namespace.
func fusectlMounted() (bool, error) {
	mounts, err := mountinfo.Read("self")
	if err != nil {
		return false, err
	}
	at := mountinfo.At(mounts, connectionsDir)
	return len(at) > 0 && at[len(at)-1].FSType == "fusectl", nil
}

// abortInOwnNamespace aborts the connection through a fusectl mounted in a
// private mount namespace of the calling thread, which is locked to it.
func abortInOwnNamespace(connection string) error {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("a mount namespace for fusectl: %w", err)
	}
	// Nothing mounted here may propagate back to the system's namespace.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making the fusectl namespace private: %w", err)
	}
	if err := unix.Mount("fusectl", connectionsDir, "fusectl", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mounting fusectl at %s: %w", connectionsDir, err)
	}
	return writeAbort(connection)
}

// writeAbort writes the abort file of a connection; one gone already is done.
func writeAbort(connection string) error {
	err := os.WriteFile(filepath.Join(connectionsDir, connection, "abort"), []byte("1"), 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // the connection ended meanwhile
	}
	if err != nil {
		return fmt.Errorf("aborting the FUSE connection: %w", err)
	}
	return nil
}

// Done is closed once the filesystem stopped serving (Wait returned).
func (f *FS) Done() <-chan struct{} { return f.done }
