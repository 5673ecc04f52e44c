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
// in a directory of the engine's user, which renames it away once the
// daemon, past its checks of the mountpoint, opens the store to index it,
// and puts a link to a root directory (standing for /etc) in its place. Main's root daemon mounted the engine's store over
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
	// Files to index, so that the swap, made when the store is opened, is
	// done before the daemon reaches the mount.
	for i := range 2000 {
		if err := os.WriteFile(filepath.Join(store, "f"+strconv.Itoa(i)), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// The daemon guards the directory it opened (immutable): lifted for the cleanup.
	t.Cleanup(func() { exec.Command("chattr", "-i", mnt, mnt+".old").Run() })
	if line := startHelperAs(t, engine, helper, "swap-on-open", store, mnt, victim); line != "watching" {
		t.Fatalf("the engine's swap: %q", line)
	}

	log := mountRefusedAway(t, victim, "mount", mnt, "--store", store, "--allow-other",
		"--engine-uid", strconv.Itoa(engine.uid), "--metrics-addr", "")
	if !strings.Contains(log, "was replaced while the daemon started") {
		t.Errorf("the daemon's failure does not name the replaced mountpoint:\n%s", log)
	}
}

// TestMountpointThroughAnotherUsersLinkIsRefused: the mountpoint's path
// passes through a link the engine's user made in its directory, to a
// directory of root's holding one of the mountpoint's name (/mnt, for
// .../mnt and a link to /). Main's daemon guarded and mounted over root's;
// it must refuse, naming the link.
func TestMountpointThroughAnotherUsersLinkIsRefused(t *testing.T) {
	engine := newUser(t, "eng")
	dir := sharedDir(t)
	parent, roots, store := filepath.Join(dir, "engine"), filepath.Join(dir, "roots"), filepath.Join(dir, "store")
	victim := filepath.Join(roots, "mnt")
	for _, d := range []string{parent, roots, victim, store} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{parent, store} {
		if err := os.Chown(d, engine.uid, engine.gid); err != nil {
			t.Fatal(err)
		}
	}
	link := filepath.Join(parent, "x")
	if err := os.Symlink(roots, link); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(link, engine.uid, engine.gid); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { exec.Command("chattr", "-i", victim).Run() })
	log := mountRefusedAway(t, victim, "mount", filepath.Join(link, "mnt"), "--store", store, "--allow-other",
		"--engine-uid", strconv.Itoa(engine.uid), "--metrics-addr", "")
	if !strings.Contains(log, link+", a link of uid "+strconv.Itoa(engine.uid)) {
		t.Errorf("the daemon's failure does not name the engine's link:\n%s", log)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(victim, &st); err != nil || st.Uid != 0 || st.Mode&0o777 != 0o755 {
		t.Errorf("root's directory behind the link: %+v, %v; want it untouched (root, 755)", st, err)
	}
}

// TestMissingMountpointIsNotMadeThroughAnotherUsersLink: the mountpoint's
// path does not exist yet below a link the engine's user made in its
// directory, to a directory of root's. Main's daemon made the missing
// directories (os.MkdirAll follows links) in root's directory before it
// refused the link; it must refuse, naming the link, and make nothing.
func TestMissingMountpointIsNotMadeThroughAnotherUsersLink(t *testing.T) {
	engine := newUser(t, "eng")
	dir := sharedDir(t)
	parent, roots, store := filepath.Join(dir, "engine"), filepath.Join(dir, "roots"), filepath.Join(dir, "store")
	for _, d := range []string{parent, roots, store} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{parent, store} {
		if err := os.Chown(d, engine.uid, engine.gid); err != nil {
			t.Fatal(err)
		}
	}
	link := filepath.Join(parent, "x")
	if out, ok := as(engine, nil, "ln", "-s", roots, link); !ok {
		t.Fatalf("the engine's link: %s", out)
	}
	made := filepath.Join(roots, "made")
	t.Cleanup(func() { exec.Command("chattr", "-i", filepath.Join(made, "mnt")).Run() })
	log := mountRefusedAway(t, filepath.Join(made, "mnt"), "mount", filepath.Join(link, "made", "mnt"), "--store", store, "--allow-other",
		"--engine-uid", strconv.Itoa(engine.uid), "--metrics-addr", "")
	if !strings.Contains(log, link+", a link of uid "+strconv.Itoa(engine.uid)) {
		t.Errorf("the daemon's failure does not name the engine's link:\n%s", log)
	}
	if entries, err := os.ReadDir(roots); err != nil || len(entries) > 0 {
		t.Errorf("root's directory behind the link holds %v (%v); want nothing made there", entries, err)
	}
}

// mountRefusedAway runs kvtierfs with args, expecting it to fail without
// mounting over victim; it returns the daemon's output. A daemon that
// mounts there is stopped, the mount removed, and the test failed.
func mountRefusedAway(t *testing.T, victim string, args ...string) string {
	t.Helper()
	var log bytes.Buffer
	daemon := exec.Command(mounttest.Binary(), args...)
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
			if err == nil {
				t.Errorf("the daemon ended without an error:\n%s", log.String())
			}
			if mountedOverVictim() {
				exec.Command("umount", "-l", victim).Run()
				t.Errorf("the daemon left a mount over %s", victim)
			}
			return log.String()
		default:
		}
		if mountedOverVictim() || time.Now().After(deadline) {
			daemon.Process.Signal(syscall.SIGTERM)
			<-exited
			exec.Command("umount", "-l", victim).Run()
			t.Fatalf("the daemon mounted over %s (or never ended):\n%s", victim, log.String())
		}
	}
}
