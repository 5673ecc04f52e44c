package disk

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
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

// vllmChecksumXattr is the CRC32C vLLM itself may set on a block's tmp file
// before the rename (opt-in, vLLM PR #57912).
const vllmChecksumXattr = "user.vllm.kv_crc32c"

// recordKey is the name a block's digest record is bound to.
func recordKey(name BlockName) shm.Key {
	return shm.Key{Group: uint64(name.Group), Hash: name.Hash}
}

// readRecord reads the digest record of an open block file; ok is false when
// it has none. A record bound to another name than the block's is an error, so
// a block file replaced by another block's bytes and record is refused; an
// unbound (v1) record sets upgrade, so that the caller binds it.
func readRecord(f *os.File, name BlockName) (d shm.Digest, ok, upgrade bool, err error) {
	buf := make([]byte, shm.MaxRecordBytes+1)
	n, err := unix.Fgetxattr(int(f.Fd()), checksumXattr, buf)
	if err == unix.ENODATA {
		return shm.Digest{}, false, false, nil
	}
	if err == unix.ERANGE {
		return shm.Digest{}, false, false, errors.New("digest record is larger than any record format")
	}
	if err != nil {
		return shm.Digest{}, false, false, err
	}
	d, key, bound, err := shm.UnmarshalRecord(buf[:n])
	if err != nil {
		return shm.Digest{}, false, false, err
	}
	if bound && key != recordKey(name) {
		return shm.Digest{}, false, false, fmt.Errorf("digest record belongs to block %s of group %d, not to this one", key.Hash, key.Group)
	}
	return d, true, !bound, nil
}

// writeDigest stores a digest record bound to the block's name on an open file.
func writeDigest(f *os.File, name BlockName, d shm.Digest) error {
	b, err := d.MarshalRecord(recordKey(name))
	if err != nil {
		return err
	}
	return unix.Fsetxattr(int(f.Fd()), checksumXattr, b, 0)
}

// vllmChecksum reads the CRC32C vLLM recorded on a file (vllmChecksumXattr);
// ok is false when there is none or it is not a CRC32C. The value is parsed
// as the text of a number (decimal, or hexadecimal with or without 0x) or as
// 4 bytes, little endian.
func vllmChecksum(f *os.File) (crc uint32, ok bool) {
	buf := make([]byte, 32)
	n, err := unix.Fgetxattr(int(f.Fd()), vllmChecksumXattr, buf)
	if err != nil {
		return 0, false
	}
	return parseVLLMChecksum(buf[:n])
}

// parseVLLMChecksum decodes a user.vllm.kv_crc32c value (see vllmChecksum).
func parseVLLMChecksum(b []byte) (uint32, bool) {
	text := strings.TrimSpace(strings.TrimRight(string(b), "\x00"))
	if v, err := strconv.ParseUint(text, 10, 32); err == nil {
		return uint32(v), true
	}
	hexText := strings.TrimPrefix(strings.ToLower(text), "0x")
	if len(hexText) == 8 {
		if v, err := strconv.ParseUint(hexText, 16, 32); err == nil {
			return uint32(v), true
		}
	}
	if len(b) == 4 {
		return binary.LittleEndian.Uint32(b), true
	}
	return 0, false
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
