package access_test

import (
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

// TestUnservedMountpointRefusesEngine stops a daemon and stores a block as
// the engine does into the bare mountpoint (a directory of the engine's
// user), as root and as that user: both fail and nothing lands on the
// mountpoint's disk; a new daemon then mounts there again.
func TestUnservedMountpointRefusesEngine(t *testing.T) {
	engine := newUser(t, "eng")
	dir := sharedDir(t)
	helper, _ := binaries(t, dir)
	// The engine's own directory, as an operator might prepare it for the
	// engine: without the daemon's guard, the engine could write into it.
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(mnt, engine.uid, engine.gid); err != nil {
		t.Fatal(err)
	}
	args := []string{"--allow-other", "--engine-uid", strconv.Itoa(engine.uid)}
	d := mounttest.Start(t, mounttest.Options{Mountpoint: mnt, Args: args})
	if out, ok := helperAs(engine, helper, "store", mnt, hashOf(1)); !ok {
		t.Fatalf("the engine cannot store through the mount: %s", out)
	}
	if err := syscall.Kill(d.Pid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for d.Running() {
		time.Sleep(20 * time.Millisecond)
	}

	if out, ok := helperAs(engine, helper, "store", mnt, hashOf(2)); ok {
		t.Errorf("the engine's user stored into the mountpoint while no daemon served it: %s", out)
	}
	if err := storeOne(mnt, hashOf(3)); err == nil {
		t.Error("root stored into the mountpoint while no daemon served it")
	}
	entries, err := os.ReadDir(mnt)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) > 0 {
		t.Errorf("the bare mountpoint holds %d entries (first %s): writes reached the root disk", len(entries), entries[0].Name())
	}

	again := mounttest.Start(t, mounttest.Options{Mountpoint: mnt, Store: d.Store, Args: args})
	if st := again.Stats(); st.Disk.Blocks != 1 {
		t.Errorf("the daemon mounted again serves %d blocks, want the 1 stored before", st.Disk.Blocks)
	}
}
