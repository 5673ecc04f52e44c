package fusefs

import (
	"os"
	"runtime"
	"testing"

	"github.com/kvtierfs/kvtierfs/tiers/disk"
)

// Mounting lowers GOMAXPROCS only while go-fuse's server is made (its bound
// on idle readers follows it): the operator's setting is the daemon's again
// once the mount is up.
func TestMountKeepsGOMAXPROCS(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipped: mounting FUSE in this process needs root")
	}
	const procs = 5
	t.Setenv("GOMAXPROCS", "5")
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
	store, err := disk.Open(disk.Config{Dir: t.TempDir(), Capacity: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	f, err := Mount(t.TempDir(), Options{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.Unmount(); err != nil {
			t.Errorf("unmount: %v", err)
		}
	})
	if got := runtime.GOMAXPROCS(0); got != procs {
		t.Fatalf("GOMAXPROCS %d after the mount, want the operator's %d", got, procs)
	}
}
