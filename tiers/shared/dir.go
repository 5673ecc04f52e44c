package shared

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// Dir is the shared directory as the level uses it, by paths relative to its
// root. Any call may block for as long as the distributed filesystem's client
// does; the level runs every call under its bound (bound.go).
type Dir interface {
	Stat(rel string) (FileInfo, error)
	ReadFile(rel string) ([]byte, error)
	// ReadBlock reads a regular file whole in chunks of at most fetchChunk
	// bytes, handing each to chunk as it arrives (a fetch's progress and
	// running CRC); each byte is handed once.
	ReadBlock(rel string, chunk func([]byte)) ([]byte, error)
	// WriteFile creates rel (which must not exist) holding data; all-zero
	// pages are left as holes.
	WriteFile(rel string, data []byte) error
	Rename(from, to string) error
	Link(from, to string) error
	Remove(rel string) error
	MkdirAll(rel string) error
	ReadDir(rel string) ([]fs.DirEntry, error)
	Touch(rel string, t time.Time) error
	// Append and ReadFrom write and tail the names journal (journal.go).
	Append(rel string, data []byte) error
	ReadFrom(rel string, off, limit int64) ([]byte, FileInfo, error)
	Xattrs
}

// Xattrs are the extended attribute calls; a filesystem that keeps none
// answers ENOTSUP and the level falls back to sidecar files.
type Xattrs interface {
	GetXattr(rel, name string) ([]byte, error)
	SetXattr(rel, name string, value []byte) error
}

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

// OSDir is a Dir on a mounted directory.
type OSDir struct{ Root string }

func (d OSDir) path(rel string) string {
	if rel == "." {
		// The root itself, through a link if it is one.
		return d.Root + "/."
	}
	return filepath.Join(d.Root, rel)
}

// Stat stats rel without following a link.
func (d OSDir) Stat(rel string) (FileInfo, error) {
	var st unix.Stat_t
	if err := unix.Lstat(d.path(rel), &st); err != nil {
		return FileInfo{}, err
	}
	return FileInfo{Size: st.Size, Allocated: st.Blocks * 512, ModTime: time.Unix(st.Mtim.Unix()),
		Dev: st.Dev, Ino: st.Ino, Ctime: st.Ctim.Nano(),
		IsDir: st.Mode&unix.S_IFMT == unix.S_IFDIR, IsFile: st.Mode&unix.S_IFMT == unix.S_IFREG}, nil
}

// maxSmallFile bounds what ReadFile reads: the lease and a sidecar record
// are a few hundred bytes (block.MaxRecordBytes), so a larger file at their
// names was put there by someone else, and reading it whole could take all
// the daemon's memory.
const maxSmallFile = 64 << 10

// ReadFile reads a regular file of at most maxSmallFile bytes whole, without
// following a link. It opens O_NONBLOCK, so that a FIFO at the name is
// refused at once instead of holding the caller until a writer comes.
func (d OSDir) ReadFile(rel string) ([]byte, error) {
	f, err := os.OpenFile(d.path(rel), os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, syscall.EINVAL
	}
	if st.Size() > maxSmallFile {
		return nil, fmt.Errorf("%s holds %d bytes, more than a lease or record can (%d): %w", rel, st.Size(), maxSmallFile, syscall.EFBIG)
	}
	buf := make([]byte, st.Size())
	n, err := f.ReadAt(buf, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	// A file that shrank while read comes back short and fails its digest.
	return buf[:n], nil
}

// fetchChunk is the size of a block's reads from the shared store: large,
// so that a distributed filesystem's client sees few requests.
const fetchChunk = 4 << 20

// errDirectRefused is an O_DIRECT open or first read the filesystem refused.
var errDirectRefused = errors.New("O_DIRECT refused")

// ReadBlock reads a block with O_DIRECT (no copy through the client's page
// cache), buffered where the filesystem refuses it.
func (d OSDir) ReadBlock(rel string, chunk func([]byte)) ([]byte, error) {
	data, err := d.readBlock(rel, syscall.O_DIRECT, chunk)
	if errors.Is(err, errDirectRefused) {
		data, err = d.readBlock(rel, 0, chunk)
	}
	return data, err
}

func (d OSDir) readBlock(rel string, flags int, chunk func([]byte)) ([]byte, error) {
	f, err := os.OpenFile(d.path(rel), os.O_RDONLY|syscall.O_NOFOLLOW|flags, 0)
	if err != nil {
		if flags != 0 && errors.Is(err, syscall.EINVAL) {
			return nil, errDirectRefused
		}
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, syscall.EINVAL
	}
	size := st.Size()
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
func (d OSDir) WriteFile(rel string, data []byte) error {
	f, err := os.OpenFile(d.path(rel), os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
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

// Rename renames within the directory.
func (d OSDir) Rename(from, to string) error { return os.Rename(d.path(from), d.path(to)) }

// Link makes a second name; it fails with EEXIST when to exists.
func (d OSDir) Link(from, to string) error { return os.Link(d.path(from), d.path(to)) }

// Remove removes a file.
func (d OSDir) Remove(rel string) error { return os.Remove(d.path(rel)) }

// MkdirAll creates a directory and its parents.
func (d OSDir) MkdirAll(rel string) error { return os.MkdirAll(d.path(rel), 0o700) }

// ReadDir lists a directory.
func (d OSDir) ReadDir(rel string) ([]fs.DirEntry, error) { return os.ReadDir(d.path(rel)) }

// Touch sets a file's modification time, which the evictor reads as its last use.
func (d OSDir) Touch(rel string, t time.Time) error { return os.Chtimes(d.path(rel), t, t) }

// GetXattr reads an extended attribute.
func (d OSDir) GetXattr(rel, name string) ([]byte, error) {
	buf := make([]byte, 1024)
	n, err := unix.Lgetxattr(d.path(rel), name, buf)
	if err != nil {
		return nil, err
	}
	return buf[:n], nil
}

// SetXattr sets an extended attribute.
func (d OSDir) SetXattr(rel, name string, value []byte) error {
	return unix.Lsetxattr(d.path(rel), name, value, 0)
}

// Append appends data to rel (created if missing) in one O_APPEND write, so
// that records written by several processes never interleave within one.
func (d OSDir) Append(rel string, data []byte) error {
	f, err := os.OpenFile(d.path(rel), os.O_WRONLY|os.O_CREATE|os.O_APPEND|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// ReadFrom reads a regular file from off to its end (at most limit bytes),
// with the stat of the file read; O_NONBLOCK as ReadFile.
func (d OSDir) ReadFrom(rel string, off, limit int64) ([]byte, FileInfo, error) {
	f, err := os.OpenFile(d.path(rel), os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, FileInfo{}, err
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, FileInfo{}, err
	}
	info := FileInfo{Size: st.Size, Dev: st.Dev, Ino: st.Ino, IsFile: st.Mode&unix.S_IFMT == unix.S_IFREG}
	if !info.IsFile {
		return nil, info, syscall.EINVAL
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
