package mount_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvtierfs/kvtierfs/integration/mounttest"
	"github.com/kvtierfs/kvtierfs/internal/testsys"
)

// TestRemountKeepsBlocks unmounts cleanly and remounts the same store: every
// block is still there with the right bytes.
func TestRemountKeepsBlocks(t *testing.T) {
	const blocks = 24
	store := t.TempDir()
	d := mounttest.Start(t, mounttest.Options{Store: store})
	tier := openTier(t, d)
	region := newRegion(t, 1)
	for i := 0; i < blocks; i++ {
		storeBlock(t, tier, region.Row(0), i)
	}
	if err := d.Stop(); err != nil {
		t.Fatalf("daemon exit after SIGTERM: %v, want status 0", err)
	}

	d = mounttest.Start(t, mounttest.Options{Store: store})
	tier = openTier(t, d)
	if st := d.Stats(); st.Disk.Blocks != blocks {
		t.Fatalf("after remount: %d blocks indexed, want %d", st.Disk.Blocks, blocks)
	}
	for i := 0; i < blocks; i++ {
		if err := tier.Load(tier.BlockPath(tierDir, 0, hashOf(i)), region.Row(0)); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(region.Row(0), expectedRow(i)) {
			t.Fatalf("block %d differs after remount", i)
		}
	}
}

// TestKill9DuringStoreStorm kills the daemon while 8 threads store, remounts
// the same store, and checks that no block is ever served with wrong bytes and
// that no tmp file survives.
func TestKill9DuringStoreStorm(t *testing.T) {
	store := t.TempDir()
	d := mounttest.Start(t, mounttest.Options{Store: store})
	tier := openTier(t, d)
	region := newRegion(t, 8)

	var next, stored atomic.Int64
	var killed atomic.Bool
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !killed.Load() {
				i := int(next.Add(1))
				fillRow(region.Row(w), i)
				_, err := tier.Store(tier.BlockPath(tierDir, 0, hashOf(i)), region.Row(w))
				// Once the dead mount is detached, paths reach the empty
				// directory below it: only stores finished before the kill count.
				if err != nil || killed.Load() {
					return
				}
				stored.Add(1)
			}
		}()
	}
	for stored.Load() < 40 {
		if !d.Running() {
			t.Fatal("daemon died before the kill")
		}
		time.Sleep(time.Millisecond)
	}
	killed.Store(true)
	d.Kill9()
	wg.Wait()
	issued := int(next.Load())

	d = mounttest.Start(t, mounttest.Options{Store: store})
	tier = openTier(t, d)
	tmps, _ := filepath.Glob(filepath.Join(store, tierDir, "*", "*", "*.tmp"))
	if len(tmps) != 0 {
		t.Fatalf("tmp files survived the remount: %v", tmps)
	}
	row := region.Row(0)
	present := 0
	for i := 1; i <= issued; i++ {
		path := tier.BlockPath(tierDir, 0, hashOf(i))
		if !tier.Exists(path) {
			continue
		}
		present++
		if err := tier.Load(path, row); err != nil {
			t.Fatalf("block %d answered present but failed to load: %v", i, err)
		}
		if !bytes.Equal(row, expectedRow(i)) {
			t.Fatalf("block %d served with wrong bytes after kill -9", i)
		}
	}
	if present < int(stored.Load()) {
		t.Fatalf("%d blocks present after remount, but %d stores had completed before the kill", present, stored.Load())
	}
	if c := d.Stats().Counters; c.ChecksumFailures != 0 || c.BlocksChangedOutside != 0 {
		t.Fatalf("%d checksum failures, %d blocks changed outside after kill -9: a completed rename lost bytes", c.ChecksumFailures, c.BlocksChangedOutside)
	}
}

// TestCorruptBlockGivesEIO flips one byte of a stored block in the store
// directory: the engine's read fails with EIO (the open only starts the
// store read; the read request that completes the block waits for its
// checksum), the failure is counted as a block changed outside the daemon
// (not a checksum failure: the disk is not at fault) and the block is gone;
// other blocks are unaffected.
func TestCorruptBlockGivesEIO(t *testing.T) {
	for _, withRegion := range []bool{false, true} {
		name := map[bool]string{false: "no region", true: "with the engine's region"}[withRegion]
		t.Run(name, func(t *testing.T) {
			region := newRegion(t, 2)
			opts := mounttest.Options{}
			if withRegion {
				opts.ShmGlob = region.Path
			}
			d := mounttest.Start(t, opts)
			tier := openTier(t, d)
			bad := storeBlock(t, tier, region.Row(0), 1)
			good := storeBlock(t, tier, region.Row(0), 2)
			flipByte(t, filepath.Join(d.Store, strings.TrimPrefix(bad, d.Mountpoint)), 12345)

			copy(region.Row(1), bytes.Repeat([]byte{0xAA}, rowBytes))
			err := tier.Load(bad, region.Row(1))
			if !errors.Is(err, syscall.EIO) {
				t.Fatalf("load of a corrupt block: %v, want EIO", err)
			}
			if strings.HasPrefix(strings.TrimPrefix(err.Error(), "load "+bad+": "), "close") {
				t.Fatalf("load of a corrupt block failed with %v, want the failure at the read", err)
			}
			st := d.Stats()
			if c := st.Counters; c.BlocksChangedOutside != 1 || c.ChecksumFailures != 0 || st.Disk.Blocks != 1 {
				t.Fatalf("after corruption in the store tree: %d blocks changed outside, %d checksum failures, %d blocks; want 1, 0 and 1",
					c.BlocksChangedOutside, c.ChecksumFailures, st.Disk.Blocks)
			}
			if !d.WaitLog("corrupt block removed") {
				t.Fatal("the corrupt block's path was not logged")
			}
			// The kernel may answer from its entry cache for up to its
			// lifetime (1 s) before the daemon's invalidation lands.
			for start := time.Now(); tier.Exists(bad); time.Sleep(20 * time.Millisecond) {
				if time.Since(start) > 3*time.Second {
					t.Fatal("the corrupt block still answers lookups 3 s after it was removed")
				}
			}
			if err := tier.Load(good, region.Row(1)); err != nil || !bytes.Equal(region.Row(1), expectedRow(2)) {
				t.Fatalf("an intact block was affected: %v", err)
			}
			if len(st.Warnings) != 1 || st.Warnings[0].Code != "changed_outside" {
				t.Fatalf("stat warnings %+v, want a changed_outside warning only (no checksum_failures sending the operator to the disk)", st.Warnings)
			}
		})
	}
}

// flipByte inverts one bit of a file in place.
func flipByte(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := []byte{0}
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x40
	testsys.UntilChangeTimeMoves(t, path, func() {
		if _, err := f.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
	})
}
