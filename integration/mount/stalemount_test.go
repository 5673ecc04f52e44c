package mount_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

// TestMountRecoversFromCrashedDaemon kills a daemon with SIGKILL, leaving
// its mountpoint answering ENOTCONN: a new daemon on the same mountpoint
// and store detaches the dead mount, says so, and serves the blocks stored
// before the crash.
func TestMountRecoversFromCrashedDaemon(t *testing.T) {
	region := newRegion(t, 1)
	crashed := mounttest.Start(t, mounttest.Options{})
	path := storeBlock(t, openTier(t, crashed), region.Row(0), 1)
	rel, err := filepath.Rel(crashed.Mountpoint, path)
	if err != nil {
		t.Fatal(err)
	}

	crashed.Crash()
	if _, err := os.ReadDir(crashed.Mountpoint); !errors.Is(err, syscall.ENOTCONN) {
		t.Fatalf("listing the crashed daemon's mountpoint: %v, want ENOTCONN (the stale mount this test recovers from)", err)
	}

	d := mounttest.Start(t, mounttest.Options{Mountpoint: crashed.Mountpoint, Store: crashed.Store})
	if !strings.Contains(d.Log(), "detached the stale mount") {
		t.Errorf("the new daemon did not log the stale mount it detached:\n%s", d.Log())
	}
	row := region.Row(0)
	clear(row)
	if err := openTier(t, d).Load(d.Path(rel), row); err != nil {
		t.Fatalf("loading a block stored before the crash: %v", err)
	}
	if !bytes.Equal(row, expectedRow(1)) {
		t.Fatal("the block stored before the crash came back with other bytes")
	}
}

// TestMountRefusesLiveMount runs a second daemon on the mountpoint of a
// live one: it exits with a message naming the mount, and the first daemon
// keeps serving.
func TestMountRefusesLiveMount(t *testing.T) {
	live := mounttest.Start(t, mounttest.Options{})
	out, err := mounttest.Run("mount", live.Mountpoint, "--store", t.TempDir(), "--metrics-addr", "")
	if err == nil {
		t.Fatalf("a second daemon mounted over a live one and exited 0:\n%s", out)
	}
	for _, want := range []string{"is busy: a live daemon serves it", "kvtierfs:" + live.Store} {
		if !strings.Contains(out, want) {
			t.Errorf("refusal lacks %q:\n%s", want, out)
		}
	}
	if !live.Running() {
		t.Fatal("the live daemon died")
	}
	if st := live.Stats(); st.Mountpoint == "" {
		t.Fatal("the live daemon stopped serving its stats")
	}
}

// TestMountRefusesHungMount runs a daemon on the mountpoint of a stopped
// one (SIGSTOP): it gives up waiting for the mount to answer and exits with
// a message saying so, leaving the stopped daemon's mount alone.
func TestMountRefusesHungMount(t *testing.T) {
	hung := mounttest.Start(t, mounttest.Options{})
	if err := syscall.Kill(hung.Pid(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(hung.Pid(), syscall.SIGCONT)
	out, err := mounttest.Run("mount", hung.Mountpoint, "--store", t.TempDir(), "--metrics-addr", "")
	if err == nil || !strings.Contains(out, "does not answer statfs") {
		t.Fatalf("mount over a stopped daemon: %v\n%s", err, out)
	}
	syscall.Kill(hung.Pid(), syscall.SIGCONT)
	if st := hung.Stats(); st.Mountpoint == "" {
		t.Fatal("the stopped daemon's mount was taken over")
	}
}
