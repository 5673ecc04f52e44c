package mount_test

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

// TestSharedHostileDir: real daemons on a shared directory that another
// writer prepared: the eviction lease a FIFO, the engine's tier a link to a
// directory outside, blocks put there without the key (one with no record,
// one a sparse tebibyte). The holder takes the lease over and stays
// reachable, nothing is written through the link, and the other replica
// answers the forged blocks absent and fails their loads as misses.
func TestSharedHostileDir(t *testing.T) {
	sharedDir, outside := t.TempDir(), t.TempDir()
	if err := os.MkdirAll(filepath.Join(sharedDir, ".kvtierfs"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(sharedDir, ".kvtierfs", "evict.lease"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(sharedDir, tierDir)); err != nil {
		t.Fatal(err)
	}
	const forgedTier = "Forged_0123456789ab_r0"
	forged := func(i int) string {
		h := hashOf(i)
		return filepath.Join(forgedTier, h[:3], h[3:5]+"_g0", h+".bin")
	}
	for _, i := range []int{1, 2} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(sharedDir, forged(i))), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(sharedDir, forged(1)), expectedRow(1), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sharedDir, forged(2)), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(sharedDir, forged(2)), 1<<40); err != nil {
		t.Fatal(err)
	}
	args := []string{"--shared", sharedDir, "--shared-key-file", mounttest.SharedKeyFile(t), "--shared-capacity", "1GiB",
		"--shared-lease-ttl", "1s", "--shared-negative-ttl", "400ms", "--shared-timeout", "1s"}
	a := mounttest.Start(t, mounttest.Options{Args: args})
	waitShared(t, a, "the lease taken over from the FIFO", func(sh *ctlabi.Shared) bool { return sh.LeaseHeld })

	region := newRegion(t, 2)
	storeBlock(t, openTier(t, a), region.Row(0), 0)
	waitShared(t, a, "the write-behind tried", func(sh *ctlabi.Shared) bool { return sh.QueueBlocks == 0 && sh.BytesBehind == 0 })
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Fatalf("the daemon wrote through the tier's link: %v", entries)
	}
	st := a.Stats()
	if st.Shared.WrittenBlocks != 0 || !st.Shared.Reachable || st.Shared.Timeouts != 0 || hasWarning(st.Warnings, "shared_unreachable") {
		t.Fatalf("A beside the FIFO and the link: %+v, warnings %v", st.Shared, st.Warnings)
	}

	b := mounttest.Start(t, mounttest.Options{Args: args})
	tierB := openTier(t, b)
	for _, i := range []int{1, 2} {
		path := filepath.Join(b.Mountpoint, forged(i))
		if tierB.Exists(path) {
			t.Fatalf("forged block %d answers present", i)
		}
		if err := tierB.LoadIgnoringClose(path, region.Row(1)); !errors.Is(err, syscall.ENOENT) {
			t.Fatalf("loading forged block %d: %v, want ENOENT", i, err)
		}
	}
	if sh := b.Stats().Shared; sh.FetchedBlocks != 0 || !sh.Reachable {
		t.Fatalf("B after the forged blocks: %+v", sh)
	}
}

// TestSharedMountedAgain: the shared filesystem's client dies (a FUSE
// server killed: every call on its mount ENOTCONN) and a filesystem is
// mounted again at the same path: the daemon, which works from a descriptor
// of the directory, opens the new one and drains the blocks that waited.
func TestSharedMountedAgain(t *testing.T) {
	// Another kvtierfs mount stands for the distributed filesystem's client.
	client := mounttest.Start(t, mounttest.Options{})
	sharedDir := client.Mountpoint
	args := []string{"--shared", sharedDir, "--shared-key-file", mounttest.SharedKeyFile(t), "--shared-negative-ttl", "400ms", "--shared-timeout", "300ms"}
	a := mounttest.Start(t, mounttest.Options{Args: args})
	waitShared(t, a, "reachable", func(sh *ctlabi.Shared) bool { return sh.Reachable })

	client.Crash()
	region := newRegion(t, 1)
	tierA := openTier(t, a)
	storeBlock(t, tierA, region.Row(0), 1)
	waitShared(t, a, "unreachable once the client died", func(sh *ctlabi.Shared) bool { return !sh.Reachable && sh.BytesBehind > 0 })

	if err := unix.Unmount(sharedDir, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", sharedDir, "tmpfs", 0, "size=64m,mode=0700"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(sharedDir, unix.MNT_DETACH) })
	waitShared(t, a, "reachable and drained on the new mount", func(sh *ctlabi.Shared) bool {
		return sh.Reachable && sh.QueueBlocks == 0 && sh.BytesBehind == 0 && sh.WrittenBlocks == 1
	})
	if _, err := os.Stat(filepath.Join(sharedDir, relOf(t, tierA, a, 1))); err != nil {
		t.Fatalf("the block that waited is not on the new mount: %v", err)
	}
}
