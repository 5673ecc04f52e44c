package disk

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"os"
	"runtime/debug"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/tiers/shm"
)

// checksumXattr holds a block's digest (size, CRC32C, sampled windows) beside
// its data, so the bytes of the block file are exactly the engine's row.
const checksumXattr = "user.kvtierfs.crc32c"

// ReservedXattrPrefix is the xattr namespace the store owns; the mount hides it.
const ReservedXattrPrefix = "user.kvtierfs."

// castagnoli is the CRC32C table; the standard library accelerates it in hardware.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// readDigest reads a block's digest record; ok is false when it has none.
func readDigest(path string) (shm.Digest, bool, error) {
	buf := make([]byte, 256)
	n, err := unix.Getxattr(path, checksumXattr, buf)
	if err == unix.ENODATA {
		return shm.Digest{}, false, nil
	}
	if err != nil {
		return shm.Digest{}, false, err
	}
	var d shm.Digest
	if err := d.UnmarshalBinary(buf[:n]); err != nil {
		return shm.Digest{}, false, err
	}
	return d, true, nil
}

// writeDigest stores a digest record on an open file.
func writeDigest(f *os.File, d shm.Digest) error {
	b, _ := d.MarshalBinary()
	return unix.Fsetxattr(int(f.Fd()), checksumXattr, b, 0)
}

// digestFile samples an open file whose size and CRC32C are known.
func digestFile(f *os.File, size int64, crc uint32) (shm.Digest, error) {
	var buf [8]byte
	return shm.NewDigest(size, crc, func(off int64) (uint64, error) {
		if _, err := f.ReadAt(buf[:], off); err != nil {
			return 0, err
		}
		return binary.LittleEndian.Uint64(buf[:]), nil
	})
}

// fileCRC computes the CRC32C of the first size bytes of an open file through a
// read-only mapping, so no copy of the data is made. A file truncated under the
// mapping yields an error, not a crash.
func fileCRC(f *os.File, size int64) (crc uint32, err error) {
	if size == 0 {
		return 0, nil
	}
	data, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return 0, fmt.Errorf("mmap for checksum: %w", err)
	}
	defer unix.Munmap(data)
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("file changed size while being checksummed: %v", r)
		}
	}()
	return crc32.Update(0, castagnoli, data), nil
}

// fileSize returns the size of an open file.
func fileSize(f *os.File) (size, physical int64, err error) {
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return 0, 0, err
	}
	return st.Size, st.Blocks * 512, nil
}
