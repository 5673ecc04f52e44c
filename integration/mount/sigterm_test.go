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
// and cleanly, and the copy then fails its requests instead of hanging;
// with fusectl mounted on the system and without, which the daemon leaves
// as it found it.
func TestSIGTERMEndsDaemonHeldByAnotherNamespace(t *testing.T) {
	hadFusectl := fusectlMounted(t)
	for _, withFusectl := range []bool{true, false} {
		t.Run(map[bool]string{true: "fusectl", false: "no-fusectl"}[withFusectl], func(t *testing.T) {
			setFusectl(t, withFusectl)
			t.Cleanup(func() { setFusectl(t, hadFusectl) })
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
			if fusectlMounted(t) != withFusectl {
				t.Errorf("the daemon changed whether fusectl is mounted (was %v)", withFusectl)
			}
		})
	}
}

// setFusectl mounts or unmounts fusectl at fusectlDir.
func setFusectl(t *testing.T, mounted bool) {
	t.Helper()
	var err error
	switch {
	case mounted && !fusectlMounted(t):
		err = unix.Mount("fusectl", fusectlDir, "fusectl", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
	case !mounted && fusectlMounted(t):
		err = unix.Unmount(fusectlDir, 0)
	}
	if err != nil {
		t.Fatalf("fusectl at %s: %v", fusectlDir, err)
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
