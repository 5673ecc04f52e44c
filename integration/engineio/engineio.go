// Package engineio replays the exact file I/O of vLLM's `fs` KV tier
// (DESIGN §2) and its shared offload region, so tests and benchmarks drive a
// mount — or a bare directory — the way the engine does.
package engineio

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// PageSize is the alignment of the engine's buffers and row sizes: vLLM's
// SharedOffloadRegion.BLOCK_SIZE_ALIGNMENT, mmap.PAGESIZE, this machine's page.
var PageSize = os.Getpagesize()

// Region is a shared offload region: a /dev/shm file of rows × rowBytes with no
// header, mapped read-write like the engine's SharedOffloadRegion.
type Region struct {
	// Path is the region file.
	Path string
	// Rows and RowBytes are its geometry.
	Rows, RowBytes int
	data           []byte
}

// CreateRegion creates (or truncates) and maps a region file.
func CreateRegion(path string, rows, rowBytes int) (*Region, error) {
	if rows <= 0 || rowBytes <= 0 || rowBytes%PageSize != 0 {
		return nil, fmt.Errorf("region geometry %d rows × %d bytes: rows must be positive and row bytes a positive multiple of %d", rows, rowBytes, PageSize)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	size := int64(rows) * int64(rowBytes)
	if err := f.Truncate(size); err != nil {
		return nil, err
	}
	data, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap %s: %w", path, err)
	}
	return &Region{Path: path, Rows: rows, RowBytes: rowBytes, data: data}, nil
}

// Row is the page-aligned slice of row i.
func (r *Region) Row(i int) []byte {
	return r.data[i*r.RowBytes : (i+1)*r.RowBytes]
}

// Bytes is the whole mapping, rows × row bytes (e.g. to register it for DMA).
func (r *Region) Bytes() []byte { return r.data }

// Close unmaps the region and removes its file.
func (r *Region) Close() error {
	err := unix.Munmap(r.data)
	if rmErr := os.Remove(r.Path); err == nil && !errors.Is(rmErr, os.ErrNotExist) {
		err = rmErr
	}
	return err
}

// Tier is the engine's view of an fs tier root directory.
type Tier struct {
	// Root is the tier root (root_dir in the engine's config).
	Root string
	// Direct is whether the O_DIRECT probe succeeded, so stores and loads use O_DIRECT.
	Direct bool
	// Checksum is vLLM PR #57912's opt-in CRC32C (io.py, checksum=True): Store
	// sets ChecksumXattr on the tmp before the rename, Load checks it.
	Checksum bool
	// Ops, when set, records how long each store's open and rename took.
	Ops *OpTimes
}

// OpTimes are the durations of the stores' open (the tmp's O_EXCL create)
// and rename calls, as the engine's thread waits for them.
type OpTimes struct {
	mu           sync.Mutex
	open, rename []time.Duration
}

// add records one store's open and rename.
func (o *OpTimes) add(open, rename time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.open = append(o.open, open)
	o.rename = append(o.rename, rename)
}

// Percentiles returns the p-th percentile (0 < p ≤ 100) of the opens and
// of the renames recorded, zero when none were.
func (o *OpTimes) Percentiles(p float64) (open, rename time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return percentile(o.open, p), percentile(o.rename, p)
}

// percentile is the nearest-rank p-th percentile of ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	sorted := slices.Clone(ds)
	slices.Sort(sorted)
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

// ChecksumXattr holds a block's CRC32C as four big-endian bytes (vLLM PR
// #57912, io.py _CHECKSUM_XATTR).
const ChecksumXattr = "user.vllm.kv_crc32c"

// castagnoli is the CRC32C table of vLLM's crc32c (polynomial 0x82F63B78).
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ChecksumValue is ChecksumXattr's value for data, as io.py writes it:
// crc32c(data).to_bytes(4, "big").
func ChecksumValue(data []byte) []byte {
	return binary.BigEndian.AppendUint32(nil, crc32.Checksum(data, castagnoli))
}

// ErrChecksum is a load whose bytes fail ChecksumXattr (io.py raises EBADMSG).
var ErrChecksum = unix.EBADMSG

// ProbeXattr is io.py probe_xattr: `.xattr_probe_<random>.tmp` in the root,
// four zero bytes set as ChecksumXattr on its descriptor and read back, the
// file removed. vLLM refuses checksums on a root where it fails.
func (t *Tier) ProbeXattr() error {
	probe := filepath.Join(t.Root, ".xattr_probe_"+randomSuffix()+".tmp")
	defer os.Remove(probe)
	fd, err := unix.Open(probe, unix.O_CREAT|unix.O_WRONLY|unix.O_TRUNC|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	value := make([]byte, 4)
	if err := unix.Fsetxattr(fd, ChecksumXattr, value, 0); err != nil {
		return fmt.Errorf("fsetxattr %s: %w", ChecksumXattr, err)
	}
	got := make([]byte, 8)
	n, err := unix.Fgetxattr(fd, ChecksumXattr, got)
	if err != nil {
		return fmt.Errorf("fgetxattr %s: %w", ChecksumXattr, err)
	}
	if string(got[:n]) != string(value) {
		return fmt.Errorf("%s read back as %x, set %x", ChecksumXattr, got[:n], value)
	}
	return nil
}

// OpenTier probes O_DIRECT once in the root, as newer engine versions do:
// one page written to `.o_direct_probe_<random>.tmp`, then unlinked.
func OpenTier(root string) (*Tier, error) {
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, err
	}
	t := &Tier{Root: root}
	probe := filepath.Join(root, ".o_direct_probe_"+randomSuffix()+".tmp")
	fd, err := unix.Open(probe, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0o644)
	if err == nil {
		page := alignedPage()
		n, werr := unix.Write(fd, page)
		unix.Close(fd)
		t.Direct = werr == nil && n == len(page)
		if err := os.Remove(probe); err != nil {
			return nil, fmt.Errorf("removing O_DIRECT probe: %w", err)
		}
	}
	return t, nil
}

// alignedPage returns a zeroed page-aligned page (an anonymous mapping).
func alignedPage() []byte {
	b, err := unix.Mmap(-1, 0, PageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		panic(err)
	}
	return b
}

// randomSuffix is the engine's random 63-bit tmp suffix.
func randomSuffix() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return strconv.FormatUint(binary.LittleEndian.Uint64(b[:])>>1, 10)
}

// BlockPath is `<root>/<tier>/<h[0:3]>/<h[3:5]>_g<group>/<h>.bin`.
func (t *Tier) BlockPath(tierDir string, group int, hash string) string {
	return filepath.Join(t.Root, tierDir, hash[:3], fmt.Sprintf("%s_g%d", hash[3:5], group), hash+".bin")
}

func (t *Tier) directFlag() int {
	if t.Direct {
		return unix.O_DIRECT
	}
	return 0
}

// Exists is the engine's lookup: faccessat(F_OK).
func (t *Tier) Exists(path string) bool {
	return unix.Faccessat(unix.AT_FDCWD, path, unix.F_OK, 0) == nil
}

// Store writes a row as the engine does: skip if present; makedirs; O_EXCL tmp;
// ONE write of the whole row (a short count is an error, no retry); close;
// rename(2) over the destination; unlink the tmp on any error. No fsync.
// The rename is the system call alone, as Python's os.replace makes it: Go's
// os.Rename first lstats the destination, a LOOKUP of it through a mount
// that vLLM never sends (the kernel looks the destination up again inside
// the rename).
func (t *Tier) Store(path string, row []byte) (stored bool, err error) {
	if t.Exists(path) {
		return false, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return false, err
	}
	tmp := path + "_" + randomSuffix() + ".tmp"
	opened := time.Now()
	fd, err := unix.Open(tmp, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_TRUNC|unix.O_CLOEXEC|t.directFlag(), 0o644)
	openTook := time.Since(opened)
	if err != nil {
		return false, fmt.Errorf("create %s: %w", tmp, err)
	}
	n, err := unix.Write(fd, row)
	if err == nil && n != len(row) {
		err = fmt.Errorf("short write: %d of %d bytes", n, len(row))
	}
	if err == nil && t.Checksum {
		// Before the rename, so a published block never lacks it.
		err = unix.Fsetxattr(fd, ChecksumXattr, ChecksumValue(row), 0)
	}
	if cerr := unix.Close(fd); err == nil {
		err = cerr
	}
	if err == nil {
		renamed := time.Now()
		err = unix.Rename(tmp, path)
		if t.Ops != nil && err == nil {
			t.Ops.add(openTook, time.Since(renamed))
		}
	}
	if err != nil {
		os.Remove(tmp)
		return false, fmt.Errorf("store %s: %w", path, err)
	}
	return true, nil
}

// ErrShortRead is a load that returned fewer bytes than a row.
var ErrShortRead = errors.New("short read")

// Load reads a block into a row as the engine does: open O_RDONLY|O_DIRECT,
// ONE readv of exactly len(row) bytes, close. A short read or any error makes
// the engine delete the file, and so does Load.
func (t *Tier) Load(path string, row []byte) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|t.directFlag(), 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	n, err := unix.Readv(fd, [][]byte{row})
	if err == nil && n != len(row) {
		err = fmt.Errorf("%w: %d of %d bytes", ErrShortRead, n, len(row))
	}
	if err == nil && t.Checksum {
		err = verifyChecksum(fd, row)
	}
	if cerr := unix.Close(fd); err == nil && cerr != nil {
		err = fmt.Errorf("close: %w", cerr)
	}
	if err != nil {
		os.Remove(path)
		return fmt.Errorf("load %s: %w", path, err)
	}
	return nil
}

// verifyChecksum is io.py _verify_checksum on the load's descriptor: no
// ChecksumXattr passes, a value that is not the four big-endian bytes of the
// row's CRC32C is ErrChecksum.
func verifyChecksum(fd int, row []byte) error {
	got := make([]byte, 64)
	n, err := unix.Fgetxattr(fd, ChecksumXattr, got)
	switch {
	case err == unix.ENODATA:
		return nil
	case err != nil:
		return fmt.Errorf("fgetxattr %s: %w", ChecksumXattr, err)
	case string(got[:n]) != string(ChecksumValue(row)):
		return fmt.Errorf("%s %x: %w", ChecksumXattr, got[:n], ErrChecksum)
	}
	return nil
}

// LoadIgnoringClose is vLLM's C batch loader (`csrc/fs_io.cpp` _load_block
// since vLLM PR #49328): open O_RDONLY|O_DIRECT, ONE readv of the row, close;
// an error from close after a full read is discarded and the load counts as
// done. A failed load keeps the file (the engine marks the key a miss).
func (t *Tier) LoadIgnoringClose(path string, row []byte) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|t.directFlag(), 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	n, err := unix.Readv(fd, [][]byte{row})
	unix.Close(fd)
	if err != nil {
		return fmt.Errorf("load %s: %w", path, err)
	}
	if n != len(row) {
		return fmt.Errorf("load %s: %w: %d of %d bytes", path, ErrShortRead, n, len(row))
	}
	return nil
}

// OwnSignalFreeThread locks the calling goroutine to its OS thread and blocks
// SIGURG there; the goroutine must end without unlocking, which ends the
// thread. The engine's lookup and I/O threads receive no signals, but Go
// preempts goroutines with SIGURG, and a signal reaching a thread blocked in a
// FUSE request makes the kernel interrupt it (an extra INTERRUPT round trip,
// or EINTR). Goroutines that replay the engine's file I/O run on such threads.
func OwnSignalFreeThread() {
	runtime.LockOSThread()
	var preemption unix.Sigset_t
	preemption.Val[0] = 1 << (uint(unix.SIGURG) - 1)
	if err := unix.PthreadSigmask(unix.SIG_BLOCK, &preemption, nil); err != nil {
		panic("engineio: blocking SIGURG: " + err.Error())
	}
}

// OnSignalFreeThread runs fn on a new signal-free thread and waits for it.
func OnSignalFreeThread(fn func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		OwnSignalFreeThread()
		fn()
	}()
	<-done
}

// HoldOpen opens path read-only again and again from one signal-free
// thread, as a process holding files open does, until an open fails or most
// are open: it returns the files open and the error that ended it.
func HoldOpen(path string, most int) (files []*os.File, err error) {
	OnSignalFreeThread(func() {
		for len(files) < most {
			f, openErr := os.Open(path)
			if openErr != nil {
				err = openErr
				return
			}
			files = append(files, f)
		}
	})
	return files, err
}

// FillPattern writes deterministic, incompressible bytes derived from seed
// into row (an xorshift stream), standing in for a chunk's KV.
func FillPattern(row []byte, seed uint64) {
	x := seed*0x9E3779B97F4A7C15 + 1
	for off := 0; off+8 <= len(row); off += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(row[off:], x)
	}
}
