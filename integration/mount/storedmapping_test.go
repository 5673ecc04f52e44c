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

// TestBlockStoredIntoMemoryIsProvenAtStoreThroughTheMount stores two blocks
// through the daemon into a store on a tmpfs of its own: the first's first
// load is served from the mapping kept from its store, unchecked
// (loads_proven_at_store); the second's store file is changed by another
// process between its store and its load, as the engine's uid can, so its
// load checks it, and vLLM's C loader, which ignores close errors, sees its
// read fail with EIO; the block is dropped.
func TestBlockStoredIntoMemoryIsProvenAtStoreThroughTheMount(t *testing.T) {
	dir := t.TempDir()
	if err := unix.Mount("kvtier-test", dir, "tmpfs", 0, "size=256m"); err != nil {
		t.Fatalf("mounting a tmpfs for the store: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmounting the store's tmpfs: %v", err)
		}
	})
	d := mounttest.Start(t, mounttest.Options{Store: dir})
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
