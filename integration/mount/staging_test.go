package mount_test

import (
	"bytes"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/kvtierfs/kvtierfs/integration/engineio"
	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

// TestStagingStreamsAChain looks a chain of 64 blocks up in prefix order, as
// the engine's lookup thread does, then loads it in order through a staging
// budget of 8 blocks: most loads are served from staging, the budget holds,
// and every byte is right.
func TestStagingStreamsAChain(t *testing.T) {
	const blocks = 64
	region := newRegion(t, 2)
	d := mounttest.Start(t, mounttest.Options{ShmGlob: region.Path, Args: []string{"--staging-bytes", "2MiB"}})
	tier := openTier(t, d)
	for i := 0; i < blocks; i++ {
		storeBlock(t, tier, region.Row(0), i)
	}
	for i := 0; i < blocks; i++ {
		if !tier.Exists(tier.BlockPath(tierDir, 0, hashOf(i))) {
			t.Fatalf("block %d absent", i)
		}
	}
	for i := 0; i < blocks; i++ {
		if err := tier.Load(tier.BlockPath(tierDir, 0, hashOf(i)), region.Row(1)); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(region.Row(1), expectedRow(i)) {
			t.Fatalf("block %d loaded with wrong bytes", i)
		}
	}
	st := d.Stats().Staging
	if st == nil || st.BudgetBytes != 2<<20 || st.Bytes > st.BudgetBytes || st.Waves == 0 || st.Hits < blocks/2 {
		t.Fatalf("staging %+v: want a 2 MiB budget held, waves, and most of %d loads served", st, blocks)
	}
}

// TestStagingNeverServesStale stages a chain, replaces one staged block by a
// new store, and loads it: the new bytes arrive, never the staged old ones.
func TestStagingNeverServesStale(t *testing.T) {
	const blocks = 16
	region, _, tier := stageChain(t, blocks, 2, 4)
	// Replace block 1 (now staged) with new bytes: tmp + rename over it.
	path := tier.BlockPath(tierDir, 0, hashOf(1))
	fillRow(region.Row(0), 1000)
	fd, err := syscall.Open(path+"_9.tmp", syscall.O_CREAT|syscall.O_EXCL|syscall.O_WRONLY|syscall.O_DIRECT, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := syscall.Write(fd, region.Row(0)); err != nil {
		t.Fatal(err)
	}
	syscall.Close(fd)
	if err := os.Rename(path+"_9.tmp", path); err != nil {
		t.Fatal(err)
	}
	if err := tier.Load(path, region.Row(1)); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(region.Row(1), expectedRow(1000)) {
		t.Fatal("a replaced block was served from its stale staged copy")
	}
	for i := 2; i < blocks; i++ {
		if err := tier.Load(tier.BlockPath(tierDir, 0, hashOf(i)), region.Row(1)); err != nil || !bytes.Equal(region.Row(1), expectedRow(i)) {
			t.Fatalf("block %d: %v", i, err)
		}
	}
}

// TestStagedLoadOverlapsALoadOfTheSameBlock opens a staged block for a load
// (served from memory) and, before closing it, opens the same block again
// (not staged any more, so read from the store): the kernel refuses to mix
// passthrough and cached opens of one inode, so the second load must take a
// third way rather than fail. Both loads return the block's bytes.
func TestStagedLoadOverlapsALoadOfTheSameBlock(t *testing.T) {
	const blocks = 8
	region, d, tier := stageChain(t, blocks, 3, blocks-1)
	hits := d.Stats().Staging.Hits
	path := tier.BlockPath(tierDir, 0, hashOf(3))
	var fds []int
	t.Cleanup(func() { // a failing test leaves no mount busy
		for _, fd := range fds {
			if fd >= 0 {
				syscall.Close(fd)
			}
		}
	})
	for range 2 {
		fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_DIRECT, 0)
		if err != nil {
			t.Fatalf("open %d of a block already open for a load: %v", len(fds)+1, err)
		}
		fds = append(fds, fd)
	}
	if got := d.Stats().Staging.Hits - hits; got != 1 {
		t.Fatalf("%d of the two opens were served from staging, want the first", got)
	}
	for i, fd := range fds {
		row := region.Row(1 + i)
		clear(row)
		if n, err := syscall.Read(fd, row); err != nil || n != rowBytes {
			t.Fatalf("load %d: read %d bytes, %v", i+1, n, err)
		}
		if !bytes.Equal(row, expectedRow(3)) {
			t.Fatalf("load %d returned wrong bytes", i+1)
		}
	}
	for i, fd := range fds {
		fds[i] = -1
		if err := syscall.Close(fd); err != nil {
			t.Fatalf("close of load %d: %v", i+1, err)
		}
	}
}

// stageChain stores a chain of n blocks through a mount with an 8 MiB
// staging budget (from row 0 of a region of regionRows rows), looks it up
// in order, loads block 0 into row 1 and waits until at least staged
// blocks are staged.
func stageChain(t *testing.T, n, regionRows, staged int) (*engineio.Region, *mounttest.Daemon, *engineio.Tier) {
	t.Helper()
	region := newRegion(t, regionRows)
	d := mounttest.Start(t, mounttest.Options{ShmGlob: region.Path, Args: []string{"--staging-bytes", "8MiB"}})
	tier := openTier(t, d)
	for i := 0; i < n; i++ {
		storeBlock(t, tier, region.Row(0), i)
	}
	for i := 0; i < n; i++ {
		tier.Exists(tier.BlockPath(tierDir, 0, hashOf(i)))
	}
	if err := tier.Load(tier.BlockPath(tierDir, 0, hashOf(0)), region.Row(1)); err != nil {
		t.Fatal(err)
	}
	for start := time.Now(); d.Stats().Staging.Bytes < int64(staged*rowBytes); time.Sleep(10 * time.Millisecond) {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("the chain was not staged after its first load: %+v", d.Stats().Staging)
		}
	}
	return region, d, tier
}
