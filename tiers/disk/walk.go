package disk

import (
	"fmt"
	"io"
	"os"
	"path"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/tiers/internal/beneath"
)

// The indexing walk at Open goes through directory descriptors, never by
// path: the engine's uid owns the store tree and may swap a directory for a
// link while it is walked. Each directory is opened from its parent's
// descriptor (beneath.Open: O_NOFOLLOW|O_DIRECTORY, no link followed), its
// names read from that descriptor (getdents, a few KiB buffered at a time)
// and each name's type read with fstatat beside it. A name the walk cannot
// read — a directory swapped for a link, one that vanished, one whose
// store-relative name reaches PATH_MAX — is passed to skip and costs that
// name (a subtree), not the store. The PATH_MAX bound is the store's own:
// every later action names a file by its store-relative path, so a longer
// name could not be acted on; it also bounds the depth, and with it the
// descriptors the walk holds, to PATH_MAX/2 (one byte and a slash a level).

// beforeDescend, when set (by tests), runs between reading a directory's
// name and opening it: the window in which the name can be swapped.
var beforeDescend func(rel string)

// walkStore calls visit with the store-relative name and attributes of every
// name beneath the directory open at rootDir that is not a directory, and
// skip with every name it cannot read. It closes rootDir. An error from
// visit, or one reading the root itself, ends the walk.
func walkStore(rootDir int, visit func(rel string, st *unix.Stat_t) error, skip func(rel string, err error)) error {
	return walkDir(rootDir, "", visit, skip)
}

// walkDir walks the directory open at fd, named rel ("" for the root), and
// closes fd.
func walkDir(fd int, rel string, visit func(rel string, st *unix.Stat_t) error, skip func(rel string, err error)) error {
	dir := os.NewFile(uintptr(fd), rel)
	defer dir.Close()
	for {
		names, err := dir.Readdirnames(1)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			if rel == "" {
				return fmt.Errorf("reading the store root: %w", err)
			}
			skip(rel, err)
			return nil
		}
		child := path.Join(rel, names[0])
		if len(child) >= unix.PathMax {
			skip(child, unix.ENAMETOOLONG)
			continue
		}
		var st unix.Stat_t
		if err := unix.Fstatat(fd, names[0], &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			skip(child, err)
			continue
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			if err := visit(child, &st); err != nil {
				return err
			}
			continue
		}
		if beforeDescend != nil {
			beforeDescend(child)
		}
		sub, err := beneath.Open(fd, names[0], unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			skip(child, err)
			continue
		}
		if err := walkDir(sub, child, visit, skip); err != nil {
			return err
		}
	}
}
