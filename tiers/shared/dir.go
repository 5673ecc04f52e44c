package shared

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/tiers/block"
	"github.com/kvtierfs/kvtierfs/tiers/internal/beneath"
)

// Dir is the shared directory as the level uses it, by paths relative to its
// root. Any call may block for as long as the distributed filesystem's client
// does; the level runs every call under its bound (bound.go). Whoever can
// write the directory is not trusted (DESIGN.md "Threat model"): no call
// follows a link below the root, opens anything but a regular file for its
// bytes, or reads more than the caller's bound.
type Dir interface {
	Stat(rel string) (FileInfo, error)
	// ReadFile reads a regular file of at most limit bytes whole (errTooLarge beyond).
	ReadFile(rel string, limit int64) ([]byte, error)
	// ReadBlock reads a regular file of exactly size bytes (errWrongSize
	// otherwise) in chunks of at most fetchChunk bytes, handing each to
	// chunk as it arrives (a fetch's progress and running digests); each
	// byte is handed once.
	ReadBlock(rel string, size int64, chunk func([]byte)) ([]byte, error)
	// WriteFile creates rel (which must not exist) holding data; all-zero
	// pages are left as holes.
	WriteFile(rel string, data []byte) error
	Rename(from, to string) error
	Link(from, to string) error
	Remove(rel string) error
	MkdirAll(rel string) error
	// ReadDir lists a directory: the entries keep accepts (all if nil), at
	// most limit of them (errTooLarge beyond).
	ReadDir(rel string, limit int, keep func(name string) bool) ([]fs.DirEntry, error)
	Touch(rel string, t time.Time) error
	// Append and ReadFrom write and tail the names journal (journal.go).
	Append(rel string, data []byte) error
	// ReadFrom refuses a file larger than fileLimit (errTooLarge).
	ReadFrom(rel string, off, limit, fileLimit int64) ([]byte, FileInfo, error)
	Xattrs
}

// Xattrs are the extended attribute calls on regular files; a filesystem
// that keeps none answers ENOTSUP and the level falls back to sidecar files.
type Xattrs interface {
	// GetXattr reads a value of at most maxXattr bytes.
	GetXattr(rel, name string) ([]byte, error)
	SetXattr(rel, name string, value []byte) error
}

// maxXattr bounds an xattr value the level reads: a sealed record.
const maxXattr = maxSealedRecord

// errTooLarge is a file, a directory or a value larger than it can legitimately be.
var errTooLarge = errors.New("larger than it can be")

// errWrongSize is a block file whose size is not its record's.
var errWrongSize = errors.New("block file of another size than its record")

// errNotRegular is a name that is not a regular file where one is read or written.
var errNotRegular = errors.New("not a regular file")

// FileInfo is what the level needs of a file: enough to tell the same file
// apart from one that replaced it.
type FileInfo struct {
	Size, Allocated int64
	ModTime         time.Time
	Dev, Ino        uint64
	Ctime           int64
	IsDir, IsFile   bool
}

// sameFile reports whether two stats of a name saw the same unchanged file.
func (a FileInfo) sameFile(b FileInfo) bool {
	return a.Dev == b.Dev && a.Ino == b.Ino && a.Size == b.Size && a.ModTime.Equal(b.ModTime) && a.Ctime == b.Ctime
}

func fileInfo(st *unix.Stat_t) FileInfo {
	return FileInfo{Size: st.Size, Allocated: st.Blocks * 512, ModTime: time.Unix(st.Mtim.Unix()),
		Dev: st.Dev, Ino: st.Ino, Ctime: st.Ctim.Nano(),
		IsDir: st.Mode&unix.S_IFMT == unix.S_IFDIR, IsFile: st.Mode&unix.S_IFMT == unix.S_IFREG}
}

// OSDir is a Dir on a mounted directory. Every call works relative to one
// descriptor of the root, opened at the first call (the operator's path to
// it is trusted, links included), and opened again only once the
// descriptor's filesystem is gone (ENOTCONN, ENODEV, ESTALE: its client
// died) and the path names another directory (the filesystem mounted
// again), checked at most once per rootCheckEvery: a directory swapped in at
// the path of a live one is never taken. Below the root, names resolve
// without following a link (tiers/internal/beneath).
// Files are opened O_NONBLOCK (a FIFO never blocks an open) and checked to
// be regular before a byte is read or written.
type OSDir struct {
	root string

	mu        sync.Mutex
	rootFD    int
	opened    bool
	rootDev   uint64
	rootIno   uint64
	checkedAt time.Time
	// checking is set while one call checks the descriptor.
	checking bool
}

// rootCheckEvery is how often the root's descriptor is checked to be alive.
const rootCheckEvery = time.Second

// NewOSDir is the Dir of the directory root.
func NewOSDir(root string) *OSDir { return &OSDir{root: root} }

// rootDir returns the root's descriptor, opening it at the first call and
// again once its filesystem is gone and the path names another directory. A
// descriptor replaced is left open: a call on another worker may still hold
// its number. One call at a time checks, without the lock: a check stuck in
// a hung filesystem holds up no other call.
func (d *OSDir) rootDir() (int, error) {
	d.mu.Lock()
	if !d.opened {
		defer d.mu.Unlock()
		return d.openRoot()
	}
	fd := d.rootFD
	if d.checking || time.Since(d.checkedAt) < rootCheckEvery {
		d.mu.Unlock()
		return fd, nil
	}
	d.checking = true
	d.mu.Unlock()
	var st, now unix.Stat_t
	err := unix.Fstat(fd, &st)
	gone := (err == unix.ENOTCONN || err == unix.ENODEV || err == unix.ESTALE) &&
		unix.Stat(d.root, &now) == nil && (now.Dev != d.rootDev || now.Ino != d.rootIno)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.checking, d.checkedAt = false, time.Now()
	if !gone {
		return fd, nil
	}
	return d.openRoot()
}

// openRoot opens the root by its path; d.mu is held.
func (d *OSDir) openRoot() (int, error) {
	fd, err := unix.Open(d.root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &fs.PathError{Op: "open", Path: d.root, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, &fs.PathError{Op: "fstat", Path: d.root, Err: err}
	}
	d.rootFD, d.opened, d.rootDev, d.rootIno, d.checkedAt = fd, true, st.Dev, st.Ino, time.Now()
	return fd, nil
}

// open opens rel below the root (O_NONBLOCK added: a FIFO never blocks an
// open) without following any link.
func (d *OSDir) open(rel string, flags int, mode uint32) (int, error) {
	root, err := d.rootDir()
	if err != nil {
		return -1, err
	}
	fd, err := beneath.Open(root, rel, flags|unix.O_NONBLOCK, mode)
	return fd, pathErr("open", rel, err)
}

// components splits rel into the plain names beneath.Open accepts.
func components(rel string) ([]string, error) {
	parts, err := beneath.Split(rel)
	return parts, pathErr("resolve", rel, err)
}

// parent opens the directory holding rel and returns it with rel's last
// name; done closes it.
func (d *OSDir) parent(rel string) (dir int, name string, done func(), err error) {
	parts, err := components(rel)
	if err != nil {
		return -1, "", nil, err
	}
	if len(parts) == 0 {
		return -1, "", nil, &fs.PathError{Op: "resolve", Path: rel, Err: syscall.EINVAL}
	}
	if len(parts) == 1 {
		root, err := d.rootDir()
		return root, parts[0], func() {}, err
	}
	fd, err := d.open(strings.Join(parts[:len(parts)-1], "/"), unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return -1, "", nil, err
	}
	return fd, parts[len(parts)-1], func() { unix.Close(fd) }, nil
}

// openRegular opens rel and checks that it is a regular file.
func (d *OSDir) openRegular(rel string, flags int, mode uint32) (*os.File, FileInfo, error) {
	fd, err := d.open(rel, flags, mode)
	if err != nil {
		return nil, FileInfo{}, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, FileInfo{}, pathErr("fstat", rel, err)
	}
	info := fileInfo(&st)
	if !info.IsFile {
		unix.Close(fd)
		return nil, info, pathErr("open", rel, errNotRegular)
	}
	// O_NONBLOCK only kept the open from waiting (a FIFO); the bytes of a
	// regular file are read and written blocking.
	if fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0); err == nil {
		unix.FcntlInt(uintptr(fd), unix.F_SETFL, fl&^unix.O_NONBLOCK)
	}
	return os.NewFile(uintptr(fd), rel), info, nil
}

func pathErr(op, rel string, err error) error {
	if err == nil {
		return nil
	}
	return &fs.PathError{Op: op, Path: rel, Err: err}
}

// Stat stats rel without following a link.
func (d *OSDir) Stat(rel string) (FileInfo, error) {
	var st unix.Stat_t
	if rel == "." {
		root, err := d.rootDir()
		if err != nil {
			return FileInfo{}, err
		}
		if err := unix.Fstat(root, &st); err != nil {
			return FileInfo{}, pathErr("stat", rel, err)
		}
		return fileInfo(&st), nil
	}
	dir, name, done, err := d.parent(rel)
	if err != nil {
		return FileInfo{}, err
	}
	defer done()
	if err := unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return FileInfo{}, pathErr("stat", rel, err)
	}
	return fileInfo(&st), nil
}

// ReadFile reads a regular file of at most limit bytes whole.
func (d *OSDir) ReadFile(rel string, limit int64) ([]byte, error) {
	f, info, err := d.openRegular(rel, unix.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if info.Size > limit {
		return nil, pathErr("read", rel, errTooLarge)
	}
	buf := make([]byte, info.Size)
	n, err := f.ReadAt(buf, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	// A file that shrank while read comes back short.
	return buf[:n], nil
}

// fetchChunk is the size of a block's reads from the shared store: large,
// so that a distributed filesystem's client sees few requests.
const fetchChunk = 4 << 20

// errDirectRefused is an O_DIRECT open or first read the filesystem refused.
var errDirectRefused = errors.New("O_DIRECT refused")

// ReadBlock reads a block with O_DIRECT (no copy through the client's page
// cache), buffered where the filesystem refuses it.
func (d *OSDir) ReadBlock(rel string, size int64, chunk func([]byte)) ([]byte, error) {
	data, err := d.readBlock(rel, size, unix.O_DIRECT, chunk)
	if errors.Is(err, errDirectRefused) {
		data, err = d.readBlock(rel, size, 0, chunk)
	}
	return data, err
}

func (d *OSDir) readBlock(rel string, size int64, flags int, chunk func([]byte)) ([]byte, error) {
	f, info, err := d.openRegular(rel, unix.O_RDONLY|flags, 0)
	if err != nil {
		if flags != 0 && errors.Is(err, syscall.EINVAL) {
			return nil, errDirectRefused
		}
		return nil, err
	}
	defer f.Close()
	// Sized by the record, never by the file: a sparse terabyte is refused
	// before a byte is allocated.
	if info.Size != size {
		return nil, pathErr("read", rel, errWrongSize)
	}
	align := int64(block.PageSize)
	buf := alignedBuffer(int((size + align - 1) / align * align))
	var n int64
	for n < size {
		got, err := f.ReadAt(buf[n:min(n+fetchChunk, int64(len(buf)))], n)
		// Bytes past the size seen at the open (the file grew) are not the block's.
		got = int(min(int64(got), size-n))
		if got > 0 {
			chunk(buf[n : n+int64(got)])
			n += int64(got)
		}
		switch {
		case err == nil && got > 0:
		case errors.Is(err, io.EOF) || err == nil:
			// A file that shrank while read comes back short and fails its digest.
			return buf[:n], nil
		case flags != 0 && n == 0 && errors.Is(err, syscall.EINVAL):
			return nil, errDirectRefused
		default:
			return nil, err
		}
	}
	return buf[:n], nil
}

// alignedBuffer is a buffer of size bytes starting on a page boundary, the
// alignment O_DIRECT wants of buffers, offsets and lengths (a page is a
// multiple of any device's logical block).
func alignedBuffer(size int) []byte {
	buf := make([]byte, size+block.PageSize)
	off := int(uintptr(unsafe.Pointer(unsafe.SliceData(buf))) % uintptr(block.PageSize))
	if off != 0 {
		off = block.PageSize - off
	}
	return buf[off : off+size : off+size]
}

// WriteFile creates rel exclusively and writes data, skipping all-zero pages.
func (d *OSDir) WriteFile(rel string, data []byte) error {
	f, _, err := d.openRegular(rel, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	for off := 0; off < len(data); off += block.PageSize {
		end := min(off+block.PageSize, len(data))
		if block.IsZero(data[off:end]) {
			continue
		}
		// Runs of non-zero pages go out in one write each.
		for end < len(data) && !block.IsZero(data[end:min(end+block.PageSize, len(data))]) {
			end = min(end+block.PageSize, len(data))
		}
		if _, err := f.WriteAt(data[off:end], int64(off)); err != nil {
			f.Close()
			return err
		}
		off = end - block.PageSize
	}
	if err := f.Truncate(int64(len(data))); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Rename renames within the directory, over a file at to.
func (d *OSDir) Rename(from, to string) error {
	return d.betweenParents("rename", from, to, unix.Renameat)
}

// Link makes a second name; it fails with EEXIST when to exists. A link
// at from is linked itself, never its target.
func (d *OSDir) Link(from, to string) error {
	return d.betweenParents("link", from, to, func(fromDir int, fromName string, toDir int, toName string) error {
		return unix.Linkat(fromDir, fromName, toDir, toName, 0)
	})
}

// betweenParents runs op (renameat, linkat) on from's and to's names in
// their parent directories.
func (d *OSDir) betweenParents(what, from, to string, op func(fromDir int, fromName string, toDir int, toName string) error) error {
	fromDir, fromName, doneFrom, err := d.parent(from)
	if err != nil {
		return err
	}
	defer doneFrom()
	toDir, toName, doneTo, err := d.parent(to)
	if err != nil {
		return err
	}
	defer doneTo()
	return pathErr(what, from, op(fromDir, fromName, toDir, toName))
}

// Remove removes a name that is not a directory.
func (d *OSDir) Remove(rel string) error {
	dir, name, done, err := d.parent(rel)
	if err != nil {
		return err
	}
	defer done()
	return pathErr("remove", rel, unix.Unlinkat(dir, name, 0))
}

// MkdirAll creates a directory and its parents (mode 0700), one component
// at a time from the root; an existing link is never walked through.
func (d *OSDir) MkdirAll(rel string) error {
	root, err := d.rootDir()
	if err != nil {
		return err
	}
	parts, err := components(rel)
	if err != nil {
		return err
	}
	cur := root
	defer func() {
		if cur != root {
			unix.Close(cur)
		}
	}()
	for _, p := range parts {
		if err := unix.Mkdirat(cur, p, 0o700); err != nil && err != unix.EEXIST {
			return pathErr("mkdir", rel, err)
		}
		next, err := beneath.Open(cur, p, unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			return pathErr("mkdir", rel, err)
		}
		if cur != root {
			unix.Close(cur)
		}
		cur = next
	}
	return nil
}

// listBatch is how many entries one getdents pass asks for.
const listBatch = 4096

// ReadDir lists a directory in batches, keeping at most limit entries.
func (d *OSDir) ReadDir(rel string, limit int, keep func(string) bool) ([]fs.DirEntry, error) {
	fd, err := d.open(rel, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	var out []fs.DirEntry
	for {
		batch, err := f.ReadDir(listBatch)
		for _, e := range batch {
			if keep != nil && !keep(e.Name()) {
				continue
			}
			if len(out) == limit {
				return nil, pathErr("readdir", rel, errTooLarge)
			}
			out = append(out, e)
		}
		switch {
		case errors.Is(err, io.EOF):
			return out, nil
		case err != nil:
			return nil, err
		}
	}
}

// Touch sets a file's modification time, which the evictor reads as its last use.
func (d *OSDir) Touch(rel string, t time.Time) error {
	dir, name, done, err := d.parent(rel)
	if err != nil {
		return err
	}
	defer done()
	ts := unix.NsecToTimespec(t.UnixNano())
	return pathErr("utimes", rel, unix.UtimesNanoAt(dir, name, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW))
}

// GetXattr reads an extended attribute of a regular file.
func (d *OSDir) GetXattr(rel, name string) ([]byte, error) {
	f, _, err := d.openRegular(rel, unix.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	buf := make([]byte, maxXattr)
	n, err := unix.Fgetxattr(int(f.Fd()), name, buf)
	if errors.Is(err, unix.ERANGE) {
		return nil, pathErr("getxattr", rel, errTooLarge)
	}
	if err != nil {
		return nil, pathErr("getxattr", rel, err)
	}
	return buf[:n], nil
}

// SetXattr sets an extended attribute of a regular file.
func (d *OSDir) SetXattr(rel, name string, value []byte) error {
	f, _, err := d.openRegular(rel, unix.O_RDONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	return pathErr("setxattr", rel, unix.Fsetxattr(int(f.Fd()), name, value, 0))
}

// Append appends data to rel (created if missing) in one O_APPEND write, so
// that records written by several processes never interleave within one.
func (d *OSDir) Append(rel string, data []byte) error {
	f, _, err := d.openRegular(rel, unix.O_WRONLY|unix.O_CREAT|unix.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// ReadFrom reads a regular file of at most fileLimit bytes from off to its
// end (at most limit bytes), with the stat of the file read.
func (d *OSDir) ReadFrom(rel string, off, limit, fileLimit int64) ([]byte, FileInfo, error) {
	f, info, err := d.openRegular(rel, unix.O_RDONLY, 0)
	if err != nil {
		return nil, info, err
	}
	defer f.Close()
	if info.Size > fileLimit {
		return nil, info, pathErr("read", rel, errTooLarge)
	}
	if off >= info.Size {
		return nil, info, nil
	}
	buf := make([]byte, min(info.Size-off, limit))
	n, err := f.ReadAt(buf, off)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, info, err
	}
	return buf[:n], info, nil
}
