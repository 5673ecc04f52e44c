package mount_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/integration/engineio"
	"github.com/kvtierfs/kvtierfs/integration/mounttest"
	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// The passthrough store path (DESIGN.md "The store"): once the tier's row
// size is known, the kernel writes a block tmp file without the daemon, and
// the rename takes the digest and the zero pages from the engine's row.

// passthroughMount is a mount with a region of rows the engine stores from,
// whose tier already holds block 0 (stored through the daemon, which tells
// the store the tier's row size). Every later row is passed through
// (--passthrough-min-row 0), whatever its size.
type passthroughMount struct {
	d      *mounttest.Daemon
	tier   *engineio.Tier
	region *engineio.Region
	store  string
}

func newPassthroughMount(t *testing.T, rows int, args ...string) *passthroughMount {
	t.Helper()
	return newPassthroughMountAt(t, t.TempDir(), rows, args...)
}

// newPassthroughMountAt is newPassthroughMount with its store at store.
func newPassthroughMountAt(t *testing.T, store string, rows int, args ...string) *passthroughMount {
	t.Helper()
	m := &passthroughMount{region: newRegion(t, rows), store: store}
	args = append([]string{"--passthrough-min-row", "0"}, args...)
	m.d = mounttest.Start(t, mounttest.Options{Store: m.store, ShmGlob: m.region.Path, Args: args})
	m.tier = openTier(t, m.d)
	storeBlock(t, m.tier, m.region.Row(0), 0)
	return m
}

// paths are block i's name and a tmp name beside it, on the mount.
func (m *passthroughMount) paths(i int) (block, tmp string) {
	block = m.tier.BlockPath(tierDir, 0, hashOf(i))
	return block, block + "_7.tmp"
}

// storeFile is block i's file in the store directory.
func (m *passthroughMount) storeFile(i int) string {
	block, _ := m.paths(i)
	return filepath.Join(m.store, strings.TrimPrefix(block, m.d.Mountpoint))
}

// openTmp creates block i's tmp file as the engine does.
func (m *passthroughMount) openTmp(t *testing.T, i int) int {
	t.Helper()
	_, tmp := m.paths(i)
	if err := os.MkdirAll(filepath.Dir(tmp), 0o755); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(tmp, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	return fd
}

// pwrite writes p at off, all of it.
func pwrite(t *testing.T, fd int, p []byte, off int64) {
	t.Helper()
	if n, err := unix.Pwrite(fd, p, off); err != nil || n != len(p) {
		t.Fatalf("pwrite of %d bytes at %d: %d, %v", len(p), off, n, err)
	}
}

// publish closes fd and renames block i's tmp to its name.
func (m *passthroughMount) publish(t *testing.T, fd, i int) error {
	t.Helper()
	if fd >= 0 {
		if err := unix.Close(fd); err != nil {
			t.Fatal(err)
		}
	}
	block, tmp := m.paths(i)
	return os.Rename(tmp, block)
}

// loadsBack loads block i into a scratch row and compares it with want.
func (m *passthroughMount) loadsBack(t *testing.T, i int, scratch []byte, want []byte) {
	t.Helper()
	block, _ := m.paths(i)
	clear(scratch)
	if err := m.tier.Load(block, scratch); err != nil {
		t.Fatalf("load of block %d: %v", i, err)
	}
	if !bytes.Equal(scratch, want) {
		t.Fatalf("block %d loaded other bytes", i)
	}
}

// recordedDigest is the digest the store recorded beside block i, read
// after a load's open of the block, which waits for the proof that records it.
func (m *passthroughMount) recordedDigest(t *testing.T, i int) block.Digest {
	t.Helper()
	path, _ := m.paths(i)
	fd, err := unix.Open(path, unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	buf := make([]byte, block.MaxRecordBytes)
	n, err := unix.Getxattr(m.storeFile(i), "user.kvtierfs.crc32c", buf)
	if err != nil {
		t.Fatal(err)
	}
	d, _, _, err := block.UnmarshalRecord(buf[:n])
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// A store's bytes go straight to the tmp file; the digest recorded is the
// row's own, and the block loads back verified.
func TestPassthroughDigestFromRow(t *testing.T) {
	m := newPassthroughMount(t, 4)
	for i := 1; i < 3; i++ {
		storeBlock(t, m.tier, m.region.Row(i), i)
		if d, want := m.recordedDigest(t, i), block.DigestOf(expectedRow(i)); d.CRC != want.CRC || d.Size != want.Size {
			t.Fatalf("block %d recorded crc %08x size %d, the row's is %08x size %d", i, d.CRC, d.Size, want.CRC, want.Size)
		}
	}
	st := m.d.Stats().Counters
	if st.StoresFromRow != 2 || st.StoresReadBack != 0 || st.WriteBytes != 3*rowBytes {
		t.Fatalf("stores from row %d, read back %d, %d bytes written; want 2, 0 and %d",
			st.StoresFromRow, st.StoresReadBack, st.WriteBytes, 3*rowBytes)
	}
	// The daemon timed each passthrough store's reservation, probe and probe
	// read, and every rename.
	phases := m.d.Stats().Disk.StorePhases
	for name, want := range map[string]int64{"create_reserve": 2, "rename_probe": 2, "rename_probe_read": 2, "rename": st.Writes} {
		if got := phases[name].Count; got != want {
			t.Errorf("store phase %s timed %d times, want %d", name, got, want)
		}
	}
	for i := 1; i < 3; i++ {
		m.loadsBack(t, i, m.region.Row(3), expectedRow(i))
	}
}

// A passthrough store leaves none of the block's pages in the page cache, as
// the engine's O_DIRECT write does without the mount: the kernel writes
// through its own backing file, opened with the engine's flags, and the
// proof reads the pages it samples O_DIRECT.
func TestPassthroughLeavesNothingInThePageCache(t *testing.T) {
	m := newPassthroughMount(t, 4)
	for i := 1; i < 3; i++ {
		storeBlock(t, m.tier, m.region.Row(i), i)
		m.recordedDigest(t, i) // after the proof
		if n := residentPages(t, m.storeFile(i)); n != 0 {
			t.Errorf("block %d: %d of its pages are in the page cache after the rename", i, n)
		}
	}
	if st := m.d.Stats().Counters; st.StoresFromRow != 2 {
		t.Fatalf("stores from row %d, want 2 (the stores did not take the passthrough path)", st.StoresFromRow)
	}
}

// residentPages counts the pages of a file in the page cache.
func residentPages(t *testing.T, path string) int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	vec := make([]byte, (len(m)+block.PageSize-1)/block.PageSize)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatal(errno)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}

// All-zero pages of a passthrough store end up as holes in the store file,
// and a row half zero (another node's slot, either half) is still found from
// the region: the proof reads runs of the file until one is not all zero.
func TestPassthroughZeroPagesAreHoles(t *testing.T) {
	m := newPassthroughMount(t, 4)
	for i, zeroHalf := range map[int]int{1: 1, 2: 0} {
		row := m.region.Row(i)
		fillRow(row, i)
		clear(row[zeroHalf*rowBytes/2 : (zeroHalf+1)*rowBytes/2])
		want := bytes.Clone(row)
		if _, err := m.tier.Store(m.tier.BlockPath(tierDir, 0, hashOf(i)), row); err != nil {
			t.Fatal(err)
		}
		m.recordedDigest(t, i) // after the proof, which punches the holes
		var st unix.Stat_t
		if err := unix.Stat(m.storeFile(i), &st); err != nil {
			t.Fatal(err)
		}
		if allocated := st.Blocks * 512; allocated > rowBytes/2+16<<10 {
			t.Fatalf("store file allocates %d bytes for a row half zero (%d bytes of data)", allocated, rowBytes/2)
		}
		m.loadsBack(t, i, m.region.Row(3), want)
	}
	if c := m.d.Stats().Counters; c.StoresFromRow != 2 || c.StoresReadBack != 0 {
		t.Fatalf("%d stores from a row and %d read back, want 2 and 0", c.StoresFromRow, c.StoresReadBack)
	}
}

// Bytes that no row of the region holds are read back from the tmp file.
func TestPassthroughReadsBackWithoutRow(t *testing.T) {
	m := newPassthroughMount(t, 2)
	buf, err := unix.Mmap(-1, 0, rowBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(buf)
	fillRow(buf, 5)
	clear(buf[:rowBytes/4])
	if _, err := m.tier.Store(m.tier.BlockPath(tierDir, 0, hashOf(5)), buf); err != nil {
		t.Fatal(err)
	}
	if d := m.recordedDigest(t, 5); d.CRC != block.CRC32C(buf) {
		t.Fatalf("recorded crc %08x, the bytes' %08x", d.CRC, block.CRC32C(buf))
	}
	if c := m.d.Stats().Counters; c.StoresReadBack != 1 || c.StoresFromRow != 0 {
		t.Fatalf("stores read back %d, from a row %d; want 1 and 0", c.StoresReadBack, c.StoresFromRow)
	}
	m.loadsBack(t, 5, m.region.Row(1), buf)
}

// A tmp file is never visible as its block while it is written, and a rename
// while the writer still holds the file (the kernel could write to the
// block after its digest was taken) is refused.
func TestPassthroughTmpNeverVisible(t *testing.T) {
	m := newPassthroughMount(t, 3)
	block, _ := m.paths(1)
	row := m.region.Row(1)
	fillRow(row, 1)
	fd := m.openTmp(t, 1)
	pwrite(t, fd, row[:rowBytes/2], 0)
	if m.tier.Exists(block) {
		t.Fatal("the block is visible while its tmp file is written")
	}
	pwrite(t, fd, row[rowBytes/2:], rowBytes/2)
	if err := m.publish(t, -1, 1); !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("rename with the tmp still open: %v, want EBUSY", err)
	}
	if m.tier.Exists(block) {
		t.Fatal("the block was published while its writer held the tmp file")
	}
	if err := m.publish(t, fd, 1); err != nil {
		t.Fatal(err)
	}
	m.loadsBack(t, 1, m.region.Row(2), expectedRow(1))
}

// ftruncate to the row size, fallocate and writes out of order before the
// rename (an engine worker per rank does the first and the last).
func TestPassthroughTruncateAllocateOutOfOrder(t *testing.T) {
	m := newPassthroughMount(t, 3)
	row := m.region.Row(1)
	fillRow(row, 1)
	fd := m.openTmp(t, 1)
	if err := unix.Fallocate(fd, 0, 0, rowBytes); err != nil {
		t.Fatal(err)
	}
	if err := unix.Ftruncate(fd, rowBytes); err != nil {
		t.Fatal(err)
	}
	for _, quarter := range []int{3, 1, 0, 2} {
		off := quarter * rowBytes / 4
		pwrite(t, fd, row[off:off+rowBytes/4], int64(off))
	}
	if err := m.publish(t, fd, 1); err != nil {
		t.Fatal(err)
	}
	m.loadsBack(t, 1, m.region.Row(2), expectedRow(1))
	if c := m.d.Stats().Counters; c.StoresFromRow != 1 {
		t.Fatalf("%d stores from a row, want 1", c.StoresFromRow)
	}
}

// The engine's user.vllm.kv_crc32c is checked against the row the bytes
// came from: a wrong one is never published.
func TestPassthroughVLLMChecksum(t *testing.T) {
	m := newPassthroughMount(t, 3)
	for i, crc := range map[int]uint32{1: block.CRC32C(expectedRow(1)) ^ 1, 2: block.CRC32C(expectedRow(2))} {
		row := m.region.Row(i)
		fillRow(row, i)
		fd := m.openTmp(t, i)
		pwrite(t, fd, row, 0)
		_, tmp := m.paths(i)
		if err := unix.Setxattr(tmp, engineio.ChecksumXattr, binary.BigEndian.AppendUint32(nil, crc), 0); err != nil {
			t.Fatal(err)
		}
		err := m.publish(t, fd, i)
		block, _ := m.paths(i)
		switch {
		case i == 1 && (!errors.Is(err, syscall.EIO) || m.tier.Exists(block)):
			t.Fatalf("a wrong user.vllm.kv_crc32c: rename %v, block visible %v; want EIO and absent", err, m.tier.Exists(block))
		case i == 2 && err != nil:
			t.Fatalf("the right user.vllm.kv_crc32c: %v", err)
		}
	}
}

// The row of a passthrough tmp is counted against the capacity when the
// tmp is created, before any byte lands: a store that cannot fit beside the
// open tmp files is refused, nothing is published, and the store never
// holds more than its capacity.
func TestPassthroughCapacityCountedFirst(t *testing.T) {
	m := newPassthroughMount(t, 4, "--capacity", "1MiB", "--lookup-protect", "1h")
	var fds []int
	for i := 1; i < 3; i++ {
		fds = append(fds, m.openTmp(t, i))
	}
	block0, _ := m.paths(0)
	if !m.tier.Exists(block0) { // protects block 0 from eviction
		t.Fatal("block 0 absent")
	}
	row := m.region.Row(3)
	fillRow(row, 3)
	if _, err := m.tier.Store(m.tier.BlockPath(tierDir, 0, hashOf(3)), row); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("a store beside two open tmp files in a store for three rows: %v, want ENOSPC", err)
	}
	block3, _ := m.paths(3)
	if m.tier.Exists(block3) {
		t.Fatal("the refused store was published")
	}
	for j, fd := range fds {
		i := j + 1
		fillRow(m.region.Row(i), i)
		pwrite(t, fd, m.region.Row(i), 0)
		if err := m.publish(t, fd, i); err != nil {
			t.Fatal(err)
		}
	}
	// A load's open waits for the proof, which counts the store from its row.
	for i := 1; i < 3; i++ {
		m.recordedDigest(t, i)
	}
	st := m.d.Stats()
	if st.Disk.PhysicalBytes > st.Disk.CapacityBytes || st.Disk.Blocks != 3 || st.Counters.StoresFromRow != 2 {
		t.Fatalf("%d blocks, %d bytes of %d, %d stores from rows; want 3 blocks within the capacity, 2 from rows",
			st.Disk.Blocks, st.Disk.PhysicalBytes, st.Disk.CapacityBytes, st.Counters.StoresFromRow)
	}
}

// A daemon killed while the kernel writes a tmp file: the block is never
// published, and the remount removes the tmp.
func TestPassthroughTornByKill(t *testing.T) {
	m := newPassthroughMount(t, 3)
	row := m.region.Row(1)
	fillRow(row, 1)
	fd := m.openTmp(t, 1)
	pwrite(t, fd, row[:rowBytes/2], 0)
	m.d.Kill9()
	unix.Pwrite(fd, row[rowBytes/2:], rowBytes/2) // may land or fail: the mount is gone
	unix.Close(fd)
	d := mounttest.Start(t, mounttest.Options{Store: m.store, ShmGlob: m.region.Path})
	tier := openTier(t, d)
	if tier.Exists(tier.BlockPath(tierDir, 0, hashOf(1))) {
		t.Fatal("a block torn by the daemon's death is present after the remount")
	}
	if tmps, _ := filepath.Glob(filepath.Join(m.store, tierDir, "*", "*", "*.tmp")); len(tmps) != 0 {
		t.Fatalf("tmp files survived the remount: %v", tmps)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !tier.Exists(tier.BlockPath(tierDir, 0, hashOf(0))) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if err := tier.Load(tier.BlockPath(tierDir, 0, hashOf(0)), m.region.Row(2)); err != nil || !bytes.Equal(m.region.Row(2), expectedRow(0)) {
		t.Fatalf("block 0 after the remount: %v", err)
	}
}

// A row the engine zeroes in part between its write and the rename never
// makes the store punch the written bytes away: loaded from the store (the
// row reused meanwhile), the block loads as written (the pages sampled
// caught the change) or fails, never as the changed row.
func TestPassthroughRowZeroedBeforeRename(t *testing.T) {
	m := newPassthroughMount(t, 5)
	for i := 1; i < 4; i++ {
		row := m.region.Row(i)
		fillRow(row, i)
		fd := m.openTmp(t, i)
		pwrite(t, fd, row, 0)
		clear(row[40*block.PageSize : 41*block.PageSize])
		if err := m.publish(t, fd, i); err != nil {
			t.Fatal(err)
		}
		fillRow(row, i+100)
		block, _ := m.paths(i)
		scratch := m.region.Row(4)
		clear(scratch)
		if err := m.tier.Load(block, scratch); err == nil && !bytes.Equal(scratch, expectedRow(i)) {
			t.Fatalf("block %d loaded with success and bytes it was not written with", i)
		}
	}
}

// A row the engine changes at pages the rename does not sample, between its
// write and the rename, gives the block the changed row's digest. While the
// row still holds those bytes a load must not be served from it: the file
// holds the bytes written, and only a load that checked the file may trust
// a row.
func TestPassthroughRowChangedBeforeRenameNotServedFromIt(t *testing.T) {
	m := newPassthroughMount(t, 5)
	for i := 1; i < 4; i++ {
		row := m.region.Row(i)
		fillRow(row, i)
		fd := m.openTmp(t, i)
		pwrite(t, fd, row, 0)
		copy(row[40*block.PageSize:], "changed after the write")
		if err := m.publish(t, fd, i); err != nil {
			t.Fatal(err)
		}
		block, _ := m.paths(i)
		scratch := m.region.Row(4)
		clear(scratch)
		if err := m.tier.Load(block, scratch); err == nil && !bytes.Equal(scratch, expectedRow(i)) {
			t.Fatalf("block %d loaded with success and bytes it was not written with", i)
		}
	}
}

// The kernel writes a passthrough tmp without the daemon, so nothing stops
// a writer going past its row: such a tmp can never become a block, and is
// removed at its release, leaving the store within its capacity. Renaming
// the tmp elsewhere while it is open, to write on past the store's
// accounting, is refused.
func TestPassthroughTmpBoundedByCapacity(t *testing.T) {
	const capacity = 4 << 20
	m := newPassthroughMount(t, 2, "--capacity", "4MiB")
	fd := m.openTmp(t, 1)
	row := m.region.Row(1)
	fillRow(row, 1)
	for r := range 8 * capacity / rowBytes {
		pwrite(t, fd, row, int64(r)*rowBytes)
	}
	block1, tmp := m.paths(1)
	if err := os.Rename(tmp, filepath.Join(filepath.Dir(tmp), "elsewhere")); !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("renaming a tmp file still open for writing to another name: %v, want EBUSY", err)
	}
	if err := unix.Close(fd); err != nil {
		t.Fatal(err)
	}
	storeTmp := filepath.Join(m.store, strings.TrimPrefix(tmp, m.d.Mountpoint))
	for i := 0; exists(storeTmp); i++ { // the kernel releases the file after close returns
		if i == 1000 {
			t.Fatalf("the tmp file written to %d bytes, past its row, is still in the store", 8*capacity)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if used := mounttest.Allocated(t, m.store); used > capacity {
		t.Fatalf("the store holds %d bytes after the release, capacity %d", used, capacity)
	}
	if !strings.Contains(m.d.Log(), "written past its tier's row size") {
		t.Errorf("the removal is not logged:\n%s", m.d.Log())
	}
	if err := os.Rename(tmp, block1); err == nil || m.tier.Exists(block1) {
		t.Fatalf("the overgrown tmp was published: %v", err)
	}
}

// exists reports whether a name exists, without following a link.
func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}
