package mount_test

import (
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/fusefs/mountinfo"
	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

// fusectlDir is where the kernel's fusectl filesystem is mounted.
const fusectlDir = "/sys/fs/fuse/connections"

// TestSIGTERMEndsDaemonHeldByAnotherNamespace: a process in a mount
// namespace of its own (unshare -m) holds a copy of the mount, which the
// daemon's unmount does not reach. SIGTERM still ends the daemon, by itself
// and cleanly, and the copy then fails its requests instead of hanging.
func TestSIGTERMEndsDaemonHeldByAnotherNamespace(t *testing.T) {
	hadFusectl := fusectlMounted(t)
	t.Cleanup(func() {
		if !hadFusectl && fusectlMounted(t) {
			if err := unix.Unmount(fusectlDir, 0); err != nil {
				t.Errorf("unmounting the fusectl the daemon mounted: %v", err)
			}
		}
	})
	d := mounttest.Start(t, mounttest.Options{})
	holder := exec.Command("unshare", "--mount", "--propagation", "private", "sleep", "3600")
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		holder.Process.Kill()
		holder.Wait()
	})
	pid := strconv.Itoa(holder.Process.Pid)
	waitForCopy(t, pid, d.Mountpoint)

	if err := d.Stop(); err != nil {
		t.Fatalf("SIGTERM did not end the daemon by itself: %v\n%s", err, d.Log())
	}
	out, err := exec.Command("nsenter", "--target", pid, "--mount", "stat", d.Mountpoint).CombinedOutput()
	if err == nil {
		t.Errorf("the copy of the mount still answers after the daemon ended: %s", out)
	}
}

// waitForCopy waits until process pid runs in a mount namespace of its own
// that holds a mount at mnt.
func waitForCopy(t *testing.T, pid, mnt string) {
	t.Helper()
	ours, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		t.Fatal(err)
	}
	for range 1000 {
		theirs, err := os.Readlink("/proc/" + pid + "/ns/mnt")
		if err == nil && theirs != ours {
			if mounts, err := mountinfo.Read(pid); err == nil && len(mountinfo.At(mounts, mnt)) > 0 {
				return
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("process %s never held a copy of %s in its own mount namespace", pid, mnt)
}

// fusectlMounted reports whether fusectl is mounted at fusectlDir.
func fusectlMounted(t *testing.T) bool {
	t.Helper()
	mounts, err := mountinfo.Read("self")
	if err != nil {
		t.Fatal(err)
	}
	at := mountinfo.At(mounts, fusectlDir)
	return len(at) > 0 && at[len(at)-1].FSType == "fusectl"
}
