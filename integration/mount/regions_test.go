package mount_test

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

// TestStatNamesOrphanedRegion leaves an engine region that only the daemon
// maps (its engine is gone): stat names it with its size although the
// daemon maps it, and gc-regions removes it.
func TestStatNamesOrphanedRegion(t *testing.T) {
	path := fmt.Sprintf("/dev/shm/kvtier-test-orphan-%d.mmap", os.Getpid())
	if err := os.WriteFile(path, make([]byte, 4*rowBytes), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(path) })
	d := mounttest.Start(t, mounttest.Options{ShmGlob: path})
	for deadline := time.Now().Add(30 * time.Second); len(d.Stats().Primary.Regions) == 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the daemon never found the region")
		}
	}
	out, err := mounttest.Run("stat", d.Mountpoint, "--shm-glob", path)
	if err != nil || !strings.Contains(out, "orphaned regions: 1 mapped by no process") || !strings.Contains(out, path+"  1.0 MiB") {
		t.Fatalf("stat: %v\n%s", err, out)
	}
	// gc-regions refuses when some process cannot be read (a sandbox's PID 1):
	// only check what it does when it can decide.
	out, err = mounttest.Run("gc-regions", "--shm-glob", path)
	switch {
	case err == nil && strings.Contains(out, "removed "+path):
		if _, err := os.Stat(path); err == nil {
			t.Fatal("gc-regions said it removed the region, which is still there")
		}
	case err != nil && strings.Contains(out, "no region is proven orphaned"):
		t.Logf("gc-regions could not decide here: %s", out)
	default:
		t.Fatalf("gc-regions: %v\n%s", err, out)
	}
}
