package mount_test

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/integration/engineio"
	"github.com/kvtierfs/kvtierfs/integration/mounttest"
	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// Rows below --passthrough-min-row are written through the daemon (DESIGN.md
// "The store"): it sums the bytes as they arrive, so the rename reads
// nothing back and scans no row, and it writes them O_DIRECT when the
// engine asked for O_DIRECT.

// smallRowMount is a mount whose 256 KiB rows are below --passthrough-min-row,
// with a region the engine stores from and block 0 stored.
func smallRowMount(t *testing.T, rows int) *passthroughMount {
	t.Helper()
	m := &passthroughMount{region: newRegion(t, rows), store: t.TempDir()}
	m.d = mounttest.Start(t, mounttest.Options{Store: m.store, ShmGlob: m.region.Path,
		Args: []string{"--passthrough-min-row", "512KiB"}})
	m.tier = openTier(t, m.d)
	storeBlock(t, m.tier, m.region.Row(0), 0)
	return m
}

// vLLM's store, with its exact open flags and tmp name, of rows below the
// threshold: no probe, no row scan, no read-back, nothing of an O_DIRECT
// store left in the page cache (a buffered one's pages are, as on the bare
// directory), and the blocks load back whole through loaders that honour
// close errors and through vLLM's C loader that ignores them.
func TestSmallRowsStoreThroughTheDaemon(t *testing.T) {
	m := smallRowMount(t, 5)
	for i := 1; i < 3; i++ {
		storeBlock(t, m.tier, m.region.Row(i), i)
		if d, want := m.recordedDigest(t, i), block.DigestOf(expectedRow(i)); d.CRC != want.CRC || d.Size != want.Size {
			t.Fatalf("block %d recorded crc %08x size %d, its bytes' %08x size %d", i, d.CRC, d.Size, want.CRC, want.Size)
		}
		if n := residentPages(t, m.storeFile(i)); n != 0 {
			t.Errorf("block %d, stored O_DIRECT: %d of its pages are in the page cache", i, n)
		}
	}
	buffered := &engineio.Tier{Root: m.tier.Root}
	storeBlock(t, buffered, m.region.Row(3), 3)
	m.recordedDigest(t, 3)
	if n := residentPages(t, m.storeFile(3)); n == 0 {
		t.Error("a buffered store left none of its pages in the page cache: the residency check sees nothing")
	}
	c := m.d.Stats().Counters
	if c.StoresFromRow != 0 || c.StoresReadBack != 0 || c.WriteBytes != 4*rowBytes {
		t.Fatalf("stores from a row %d, read back %d, %d bytes written through the daemon; want 0, 0 and %d",
			c.StoresFromRow, c.StoresReadBack, c.WriteBytes, 4*rowBytes)
	}
	phases := m.d.Stats().Disk.StorePhases
	if n := phases["rename_probe"].Count + phases["create_reserve"].Count; n != 0 {
		t.Errorf("%d probes or passthrough reservations timed for rows below the threshold", n)
	}
	if got := phases["rename"].Count; got != 4 {
		t.Errorf("%d renames timed, want 4", got)
	}
	scratch := m.region.Row(4)
	for i := 1; i < 4; i++ {
		m.loadsBack(t, i, scratch, expectedRow(i))
		path, _ := m.paths(i)
		clear(scratch)
		if err := m.tier.LoadIgnoringClose(path, scratch); err != nil || !bytes.Equal(scratch, expectedRow(i)) {
			t.Fatalf("block %d through the loader that ignores close errors: %v, bytes equal %v", i, err, bytes.Equal(scratch, expectedRow(i)))
		}
	}
}

// A row half zero (another node's slot) written through the daemon
// O_DIRECT leaves its zero half a hole and loads back whole.
func TestSmallRowHalfZeroIsAHole(t *testing.T) {
	m := smallRowMount(t, 3)
	row := m.region.Row(1)
	fillRow(row, 1)
	clear(row[rowBytes/2:])
	want := bytes.Clone(row)
	if _, err := m.tier.Store(m.tier.BlockPath(tierDir, 0, hashOf(1)), row); err != nil {
		t.Fatal(err)
	}
	m.recordedDigest(t, 1)
	var st unix.Stat_t
	if err := unix.Stat(m.storeFile(1), &st); err != nil {
		t.Fatal(err)
	}
	if allocated := st.Blocks * 512; allocated > rowBytes/2+16<<10 {
		t.Fatalf("store file allocates %d bytes for a row half zero (%d bytes of data)", allocated, rowBytes/2)
	}
	if n := residentPages(t, m.storeFile(1)); n != 0 {
		t.Errorf("%d pages of an O_DIRECT store are in the page cache", n)
	}
	m.loadsBack(t, 1, m.region.Row(2), want)
}

// A row the engine changes after its write and before the rename: the
// daemon summed the bytes it wrote, so the block is those bytes, proven,
// and neither kind of loader ever gets the changed row, though the region
// still holds it.
func TestSmallRowChangedBeforeRename(t *testing.T) {
	m := smallRowMount(t, 5)
	for i := 1; i < 4; i++ {
		row := m.region.Row(i)
		fillRow(row, i)
		path, _ := m.paths(i)
		tmp, fd := vllmTmp(t, path)
		if n, err := unix.Write(fd, row); err != nil || n != len(row) {
			t.Fatalf("block %d: write %d, %v", i, n, err)
		}
		copy(row[(i*13%64)*block.PageSize:], "changed after the write")
		if err := unix.Close(fd); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatalf("block %d: rename: %v", i, err)
		}
		scratch := m.region.Row(4)
		clear(scratch)
		if err := m.tier.LoadIgnoringClose(path, scratch); err != nil || !bytes.Equal(scratch, expectedRow(i)) {
			t.Fatalf("block %d through the loader that ignores close errors: %v, the written bytes %v", i, err, bytes.Equal(scratch, expectedRow(i)))
		}
		m.loadsBack(t, i, scratch, expectedRow(i))
	}
	if c := m.d.Stats().Counters; c.ChecksumFailures != 0 || c.StoresFromRow != 0 {
		t.Fatalf("%d checksum failures, %d stores from a row; want none", c.ChecksumFailures, c.StoresFromRow)
	}
}

// vllmTmp creates a tmp for block path as vLLM's C store does: `dest +
// "_<random63>.tmp"`, O_CREAT|O_EXCL|O_WRONLY|O_TRUNC|O_DIRECT.
func vllmTmp(t *testing.T, path string) (tmp string, fd int) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	tmp = path + "_" + strconv.FormatUint(rand.Uint64()>>1, 10) + ".tmp"
	fd, err := unix.Open(tmp, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_TRUNC|unix.O_DIRECT|unix.O_CLOEXEC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	return tmp, fd
}
