package mount_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/fusefs/mountinfo"
	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

// TestMountAsOrdinaryUser mounts as a user the test creates, through
// fusermount3: the user's stat reads the mount, root is kept out (no
// allow_other), SIGTERM unmounts, and after a kill -9 the same user mounts
// again (the dead mount detached through fusermount3 -u -z). It runs in a
// mount namespace of its own whose /dev/fuse is 0666, as distributions ship
// it (a container's may be 0600, which only root can open).
func TestMountAsOrdinaryUser(t *testing.T) {
	if _, err := exec.LookPath("fusermount3"); err != nil {
		t.Fatal("fusermount3 is missing: `make deps` installs fuse3")
	}
	u, base, binary, store, mnt := ordinaryUserTier(t, fmt.Sprintf("kvt%d", os.Getpid()))
	ns := privateFuseNamespace(t, base)
	inNS := func(args ...string) *exec.Cmd {
		return exec.Command("nsenter", append([]string{"--mount=/proc/" + ns + "/ns/mnt"}, args...)...)
	}
	asUser := func(args ...string) *exec.Cmd {
		return inNS(append([]string{"setpriv", "--reuid", u.Uid, "--regid", u.Gid, "--clear-groups", binary}, args...)...)
	}
	mounted := func() bool {
		t.Helper()
		mounts, err := mountinfo.Read(ns)
		if err != nil {
			t.Fatal(err)
		}
		return len(mountinfo.At(mounts, mnt)) > 0
	}
	mount := func() (*exec.Cmd, *lockedLog) {
		t.Helper()
		log := &lockedLog{}
		cmd := asUser("mount", mnt, "--store", store, "--metrics-addr", "", "--shm-glob", filepath.Join(base, "none-*.mmap"))
		cmd.Stdout, cmd.Stderr = log, log
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			cmd.Process.Kill()
			cmd.Wait()
			inNS("fusermount3", "-u", "-z", mnt).Run()
		})
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			// Served and logged "mounted": its start-up is over.
			out, err := asUser("stat", mnt, "--json").CombinedOutput()
			if err == nil && strings.Contains(string(out), `"mountpoint"`) && strings.Contains(log.String(), `msg=mounted`) {
				return cmd, log
			}
			if time.Now().After(deadline) {
				t.Fatalf("the user's mount did not come up:\n%s", log.String())
			}
		}
	}

	daemon, log := mount()
	if out, err := inNS("ls", mnt).CombinedOutput(); err == nil || !strings.Contains(string(out), "Permission denied") {
		t.Errorf("root listing a user's mount without allow_other: %v: %s, want permission denied", err, out)
	}
	if err := daemon.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := daemon.Wait(); err != nil {
		t.Fatalf("the user's daemon exited with %v after SIGTERM:\n%s", err, log.String())
	}
	if mounted() {
		t.Fatal("still mounted after SIGTERM")
	}

	daemon, _ = mount()
	daemon.Process.Kill()
	daemon.Wait()
	if !mounted() {
		t.Fatal("kill -9 left no dead mount to recover from")
	}
	_, log = mount()
	if !strings.Contains(log.String(), "detached the stale mount") {
		t.Errorf("the user's second daemon did not detach the dead mount:\n%s", log.String())
	}
}

// lockedLog collects a daemon's output while the test reads it.
type lockedLog struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// privateFuseNamespace starts a process in a new mount namespace whose
// /dev/fuse is a 0666 node made in dir, and returns its pid; the namespace
// ends with the test.
func privateFuseNamespace(t *testing.T, dir string) string {
	t.Helper()
	dev := filepath.Join(dir, "fuse")
	if out, err := exec.Command("mknod", "-m", "666", dev, "c", "10", "229").CombinedOutput(); err != nil {
		t.Fatalf("mknod: %v: %s", err, out)
	}
	holder := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c",
		"mount --bind "+dev+" /dev/fuse && echo ready && exec sleep 600")
	stdout, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	holder.Stderr = os.Stderr
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		holder.Process.Kill()
		holder.Wait()
	})
	if line, _ := bufio.NewReader(stdout).ReadString('\n'); line != "ready\n" {
		t.Fatalf("mount namespace with a 0666 /dev/fuse: %q", line)
	}
	return strconv.Itoa(holder.Process.Pid)
}

// TestOrdinaryUserMountNamesDevFuse mounts as a user the test creates, with
// the host's /dev/fuse that only root may open (as in many containers):
// the mount fails, naming /dev/fuse and what to do.
func TestOrdinaryUserMountNamesDevFuse(t *testing.T) {
	if err := unix.Access("/dev/fuse", unix.R_OK|unix.W_OK); err == nil {
		// Checked as root: is the device open to others?
		var st unix.Stat_t
		if unix.Stat("/dev/fuse", &st) != nil || st.Mode&0o006 == 0o006 {
			t.Skip("SKIP: /dev/fuse is open to every user here; the failure this test provokes cannot happen")
		}
	}
	u, base, binary, store, mnt := ordinaryUserTier(t, fmt.Sprintf("kvtf%d", os.Getpid()))
	out, err := exec.Command("setpriv", "--reuid", u.Uid, "--regid", u.Gid, "--clear-groups", binary,
		"mount", mnt, "--store", store, "--metrics-addr", "", "--shm-glob", filepath.Join(base, "none-*.mmap")).CombinedOutput()
	if err == nil {
		exec.Command("fusermount3", "-u", "-z", mnt).Run()
		t.Fatalf("a user mounted without access to /dev/fuse:\n%s", out)
	}
	if !strings.Contains(string(out), "/dev/fuse: permission denied: uid "+u.Uid+" cannot open it") {
		t.Errorf("the failed mount does not name /dev/fuse:\n%s", out)
	}
}

// ordinaryUserTier creates the system user name (removed at the test's end)
// and its own directory base, reachable through 0755 parents, holding a copy
// of the binary it may execute and a store and mountpoint it owns.
func ordinaryUserTier(t *testing.T, name string) (u *user.User, base, binary, store, mnt string) {
	t.Helper()
	if out, err := exec.Command("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name).CombinedOutput(); err != nil {
		t.Fatalf("useradd: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("userdel", name).Run() })
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	if base, err = os.MkdirTemp("", "kvtierfs-nonroot-"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	binary = filepath.Join(base, "kvtierfs")
	mounttest.CopyExecutable(t, mounttest.Binary(), binary)
	store, mnt = filepath.Join(base, "store"), filepath.Join(base, "mnt")
	for _, dir := range []string{store, mnt} {
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("chown", "-R", u.Uid+":"+u.Gid, store, mnt).CombinedOutput(); err != nil {
		t.Fatalf("chown: %v: %s", err, out)
	}
	return u, base, binary, store, mnt
}
