package disk

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// readRecord reads the digest record of an open block file; ok is false when
// it has none. A record bound to another name than the block's is an error, so
// a block file replaced by another block's bytes and record, or copied with
// its record from another tier, is refused; a record bound to less than the
// whole name (v1: nothing, v2: no tier) sets upgrade, so that the caller binds
// it to the name it was found under.
func readRecord(f *os.File, name block.Name) (d block.Digest, ok, upgrade bool, err error) {
	buf := make([]byte, block.MaxRecordBytes+1)
	n, err := unix.Fgetxattr(int(f.Fd()), block.RecordXattr, buf)
	if err == unix.ENODATA {
		return block.Digest{}, false, false, nil
	}
	if err == unix.ERANGE {
		return block.Digest{}, false, false, errors.New("digest record is larger than any record format")
	}
	if err != nil {
		return block.Digest{}, false, false, err
	}
	d, key, bound, err := block.UnmarshalRecord(buf[:n])
	if err != nil {
		return block.Digest{}, false, false, err
	}
	if bound && !key.Fits(name) {
		return block.Digest{}, false, false, fmt.Errorf("digest record belongs to block %s of group %d in tier %q, not to this one", key.Hash, key.Group, key.Tier)
	}
	return d, true, key.Tier == "", nil
}

// writeDigest stores a digest record bound to the block's name on an open file.
func writeDigest(f *os.File, name block.Name, d block.Digest) error {
	b, err := d.MarshalRecord(name.Binding())
	if err != nil {
		return err
	}
	return unix.Fsetxattr(int(f.Fd()), block.RecordXattr, b, 0)
}

// vllmChecksum reads the CRC32C vLLM recorded on a file
// (block.VLLMChecksumXattr); present is false when there is none, err is set
// when there is one that is not four bytes.
func vllmChecksum(f *os.File) (crc uint32, present bool, err error) {
	var buf [8]byte
	n, err := unix.Fgetxattr(int(f.Fd()), block.VLLMChecksumXattr, buf[:])
	switch err {
	case nil:
	case unix.ERANGE:
		return 0, true, fmt.Errorf("%s is longer than the 4 bytes vLLM writes", block.VLLMChecksumXattr)
	default:
		return 0, false, nil
	}
	crc, err = block.ParseVLLMChecksum(buf[:n])
	return crc, true, err
}

// digestFile samples an open file whose CRCs sum summed.
func digestFile(f *os.File, sum *block.Sum) (block.Digest, error) {
	var buf [8]byte
	return block.NewDigest(sum, func(off int64) (uint64, error) {
		if _, err := f.ReadAt(buf[:], off); err != nil {
			return 0, err
		}
		return binary.LittleEndian.Uint64(buf[:]), nil
	})
}

// fileSum sums the CRCs of the first size bytes of an open file through a
// read-only mapping, so no copy of the data is made. A file truncated under the
// mapping yields an error, not a crash.
func fileSum(f *os.File, size int64) (sum *block.Sum, err error) {
	sum = new(block.Sum)
	if size == 0 {
		return sum, nil
	}
	data, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("mmap for checksum: %w", err)
	}
	defer unix.Munmap(data)
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("file changed size while being checksummed: %v", r)
		}
	}()
	sum.Write(data)
	return sum, nil
}

// fileSize returns the size of an open file.
func fileSize(f *os.File) (size, physical int64, err error) {
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return 0, 0, err
	}
	return st.Size, st.Blocks * 512, nil
}
