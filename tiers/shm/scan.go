package shm

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/kvtierfs/kvtierfs/tiers/internal/beneath"
	"golang.org/x/sys/unix"
)

// Any local user can make a directory or a file under the glob a mount
// point: with user_allow_other in /etc/fuse.conf, of a FUSE server that
// never answers. A stat, open or read that crossed into it would wait in
// the kernel for good, not even SIGKILL ending it (DESIGN "Regions in
// /dev/shm"). So a scan takes each name's type from the directory's own
// listing (d_type), and the attributes of a regular file from what the
// kernel holds (statx with AT_STATX_DONT_SYNC, which asks no filesystem); a
// name whose attributes are another filesystem's is a mount point, never
// looked into; a region is opened through beneath.Open, which crosses no
// mount point.

// Reasons a name under the glob is not examined further.
const (
	reasonLink       = "symbolic link: not followed"
	reasonNotRegular = "not a regular file"
	reasonMountPoint = "a mount point (something is mounted on it): not looked into"
)

// Entry is a name the glob matches, as Scan saw it.
type Entry struct {
	Path string
	// Reason says why the name is not a regular file of the glob
	// directory's own filesystem: a link, another type, a mount point. It
	// is "" when it is one, and ID, Size and UID are the file's.
	Reason string
	ID     FileID
	Size   int64
	UID    uint32
}

// Scan lists the names in the glob's directory that match the glob's last
// component, sorted by path; names that vanish during the scan are left
// out. Nothing mounted on a name is ever asked anything. Wildcards are
// allowed in the last component only.
func Scan(glob string) ([]Entry, error) {
	dir, pattern, err := splitGlob(glob)
	if err != nil {
		return nil, err
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(fd)
	dev, err := beneath.Device(fd)
	if err != nil {
		return nil, &os.PathError{Op: "statx", Path: dir, Err: err}
	}
	names, err := readDir(fd)
	if err != nil {
		return nil, &os.PathError{Op: "getdents", Path: dir, Err: err}
	}
	var entries []Entry
	for _, n := range names {
		if ok, _ := filepath.Match(pattern, n.name); !ok {
			continue
		}
		e, err := examineAt(fd, dev, n.name, n.typ)
		if err != nil {
			continue // gone since the listing
		}
		e.Path = filepath.Join(dir, n.name)
		entries = append(entries, e)
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Path < entries[j].Path })
	return entries, nil
}

// splitGlob splits a glob into its directory, which may hold no wildcard,
// and the pattern of its last component.
func splitGlob(glob string) (dir, pattern string, err error) {
	dir, pattern = filepath.Split(glob)
	if dir == "" {
		dir = "."
	}
	dir = filepath.Clean(dir)
	switch {
	case strings.ContainsAny(dir, `*?[\`):
		return "", "", fmt.Errorf("shm region glob %q: wildcards are allowed in the last component only", glob)
	case pattern == "":
		return "", "", fmt.Errorf("shm region glob %q names a directory, not files", glob)
	}
	if _, err := filepath.Match(pattern, ""); err != nil {
		return "", "", fmt.Errorf("shm region glob %q: %w", glob, err)
	}
	return dir, pattern, nil
}

// EntryAt is what Scan lists for name in the open directory dir, Path left
// empty, asking nothing mounted on it; an error when there is no such name.
func EntryAt(dir int, name string) (Entry, error) {
	dev, err := beneath.Device(dir)
	if err != nil {
		return Entry{}, err
	}
	return examineAt(dir, dev, name, unix.DT_UNKNOWN)
}

// examineAt looks at a name of the directory dir (on device dev) listed with
// type typ; an error when it is gone.
func examineAt(dir int, dev uint64, name string, typ uint8) (Entry, error) {
	switch typ {
	case unix.DT_REG, unix.DT_UNKNOWN: // DT_UNKNOWN: a filesystem that does not tell
	case unix.DT_LNK:
		return Entry{Reason: reasonLink}, nil
	default:
		return Entry{Reason: reasonNotRegular}, nil
	}
	stx, err := statNoWait(dir, name)
	if err != nil {
		return Entry{}, err
	}
	if unix.Mkdev(stx.Dev_major, stx.Dev_minor) != dev || beneath.IsMountRoot(&stx) {
		return Entry{Reason: reasonMountPoint}, nil
	}
	if reason := typeRefusal(uint32(stx.Mode)); reason != "" {
		return Entry{Reason: reason}, nil
	}
	return Entry{ID: FileID{Dev: dev, Ino: stx.Ino}, Size: int64(stx.Size), UID: stx.Uid}, nil
}

// statNoWait reads a name's attributes, without following a link, from what
// the kernel holds: no filesystem is asked, so a FUSE server mounted on the
// name is never waited on (it answers its root's attributes as cached).
func statNoWait(dir int, name string) (unix.Statx_t, error) {
	var stx unix.Statx_t
	err := unix.Statx(dir, name, unix.AT_SYMLINK_NOFOLLOW|unix.AT_STATX_DONT_SYNC,
		unix.STATX_TYPE|unix.STATX_MODE|unix.STATX_UID|unix.STATX_INO|unix.STATX_SIZE, &stx)
	return stx, err
}

// dirent is a name as the directory lists it, with its d_type.
type dirent struct {
	name string
	typ  uint8
}

// readDir lists a directory's names and types, "." and ".." left out,
// without looking at any of them.
func readDir(fd int) ([]dirent, error) {
	var out []dirent
	buf := make([]byte, 32<<10)
	for {
		n, err := unix.Getdents(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			return out, nil
		}
		if out, err = parseDirents(buf[:n], out); err != nil {
			return nil, err
		}
	}
}

// The fixed part of a struct linux_dirent64: d_ino (8 bytes), d_off (8),
// d_reclen (2), d_type (1); the NUL-terminated name follows.
const (
	direntReclenAt = 16
	direntTypeAt   = 18
	direntNameAt   = 19
)

// parseDirents appends the entries of one getdents64 reply to out; a record
// that does not fit the reply is EIO.
func parseDirents(buf []byte, out []dirent) ([]dirent, error) {
	for len(buf) > 0 {
		if len(buf) < direntNameAt {
			return out, unix.EIO
		}
		reclen := int(binary.NativeEndian.Uint16(buf[direntReclenAt:]))
		if reclen < direntNameAt || reclen > len(buf) {
			return out, unix.EIO
		}
		name := buf[direntNameAt:reclen]
		if i := bytes.IndexByte(name, 0); i >= 0 {
			name = name[:i]
		}
		if s := string(name); s != "." && s != ".." && s != "" {
			out = append(out, dirent{name: s, typ: buf[direntTypeAt]})
		}
		buf = buf[reclen:]
	}
	return out, nil
}
