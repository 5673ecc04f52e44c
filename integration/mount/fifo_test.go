package mount_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

// TestFIFOSwappedIntoTheStoreHoldsNoOpen: the engine's uid owns the store
// tree, so it can put a FIFO where the mount knows a regular file, a block
// or another file, and open that name through the mount. Main's daemon
// opened the FIFO and waited in open(2) for a writer, its thread held and
// the opener unkillable (the kernel waits for the answer to a request the
// daemon has read), one thread per open, up to Go's limit of 10,000. The
// daemon's open must not wait: the block's fails (ENOENT, the block
// dropped), the other file is found again as the FIFO it is, whose open
// the kernel keeps (killable) without asking the daemon.
func TestFIFOSwappedIntoTheStoreHoldsNoOpen(t *testing.T) {
	region := newRegion(t, 1)
	d := mounttest.Start(t, mounttest.Options{ShmGlob: region.Path})
	rel, err := filepath.Rel(d.Mountpoint, storeBlock(t, openTier(t, d), region.Row(0), 1))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(d.Path("config.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{rel, "config.json"} {
		// Known to the kernel as a regular file from here on.
		if _, err := os.Stat(d.Path(name)); err != nil {
			t.Fatal(err)
		}
		inStore := filepath.Join(d.Store, name)
		if err := os.Remove(inStore); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mkfifo(inStore, 0o600); err != nil {
			t.Fatal(err)
		}
		out, exited := openInChild(t, d.Path(name), inStore)
		if name == rel && (!exited || !strings.Contains(out, "No such file")) {
			t.Errorf("load of a block that is a FIFO in the store: %q (ended by itself: %v), want ENOENT", out, exited)
		}
	}
	if st := d.Stats(); st.Disk.Blocks != 0 {
		t.Errorf("the store still indexes %d blocks, want the one swapped for a FIFO dropped", st.Disk.Blocks)
	}
}

// openInChild opens path for reading in a child process (cat) and returns
// what it printed and whether it ended by itself. A child that waits is
// killed, and must then end within 30 s; else the test fails, and the
// daemon, waiting in fifo's open, is let go by a writer's open of fifo.
func openInChild(t *testing.T, path, fifo string) (string, bool) {
	t.Helper()
	var out bytes.Buffer
	cat := exec.Command("cat", path)
	cat.Stdout, cat.Stderr = &out, &out
	if err := cat.Start(); err != nil {
		t.Fatal(err)
	}
	ended := make(chan struct{})
	go func() {
		cat.Wait()
		close(ended)
	}()
	for {
		select {
		case <-ended:
			return out.String(), true
		case <-time.After(10 * time.Millisecond):
		}
		if wchan, err := os.ReadFile(fmt.Sprintf("/proc/%d/wchan", cat.Process.Pid)); err == nil &&
			(string(wchan) == "wait_for_partner" || string(wchan) == "request_wait_answer") {
			break
		}
	}
	cat.Process.Kill()
	select {
	case <-ended:
	case <-time.After(30 * time.Second):
		t.Errorf("opening %s through the mount survived SIGKILL for 30 s: the daemon waits in the FIFO's open", path)
		if fd, err := unix.Open(fifo, unix.O_WRONLY|unix.O_NONBLOCK, 0); err == nil {
			unix.Close(fd)
		}
		<-ended
	}
	return out.String(), false
}

// TestLeaseOnAStoreFileHoldsNoTruncate: the engine's uid owns the store
// tree, so it can take a write lease on a store file and truncate that file
// through the mount. Main's daemon truncated by path and waited out the
// lease-break time (45 s) in a thread of its own, one per file, until Go's
// thread limit ended it. The truncate must fail at once (EAGAIN) with the
// file left as it was, and succeed once the lease is gone.
func TestLeaseOnAStoreFileHoldsNoTruncate(t *testing.T) {
	d := mounttest.Start(t, mounttest.Options{})
	if err := os.WriteFile(d.Path("config.json"), []byte("{\"k\": 1}"), 0o644); err != nil {
		t.Fatal(err)
	}
	lease, err := os.Open(filepath.Join(d.Store, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Close()
	// A write lease needs no other open descriptor of the file: the
	// daemon's of the write is closed at the RELEASE after it.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		_, err := unix.FcntlInt(lease.Fd(), unix.F_SETLEASE, unix.F_WRLCK)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EAGAIN) || time.Now().After(deadline) {
			t.Fatalf("write lease on the store file: %v", err)
		}
	}
	if err := os.Truncate(d.Path("config.json"), 0); !errors.Is(err, unix.EAGAIN) {
		t.Fatalf("truncate of a leased store file through the mount: %v, want EAGAIN at once", err)
	}
	if st, err := os.Stat(filepath.Join(d.Store, "config.json")); err != nil || st.Size() != 8 {
		t.Fatalf("leased store file after the refused truncate: %v, %v; want its 8 bytes", st, err)
	}
	if _, err := unix.FcntlInt(lease.Fd(), unix.F_SETLEASE, unix.F_UNLCK); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(d.Path("config.json"), 0); err != nil {
		t.Fatalf("truncate once the lease is gone: %v", err)
	}
	if st, err := os.Stat(d.Path("config.json")); err != nil || st.Size() != 0 {
		t.Fatalf("after the truncate: %v, %v; want size 0", st, err)
	}
}

// TestMountInsideTheStoreIsNotEntered: a filesystem mounted inside the
// store tree (the engine's uid may mount a FUSE server there where
// /dev/fuse is open to it, and stop it: every daemon thread that stats its
// root or walks into it then waits for good) is not entered through the
// mount: its name and the names below it fail with EXDEV, and the daemon
// answers the rest of the tree.
func TestMountInsideTheStoreIsNotEntered(t *testing.T) {
	d := mounttest.Start(t, mounttest.Options{})
	if err := os.Mkdir(d.Path("nest"), 0o755); err != nil {
		t.Fatal(err)
	}
	inStore := filepath.Join(d.Store, "nest")
	if err := unix.Mount("kvtierfs-nested-test", inStore, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(inStore, unix.MNT_DETACH) })
	if err := os.WriteFile(filepath.Join(inStore, "f"), []byte("nested"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The kernel's entry of "nest" is the directory's from before the
	// mount; a mount the daemon does not enter is found on a fresh lookup.
	if err := os.WriteFile(d.Path("config.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	unix.Syscall(unix.SYS_SYNC, 0, 0, 0)
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("2"), 0o200); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"nest/f", "nest"} {
		if _, err := os.Stat(d.Path(name)); !errors.Is(err, unix.EXDEV) {
			t.Errorf("stat of %s through the mount: %v, want EXDEV", name, err)
		}
	}
	if b, err := os.ReadFile(d.Path("nest/f")); err == nil {
		t.Errorf("read %q through the mount from a filesystem mounted inside the store", b)
	}
	if b, err := os.ReadFile(d.Path("config.json")); err != nil || string(b) != "{}" {
		t.Errorf("config.json beside it: %q, %v", b, err)
	}
}
