package mount_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/integration/engineio"
	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

// mountTmpfs mounts a tmpfs of the test's own in a temp directory, unmounted
// after the test (and after a daemon started later stopped).
func mountTmpfs(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("kvtier-test", dir, "tmpfs", 0, "size=256m"); err != nil {
		t.Fatalf("mounting a tmpfs for the store: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmounting the store's tmpfs: %v", err)
		}
	})
	return dir
}

// TestBlockStoredIntoMemoryIsProvenAtStoreThroughTheMount stores two blocks
// through the daemon into a store on a tmpfs of its own: the first's first
// load is served from the mapping kept from its store, unchecked
// (loads_proven_at_store); the second's store file is changed by another
// process between its store and its load, as the engine's uid can, so its
// load checks it, and vLLM's C loader, which ignores close errors, sees its
// read fail with EIO; the block is dropped.
func TestBlockStoredIntoMemoryIsProvenAtStoreThroughTheMount(t *testing.T) {
	d := mounttest.Start(t, mounttest.Options{Store: mountTmpfs(t)})
	tier := openTier(t, d)
	const size = 2 << 20
	row := alignedRow(t, size)
	var paths []string
	var wants [][]byte
	for i := range 2 {
		engineio.FillPattern(row, uint64(20+i))
		path := tier.BlockPath(tierDir, 0, hashOf(20+i))
		if _, err := tier.Store(path, row); err != nil {
			t.Fatal(err)
		}
		paths, wants = append(paths, path), append(wants, bytes.Clone(row))
	}
	buf := alignedRow(t, size)
	if err := tier.LoadIgnoringClose(paths[0], buf); err != nil || !bytes.Equal(buf, wants[0]) {
		t.Fatalf("first load of an unchanged block: %v, bytes equal %v", err, bytes.Equal(buf, wants[0]))
	}
	if c := d.Stats().Counters; c.LoadsProvenAtStore != 1 || c.LoadsInPlace != 1 {
		t.Fatalf("loads proven at store %d, in place %d; want 1, 1", c.LoadsProvenAtStore, c.LoadsInPlace)
	}

	onStore := filepath.Join(d.Store, strings.TrimPrefix(paths[1], d.Mountpoint))
	changeByte := exec.Command("sh", "-c", fmt.Sprintf(`printf '\377' | dd of=%s bs=1 seek=%d conv=notrunc status=none`, onStore, size/2))
	if out, err := changeByte.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", changeByte, err, out)
	}
	if err := tier.LoadIgnoringClose(paths[1], buf); !errors.Is(err, syscall.EIO) {
		t.Fatalf("load of the block changed in the store: %v, want EIO", err)
	}
	if c := d.Stats().Counters; c.LoadsProvenAtStore != 1 {
		t.Fatalf("loads proven at store %d after the changed block's load, want 1", c.LoadsProvenAtStore)
	}
	if _, err := os.Stat(onStore); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the changed block is still in the store (%v)", err)
	}
}

// TestPassthroughIntoMemoryIsProvenAtStore passes rows through to a store on
// a tmpfs of its own: each rename sums the file itself, mapped under a read
// lease taken once the kernel released it (counted as read back), so the
// first load of a row without zero pages is served from that mapping,
// unchecked, even after another process read the block's store file (as the
// bare side of bench disk does: a read breaks no read lease); a row half zero has its zero pages punched and is checked at
// its load; a byte another process changes in a store file between its store
// and its load (no row holding the block any more) fails that load with EIO
// and drops the block.
func TestPassthroughIntoMemoryIsProvenAtStore(t *testing.T) {
	m := newPassthroughMountAt(t, mountTmpfs(t), 5)
	for i := 1; i < 4; i++ {
		row := m.region.Row(i)
		fillRow(row, i)
		if i == 3 {
			clear(row[rowBytes/2:])
		}
		if _, err := m.tier.Store(m.tier.BlockPath(tierDir, 0, hashOf(i)), row); err != nil {
			t.Fatal(err)
		}
	}
	if c := m.d.Stats().Counters; c.StoresReadBack != 3 || c.StoresFromRow != 0 {
		t.Fatalf("%d stores read back, %d from a row; want 3, 0", c.StoresReadBack, c.StoresFromRow)
	}
	if got, err := os.ReadFile(m.storeFile(1)); err != nil || !bytes.Equal(got, expectedRow(1)) {
		t.Fatalf("reading block 1's store file: %v", err)
	}
	scratch := m.region.Row(4)
	m.loadsBack(t, 1, scratch, expectedRow(1))
	if c := m.d.Stats().Counters; c.LoadsProvenAtStore != 1 {
		t.Fatalf("loads proven at store %d, want 1", c.LoadsProvenAtStore)
	}
	halfZero := expectedRow(3)
	clear(halfZero[rowBytes/2:])
	m.loadsBack(t, 3, scratch, halfZero)
	if c := m.d.Stats().Counters; c.LoadsProvenAtStore != 1 || c.LoadsInPlace != 1 {
		t.Fatalf("loads proven at store %d, in place %d after the half-zero row's; want 1, 1 (its holes are copied)", c.LoadsProvenAtStore, c.LoadsInPlace)
	}
	changeByte := exec.Command("sh", "-c", fmt.Sprintf(`printf '\377' | dd of=%s bs=1 seek=%d conv=notrunc status=none`, m.storeFile(2), rowBytes/2))
	if out, err := changeByte.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", changeByte, err, out)
	}
	fillRow(m.region.Row(2), 9) // no row holds the block, which a load would copy
	block, _ := m.paths(2)
	if err := m.tier.LoadIgnoringClose(block, scratch); !errors.Is(err, syscall.EIO) {
		t.Fatalf("load of the block changed in the store: %v, want EIO", err)
	}
	if _, err := os.Stat(m.storeFile(2)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the changed block is still in the store (%v)", err)
	}
}
