package access_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvtierfs/kvtierfs/fusefs/mountinfo"
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

// TestSwappedMountpointIsNotMountedOver: the operator put the mountpoint
// in a directory of the engine's user, which renames it away while the
// daemon indexes the store and puts a link to a root directory (standing
// for /etc) in its place. Main's root daemon mounted the engine's store over
// that directory, the engine's files then in root's; the daemon must fail
// and mount nothing there.
func TestSwappedMountpointIsNotMountedOver(t *testing.T) {
	engine := newUser(t, "eng")
	dir := sharedDir(t)
	helper, _ := binaries(t, dir)
	parent, victim, store := filepath.Join(dir, "engine"), filepath.Join(dir, "victim"), filepath.Join(dir, "store")
	mnt := filepath.Join(parent, "mnt")
	for _, d := range []string{parent, mnt, victim, store} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{parent, mnt, store} {
		if err := os.Chown(d, engine.uid, engine.gid); err != nil {
			t.Fatal(err)
		}
	}
	// The daemon guards the directory it opened (immutable): lifted for the cleanup.
	t.Cleanup(func() { exec.Command("chattr", "-i", mnt, mnt+".old").Run() })
	if line := startHelperAs(t, engine, helper, "swap-on-open", mnt, victim); line != "watching" {
		t.Fatalf("the engine's swap: %q", line)
	}

	var log bytes.Buffer
	daemon := exec.Command(mounttest.Binary(), "mount", mnt, "--store", store, "--allow-other",
		"--engine-uid", strconv.Itoa(engine.uid), "--metrics-addr", "")
	daemon.Stdout, daemon.Stderr = &log, &log
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- daemon.Wait() }()
	mountedOverVictim := func() bool {
		mounts, err := mountinfo.Read("self")
		return err == nil && len(mountinfo.At(mounts, victim)) > 0
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		select {
		case err := <-exited:
			if err == nil || !strings.Contains(log.String(), "was replaced while the daemon started") {
				t.Errorf("the daemon: %v, want a failure naming the replaced mountpoint:\n%s", err, log.String())
			}
			if mountedOverVictim() {
				t.Errorf("the daemon left a mount over %s", victim)
				exec.Command("umount", "-l", victim).Run()
			}
			return
		default:
		}
		if mountedOverVictim() || time.Now().After(deadline) {
			daemon.Process.Signal(syscall.SIGTERM)
			<-exited
			exec.Command("umount", "-l", victim).Run()
			t.Fatalf("the daemon mounted over %s, where the engine's link led (or never ended):\n%s", victim, log.String())
		}
	}
}
