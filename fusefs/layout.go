package fusefs

import (
	"os"
	"path"
	"strings"
	"sync"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// storeEntry is what a lookup answers for a name: its attributes and the
// identity go-fuse's loopback gives the file (loopbackID).
type storeEntry struct {
	attr fuse.Attr
	id   fs.StableAttr
}

// lookupIndex answers lookups of the layout's names from memory, without
// touching the store: every name that exists at the two directory levels
// (complete: they change only through the mount, whose operations refresh
// it), and the attributes of published blocks (partial: a block missing here
// is looked up in the store). The block index (disk.Store) still decides
// whether a block is present. Attributes are those of the name's last
// refresh (a directory's times and link count age until the next one).
type lookupIndex struct {
	store    storeTree
	loopRoot *fs.LoopbackRoot
	// rootMount is the mount id of the store's root (0: the kernel has
	// none), which every name the index stats must be on (notMountPoint).
	rootMount uint64

	mu sync.RWMutex
	// layout holds every name at the two directory levels.
	layout map[string]storeEntry
	// uncertain holds layout names whose last refresh failed for another
	// reason than absence: they are looked up in the store.
	uncertain map[string]bool
	// blocks holds attributes of published blocks.
	blocks map[string]storeEntry
	// tiers counts the prefix-level names of each tier directory: every
	// directory at the store's root, holding such names or not.
	tiers map[string]int
}

// storeTree resolves store-relative names beneath the store's root without
// following a link (disk.Store).
type storeTree interface {
	OpenAt(rel string, flags int, mode uint32) (int, error)
	OpenParent(rel string) (dirfd int, name string, err error)
}

func newLookupIndex(store storeTree, loopRoot *fs.LoopbackRoot) *lookupIndex {
	return &lookupIndex{store: store, loopRoot: loopRoot, rootMount: mountID(store), layout: map[string]storeEntry{},
		uncertain: map[string]bool{}, blocks: map[string]storeEntry{}, tiers: map[string]int{}}
}

// mountID returns the mount id of the store's root, 0 where the kernel
// (before 5.8) or the root cannot tell.
func mountID(store storeTree) uint64 {
	fd, err := store.OpenAt(".", unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return 0
	}
	defer unix.Close(fd)
	var stx unix.Statx_t
	if unix.Statx(fd, "", unix.AT_EMPTY_PATH|unix.AT_STATX_DONT_SYNC, unix.STATX_MNT_ID, &stx) != nil || stx.Mask&unix.STATX_MNT_ID == 0 {
		return 0
	}
	return stx.Mnt_id
}

// layoutAnswer is what the index knows of a layout name: whether it exists
// and its entry; known is false when only the store can tell. A name is
// known absent only below a directory the index holds: a lookup below a
// directory being renamed, still under its old name, asks the store.
func (x *lookupIndex) layoutAnswer(rel string) (e storeEntry, exists, known bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if x.uncertain[rel] {
		return storeEntry{}, false, false
	}
	if e, exists = x.layout[rel]; exists {
		return e, true, true
	}
	parent := path.Dir(rel)
	if block.ParseDir(rel).Level == block.PrefixDir {
		_, known = x.tiers[parent]
	} else {
		p, ok := x.layout[parent]
		known = ok && p.attr.Mode&syscall.S_IFMT == syscall.S_IFDIR
	}
	return storeEntry{}, false, known
}

// block returns the attributes of a published block, if known.
func (x *lookupIndex) block(rel string) (storeEntry, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	e, ok := x.blocks[rel]
	return e, ok
}

// statEntry reads a store name's entry without following a link in any
// component (the last one included).
func (x *lookupIndex) statEntry(rel string) (storeEntry, error) {
	dirfd, name, err := x.store.OpenParent(rel)
	if err != nil {
		return storeEntry{}, err
	}
	defer unix.Close(dirfd)
	return x.entryAt(dirfd, name)
}

// entryAt reads the entry of name in the directory dirfd without following
// a link; name "" is dirfd's own file.
func (x *lookupIndex) entryAt(dirfd int, name string) (storeEntry, error) {
	flags := unix.AT_SYMLINK_NOFOLLOW
	if name == "" {
		flags |= unix.AT_EMPTY_PATH
	}
	if name != "" {
		if err := x.notMountPoint(dirfd, name); err != nil {
			return storeEntry{}, err
		}
	}
	var stx unix.Statx_t
	if err := unix.Statx(dirfd, name, flags, unix.STATX_BASIC_STATS|unix.STATX_BTIME, &stx); err != nil {
		return storeEntry{}, err
	}
	st := statFromStatx(&stx)
	e := storeEntry{id: loopbackID(x.loopRoot, &st, &stx)}
	e.attr.FromStat(&st)
	return e, nil
}

// refresh reads a layout name's entry from the store again after the mount
// changed it.
func (x *lookupIndex) refresh(rel string) {
	e, err := x.statEntry(rel)
	x.mu.Lock()
	defer x.mu.Unlock()
	switch err {
	case nil:
		delete(x.uncertain, rel)
		x.putLayoutLocked(rel, e)
	case unix.ENOENT, unix.ENOTDIR:
		delete(x.uncertain, rel)
		x.deleteLayoutLocked(rel)
	default:
		x.uncertain[rel] = true
		x.deleteLayoutLocked(rel)
	}
}

func (x *lookupIndex) putLayoutLocked(rel string, e storeEntry) {
	if dir := block.ParseDir(rel); dir.Level == block.PrefixDir {
		if _, had := x.layout[rel]; !had {
			x.tiers[dir.Tier]++
		}
	}
	x.layout[rel] = e
}

func (x *lookupIndex) deleteLayoutLocked(rel string) {
	if _, had := x.layout[rel]; !had {
		return
	}
	delete(x.layout, rel)
	if dir := block.ParseDir(rel); dir.Level == block.PrefixDir && x.tiers[dir.Tier] > 0 {
		x.tiers[dir.Tier]--
	}
}

// forgetBlock drops a block's attributes (removed or replaced).
func (x *lookupIndex) forgetBlock(rel string) {
	x.mu.Lock()
	delete(x.blocks, rel)
	x.mu.Unlock()
}

// refreshBlock records a block's attributes after its publication.
func (x *lookupIndex) refreshBlock(rel string) {
	e, err := x.statEntry(rel)
	x.mu.Lock()
	defer x.mu.Unlock()
	if err != nil {
		delete(x.blocks, rel)
		return
	}
	x.blocks[rel] = e
}

// changed updates the index after the mount created or removed the name
// rel: nothing below it can be indexed, as a new name is empty and a
// directory removed was.
func (x *lookupIndex) changed(rel string) {
	if block.ParseDir(rel).Level != block.NotLayoutDir {
		x.refresh(rel)
		return
	}
	if strings.Contains(rel, "/") {
		return
	}
	e, err := x.statEntry(rel)
	isDir := err == nil && e.attr.Mode&unix.S_IFMT == unix.S_IFDIR
	x.mu.Lock()
	defer x.mu.Unlock()
	if _, known := x.tiers[rel]; isDir && !known {
		x.tiers[rel] = 0
	} else if !isDir {
		delete(x.tiers, rel)
	}
}

// moved updates the index after the name rel (a file or a whole directory
// tree) appeared or disappeared through the mount: every indexed name at or
// below rel is forgotten, then what the store now holds there is read again.
func (x *lookupIndex) moved(rel string) {
	below := rel + "/"
	x.mu.Lock()
	delete(x.tiers, rel)
	for name := range x.layout {
		if name == rel || strings.HasPrefix(name, below) {
			x.deleteLayoutLocked(name)
		}
	}
	for name := range x.uncertain {
		if name == rel || strings.HasPrefix(name, below) {
			delete(x.uncertain, name)
		}
	}
	for name := range x.blocks {
		if strings.HasPrefix(name, below) {
			delete(x.blocks, name)
		}
	}
	x.mu.Unlock()
	x.scan(rel)
}

// scan indexes what the store holds at rel and below it, down to the
// blocks of group directories: rel is the store root, a tier directory or a
// layout name; anything else holds no layout name. A tier directory it
// cannot read is left out: names below it are looked up in the store.
func (x *lookupIndex) scan(rel string) {
	depth := 0
	if rel != "" {
		depth = strings.Count(rel, "/") + 1
	}
	level := block.ParseDir(rel).Level
	if level != block.NotLayoutDir {
		x.refresh(rel)
	} else if depth > 1 {
		return
	}
	entries, err := x.readDir(rel)
	if err != nil {
		return
	}
	if depth == 1 {
		x.mu.Lock()
		if _, ok := x.tiers[rel]; !ok {
			x.tiers[rel] = 0
		}
		x.mu.Unlock()
	}
	for _, de := range entries {
		child := path.Join(rel, de.Name())
		switch {
		case depth == 0 && de.IsDir(), block.ParseDir(child).Level != block.NotLayoutDir:
			x.scan(child)
		case level == block.GroupDir && de.Type().IsRegular():
			if kind, _ := block.Parse(child); kind == block.File {
				x.refreshBlock(child)
			}
		}
	}
}

// readDir lists a store directory, never through a symbolic link.
func (x *lookupIndex) readDir(rel string) ([]os.DirEntry, error) {
	fd, err := x.store.OpenAt(rel, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	dir := os.NewFile(uintptr(fd), rel)
	defer dir.Close()
	return dir.ReadDir(-1)
}

// loopbackID is the identity go-fuse's loopback gives a file: its inode
// number mixed with its device's, and its birth time as generation
// (fs.LoopbackRoot's idFromStat), so that an entry answered from the index
// and one the loopback looks up are the same inode.
func loopbackID(root *fs.LoopbackRoot, st *syscall.Stat_t, stx *unix.Statx_t) fs.StableAttr {
	swapped := uint64(st.Dev)<<32 | uint64(st.Dev)>>32
	swappedRoot := root.Dev<<32 | root.Dev>>32
	gen := uint64(1)
	if stx.Mask&unix.STATX_BTIME != 0 && (stx.Btime.Sec != 0 || stx.Btime.Nsec != 0) {
		gen = uint64(stx.Btime.Sec)*1e9 + uint64(stx.Btime.Nsec)
	}
	return fs.StableAttr{Mode: st.Mode, Gen: gen, Ino: swapped ^ swappedRoot ^ st.Ino}
}

// statFromStatx converts statx's answer to stat's. Nlink and Blksize differ
// in width between architectures (uint64/int64 on amd64, uint32/int32 on
// arm64), so they are set through convertTo.
func statFromStatx(x *unix.Statx_t) syscall.Stat_t {
	st := syscall.Stat_t{
		Dev:    unix.Mkdev(x.Dev_major, x.Dev_minor),
		Ino:    x.Ino,
		Mode:   uint32(x.Mode),
		Uid:    x.Uid,
		Gid:    x.Gid,
		Rdev:   unix.Mkdev(x.Rdev_major, x.Rdev_minor),
		Size:   int64(x.Size),
		Blocks: int64(x.Blocks),
		Atim:   syscall.Timespec{Sec: x.Atime.Sec, Nsec: int64(x.Atime.Nsec)},
		Mtim:   syscall.Timespec{Sec: x.Mtime.Sec, Nsec: int64(x.Mtime.Nsec)},
		Ctim:   syscall.Timespec{Sec: x.Ctime.Sec, Nsec: int64(x.Ctime.Nsec)},
	}
	convertTo(&st.Nlink, x.Nlink)
	convertTo(&st.Blksize, x.Blksize)
	return st
}

// convertTo stores v in *dst, whatever integer width dst has on this architecture.
func convertTo[D, S int | uint32 | uint64 | int32 | int64](dst *D, v S) { *dst = D(v) }

// isTier reports whether name is a directory at the store's root.
func (x *lookupIndex) isTier(name string) bool {
	x.mu.RLock()
	defer x.mu.RUnlock()
	_, ok := x.tiers[name]
	return ok
}

// groupDirs lists up to limit group-level directories of a tier.
func (x *lookupIndex) groupDirs(tier string, limit int) []string {
	prefix := tier + "/"
	x.mu.RLock()
	defer x.mu.RUnlock()
	var names []string
	for rel := range x.layout {
		if len(names) == limit {
			break
		}
		if strings.HasPrefix(rel, prefix) && block.ParseDir(rel).Level == block.GroupDir {
			names = append(names, rel)
		}
	}
	return names
}

// notMountPoint refuses (EXDEV) a name in the directory dirfd that is on
// another mount than the store's root, such as a mount point: the store's
// tree is one mount (dirfd was resolved beneath the root without crossing
// one), and a FUSE server the engine's uid mounted there and stopped would
// hold the daemon's stat of its root. The look takes the kernel's cached
// attributes (AT_STATX_DONT_SYNC), asking no filesystem; a kernel without
// mount ids (before 5.8) is not checked here, the store's resolution still
// refuses to walk through one (tiers/internal/beneath).
func (x *lookupIndex) notMountPoint(dirfd int, name string) error {
	if x.rootMount == 0 {
		return nil
	}
	var child unix.Statx_t
	if err := unix.Statx(dirfd, name, unix.AT_SYMLINK_NOFOLLOW|unix.AT_STATX_DONT_SYNC, unix.STATX_MNT_ID, &child); err != nil {
		return err
	}
	if child.Mask&unix.STATX_MNT_ID != 0 && child.Mnt_id != x.rootMount {
		return unix.EXDEV
	}
	return nil
}
