package core_test

import (
	"bytes"
	"os"
	"testing"

	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

// passthroughDaemon mounts a store on the disk (O_DIRECT works there, unlike
// tmpfs) with a region of rows the engine stores from, and stores block 0
// through the daemon, which tells the store its tier's row size.
func passthroughDaemon(t *testing.T, rows int) (*mounttest.Daemon, [][]byte) {
	t.Helper()
	region := newRegion(t, rows)
	store, err := os.MkdirTemp("/var/tmp", "kvtierfs-passthrough-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(store) })
	d := mounttest.Start(t, mounttest.Options{Store: store, ShmGlob: region.Path})
	tier := openTier(t, d)
	storeBlock(t, tier, region.Row(0), 0)
	out := make([][]byte, rows)
	for i := range rows {
		out[i] = region.Row(i)
	}
	return d, out
}

// A store's bytes are written by the kernel straight into the tmp file, and
// the digest comes from the engine's row: the block loads back verified.
func TestPassthroughStoreDigestFromRow(t *testing.T) {
	d, rows := passthroughDaemon(t, 4)
	tier := openTier(t, d)
	for i := 1; i < 4; i++ {
		storeBlock(t, tier, rows[i], i)
	}
	st := d.Stats().Counters
	if st.StoresFromRow != 3 || st.StoresReadBack != 0 {
		t.Fatalf("stores from row %d, read back %d: want 3 and 0", st.StoresFromRow, st.StoresReadBack)
	}
	got := make([]byte, rowBytes)
	for i := 1; i < 4; i++ {
		clear(rows[i])
		if err := tier.Load(tier.BlockPath(tierDir, 0, hashOf(i)), rows[i]); err != nil {
			t.Fatal(err)
		}
		copy(got, rows[i])
		if !bytes.Equal(got, expectedRow(i)) {
			t.Fatalf("block %d loaded other bytes", i)
		}
	}
}
