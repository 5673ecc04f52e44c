package mount_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/integration/engineio"
	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

// The tests below replay vLLM PR #57912's opt-in checksum (io.py
// probe_xattr, _store_block, _verify_checksum): user.vllm.kv_crc32c holds the
// block's CRC32C as four big-endian bytes, set on the tmp's descriptor before
// the rename and read on the load's descriptor after the read.

// getxattr reads an xattr of path, at most 64 bytes.
func getxattr(t *testing.T, path, name string) []byte {
	t.Helper()
	buf := make([]byte, 64)
	n, err := unix.Getxattr(path, name, buf)
	if err != nil {
		t.Fatalf("getxattr %s of %s: %v", name, path, err)
	}
	return buf[:n]
}

// TestEngineChecksumXattr: the mount passes vLLM's xattr probe, publishes a
// store whose checksum matches, returns vLLM's exact bytes on getxattr of the
// block (so its own check after the load passes) and refuses at the rename a
// tmp whose checksum disagrees with its bytes.
func TestEngineChecksumXattr(t *testing.T) {
	region := newRegion(t, 3)
	d := mounttest.Start(t, mounttest.Options{ShmGlob: region.Path})
	tier := openTier(t, d)
	if err := tier.ProbeXattr(); err != nil {
		t.Fatalf("vLLM's xattr probe failed on the mount (it would refuse checksums): %v", err)
	}
	tier.Checksum = true

	row := region.Row(0)
	fillRow(row, 1)
	path := tier.BlockPath(tierDir, 0, hashOf(1))
	if stored, err := tier.Store(path, row); err != nil || !stored {
		t.Fatalf("checksummed store: stored %v, %v", stored, err)
	}
	want := engineio.ChecksumValue(expectedRow(1))
	if got := getxattr(t, path, engineio.ChecksumXattr); !bytes.Equal(got, want) {
		t.Fatalf("getxattr of the block = %x, vLLM set %x", got, want)
	}
	if err := tier.Load(path, region.Row(1)); err != nil || !bytes.Equal(region.Row(1), expectedRow(1)) {
		t.Fatalf("vLLM's checked load: %v", err)
	}

	// The engine's row changed between its write and its checksum: the
	// tmp's bytes disagree with the xattr.
	bad := tier.BlockPath(tierDir, 0, hashOf(2))
	if err := os.MkdirAll(filepath.Dir(bad), 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := bad + "_7.tmp"
	fd, err := unix.Open(tmp, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_TRUNC|unix.O_DIRECT, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	fillRow(row, 2)
	if n, err := unix.Write(fd, row); err != nil || n != len(row) {
		t.Fatalf("write %d, %v", n, err)
	}
	if err := unix.Fsetxattr(fd, engineio.ChecksumXattr, engineio.ChecksumValue(expectedRow(3)), 0); err != nil {
		t.Fatal(err)
	}
	onTmp := make([]byte, 8)
	n, err := unix.Fgetxattr(fd, engineio.ChecksumXattr, onTmp)
	if err != nil || !bytes.Equal(onTmp[:n], engineio.ChecksumValue(expectedRow(3))) {
		t.Fatalf("fgetxattr of the tmp = %x, %v", onTmp[:max(n, 0)], err)
	}
	unix.Close(fd)
	if err := os.Rename(tmp, bad); !errors.Is(err, syscall.EIO) {
		t.Fatalf("rename of a tmp whose vLLM checksum disagrees = %v, want EIO", err)
	}
	os.Remove(tmp)
	if tier.Exists(bad) {
		t.Fatal("the block with a disagreeing checksum is present")
	}
	if c := d.Stats().Counters; c.ChecksumFailures != 1 {
		t.Errorf("checksum failures %d, want 1 (the disagreeing store)", c.ChecksumFailures)
	}
}

// TestEngineChecksumAdoptedAtMount: blocks an engine checksummed straight
// into the store directory (no digest record) are adopted at mount when the
// four bytes match, and left out when they disagree or are not vLLM's format.
func TestEngineChecksumAdoptedAtMount(t *testing.T) {
	store := t.TempDir()
	bare := &engineio.Tier{Root: store, Checksum: true}
	row := make([]byte, rowBytes)
	paths := map[int]string{}
	for i := 1; i <= 3; i++ {
		fillRow(row, i)
		paths[i] = bare.BlockPath(tierDir, 0, hashOf(i))
		if _, err := bare.Store(paths[i], row); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Setxattr(paths[2], engineio.ChecksumXattr, engineio.ChecksumValue(expectedRow(9)), 0); err != nil {
		t.Fatal(err)
	}
	crc3 := engineio.ChecksumValue(expectedRow(3))
	littleEndian := []byte{crc3[3], crc3[2], crc3[1], crc3[0]}
	if err := unix.Setxattr(paths[3], engineio.ChecksumXattr, littleEndian, 0); err != nil {
		t.Fatal(err)
	}

	d := mounttest.Start(t, mounttest.Options{Store: store})
	tier := openTier(t, d)
	tier.Checksum = true
	adopted := tier.BlockPath(tierDir, 0, hashOf(1))
	got := make([]byte, rowBytes)
	if err := tier.LoadIgnoringClose(adopted, got); err != nil || !bytes.Equal(got, expectedRow(1)) {
		t.Fatalf("load of a block adopted by vLLM's checksum: %v", err)
	}
	if v := getxattr(t, adopted, engineio.ChecksumXattr); !bytes.Equal(v, engineio.ChecksumValue(expectedRow(1))) {
		t.Fatalf("getxattr of the adopted block = %x", v)
	}
	for _, i := range []int{2, 3} {
		if tier.Exists(tier.BlockPath(tierDir, 0, hashOf(i))) {
			t.Errorf("block %d with a wrong vLLM checksum is served", i)
		}
	}
	if c := d.Stats().Counters; c.UnprovenBlocks != 2 {
		t.Errorf("unproven blocks %d, want 2", c.UnprovenBlocks)
	}
}

// storeFromPython is vLLM's Python store with checksum=True (io.py
// _store_block), run by the Python interpreter: makedirs, O_EXCL tmp, os.write of the row,
// os.setxattr(fd, …, crc.to_bytes(4, "big")), close, os.replace. It then
// loads the block back and prints os.getxattr(fd, …) in hex, as
// _verify_checksum reads it.
const storeFromPython = `
import os, sys
dest, data_path, crc = sys.argv[1], sys.argv[2], int(sys.argv[3])
data = open(data_path, "rb").read()
tmp = dest + "_12345.tmp"
os.makedirs(os.path.dirname(dest), exist_ok=True)
try:
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_TRUNC, 0o644)
    try:
        if os.write(fd, data) != len(data):
            raise OSError("short write")
        os.setxattr(fd, "user.vllm.kv_crc32c", crc.to_bytes(4, "big"))
    finally:
        os.close(fd)
    os.replace(tmp, dest)
except Exception:
    os.remove(tmp)
    raise
fd = os.open(dest, os.O_RDONLY)
try:
    if os.read(fd, len(data) + 1) != data:
        raise OSError("wrong bytes")
    print(os.getxattr(fd, "user.vllm.kv_crc32c").hex())
finally:
    os.close(fd)
`

// TestEngineChecksumFromPython runs the store above with Python's own
// os.setxattr, so the bytes are exactly those Python's int.to_bytes makes.
func TestEngineChecksumFromPython(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not installed; TestEngineChecksumXattr covers the same bytes from Go")
	}
	d := mounttest.Start(t, mounttest.Options{})
	tier := openTier(t, d)
	dataPath := filepath.Join(t.TempDir(), "row")
	if err := os.WriteFile(dataPath, expectedRow(4), 0o600); err != nil {
		t.Fatal(err)
	}
	dest := tier.BlockPath(tierDir, 0, hashOf(4))
	want := engineio.ChecksumValue(expectedRow(4))
	crc := uint64(want[0])<<24 | uint64(want[1])<<16 | uint64(want[2])<<8 | uint64(want[3])
	out, err := exec.Command(python, "-c", storeFromPython, dest, dataPath, strconv.FormatUint(crc, 10)).CombinedOutput()
	if err != nil {
		t.Fatalf("Python store and load: %v\n%s", err, out)
	}
	if got := string(bytes.TrimSpace(out)); got != fmt.Sprintf("%08x", crc) {
		t.Fatalf("Python read the block's checksum back as %s, set %08x", got, crc)
	}
	// A wrong checksum from Python fails its rename.
	dest = tier.BlockPath(tierDir, 0, hashOf(5))
	out, err = exec.Command(python, "-c", storeFromPython, dest, dataPath, strconv.FormatUint(crc^1, 10)).CombinedOutput()
	if err == nil || !bytes.Contains(out, []byte("Errno 5")) {
		t.Fatalf("Python store with a wrong checksum: %v\n%s; want EIO at the rename", err, out)
	}
	if tier.Exists(dest) {
		t.Fatal("block with a wrong checksum from Python is present")
	}
}
