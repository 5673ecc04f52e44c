package disk

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"os"
	"runtime/debug"
	"syscall"

	"golang.org/x/sys/unix"
)

// checksumXattr holds a block's CRC32C and size beside its data, so the bytes
// of the block file are exactly the engine's row.
const checksumXattr = "user.kvtierfs.crc32c"

// ReservedXattrPrefix is the xattr namespace the store owns; the mount hides it.
const ReservedXattrPrefix = "user.kvtierfs."

// castagnoli is the CRC32C table; the standard library accelerates it in hardware.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// checksumRecord is the content of the checksum xattr: crc32c then size, big endian.
type checksumRecord struct {
	crc  uint32
	size int64
}

func (r checksumRecord) encode() []byte {
	b := make([]byte, 12)
	binary.BigEndian.PutUint32(b, r.crc)
	binary.BigEndian.PutUint64(b[4:], uint64(r.size))
	return b
}

// readChecksum reads a block's checksum record; ok is false when it has none.
func readChecksum(path string) (checksumRecord, bool, error) {
	buf := make([]byte, 12)
	n, err := unix.Getxattr(path, checksumXattr, buf)
	if err == unix.ENODATA {
		return checksumRecord{}, false, nil
	}
	if err != nil {
		return checksumRecord{}, false, err
	}
	if n != len(buf) {
		return checksumRecord{}, false, fmt.Errorf("checksum xattr has %d bytes, want %d", n, len(buf))
	}
	return checksumRecord{crc: binary.BigEndian.Uint32(buf), size: int64(binary.BigEndian.Uint64(buf[4:]))}, true, nil
}

// writeChecksum stores a checksum record on an open file.
func writeChecksum(f *os.File, rec checksumRecord) error {
	return unix.Fsetxattr(int(f.Fd()), checksumXattr, rec.encode(), 0)
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
