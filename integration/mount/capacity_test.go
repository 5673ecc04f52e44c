package mount_test

import (
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/kvtierfs/kvtierfs/fusefs"
	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

// TestCapacityEvictsLeastRecentlyUsed stores three times the capacity: the
// store stays within it, the oldest blocks go first, and evicted blocks
// disappear from the kernel's cache at once.
func TestCapacityEvictsLeastRecentlyUsed(t *testing.T) {
	d := mounttest.Start(t, mounttest.Options{Args: []string{"--capacity", "4MiB", "--lookup-protect", "1ms"}})
	tier := openTier(t, d)
	region := newRegion(t, 1)

	first := storeBlock(t, tier, region.Row(0), 0)
	// A block occupies its row plus the filesystem's metadata (the checksum xattr).
	capacityBlocks := int(4<<20) / int(d.Stats().Disk.PhysicalBytes)
	if !tier.Exists(first) {
		t.Fatal("first block absent right after its store")
	}
	// Let its protection lapse: --lookup-protect plus the kernel's entry cache lifetime.
	time.Sleep(fusefs.DefaultEntryTimeout + 10*time.Millisecond)
	for i := 1; i < 3*capacityBlocks; i++ {
		storeBlock(t, tier, region.Row(0), i)
		if st := d.Stats(); st.Disk.PhysicalBytes > st.Disk.CapacityBytes {
			t.Fatalf("after block %d: %d bytes stored, capacity %d", i, st.Disk.PhysicalBytes, st.Disk.CapacityBytes)
		}
	}
	st := d.Stats()
	if st.Disk.CapacityBytes != 4<<20 || st.Disk.Blocks != int64(capacityBlocks) || st.Disk.Evictions != int64(2*capacityBlocks) {
		t.Fatalf("capacity %d, %d blocks, %d evictions; want %d, %d, %d",
			st.Disk.CapacityBytes, st.Disk.Blocks, st.Disk.Evictions, 4<<20, capacityBlocks, 2*capacityBlocks)
	}
	for i := 0; i < 3*capacityBlocks; i++ {
		want := i >= 2*capacityBlocks
		if got := tier.Exists(tier.BlockPath(tierDir, 0, hashOf(i))); got != want {
			t.Fatalf("block %d present=%v, want %v (least recently used first)", i, got, want)
		}
	}
}

// TestCapacityProtectsLookedUpBlocks fills the store with blocks that answered
// a lookup: they are protected, so the next store fails with ENOSPC, leaves
// nothing behind, and the daemon keeps serving.
func TestCapacityProtectsLookedUpBlocks(t *testing.T) {
	d := mounttest.Start(t, mounttest.Options{Args: []string{"--capacity", "2MiB", "--lookup-protect", "1h"}})
	tier := openTier(t, d)
	region := newRegion(t, 2)
	capacityBlocks := 0
	for i := 0; ; i++ {
		st := d.Stats()
		if st.Disk.Blocks > 0 && st.Disk.FreeBytes < st.Disk.PhysicalBytes/st.Disk.Blocks {
			break
		}
		capacityBlocks++
		path := storeBlock(t, tier, region.Row(0), i)
		if !tier.Exists(path) {
			t.Fatalf("block %d absent after store", i)
		}
	}
	fillRow(region.Row(0), 100)
	_, err := tier.Store(tier.BlockPath(tierDir, 0, hashOf(100)), region.Row(0))
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("store into a store full of protected blocks: %v, want ENOSPC", err)
	}
	st := d.Stats()
	if st.Disk.Blocks != int64(capacityBlocks) || st.Disk.Evictions != 0 || st.Counters.NoSpace == 0 || st.Disk.InFlightTmp != 0 {
		t.Fatalf("after ENOSPC: %d blocks, %d evictions, %d no-space, %d tmp files; want %d, 0, >0, 0",
			st.Disk.Blocks, st.Disk.Evictions, st.Counters.NoSpace, st.Disk.InFlightTmp, capacityBlocks)
	}
	if tier.Exists(tier.BlockPath(tierDir, 0, hashOf(100))) {
		t.Fatal("the refused block is visible")
	}
	for i := 0; i < capacityBlocks; i++ {
		if err := tier.Load(tier.BlockPath(tierDir, 0, hashOf(i)), region.Row(1)); err != nil {
			t.Fatalf("protected block %d after ENOSPC: %v", i, err)
		}
	}
}
