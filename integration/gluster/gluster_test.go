package gluster

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		if os.Getenv(mounttest.UnitEnv) != "" {
			fmt.Fprintln(os.Stderr, "gluster: skipped: these tests run glusterd, namespaces and mounts and need root")
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "gluster: these tests run glusterd, namespaces and mounts and must run as root")
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// TestClusterFaultsAndCleanup brings a volume up on two nodes, checks that a
// file written through one is read through the other, that a stopped brick
// and a cut link make the volume unreachable (only from the cut node) and
// that both recover, and that Close leaves nothing behind.
func TestClusterFaultsAndCleanup(t *testing.T) {
	if os.Getenv(mounttest.UnitEnv) != "" && !Installed() {
		t.Skipf("GlusterFS is not installed and %s forbids installing it", mounttest.UnitEnv)
	}
	c, err := Setup(Options{})
	if err != nil {
		if c != nil {
			c.Close()
		}
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			c.Close()
		}
	}()
	t.Logf("setup took %s", c.SetupTime.Round(time.Millisecond))
	a, b := c.Nodes[0], c.Nodes[1]

	want := bytes.Repeat([]byte("kv"), 1<<16)
	if err := os.WriteFile(filepath.Join(a.Mount, "f"), want, 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(b.Mount, "f")); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read through the other node: %d bytes, %v", len(got), err)
	}
	if _, err := os.Stat(filepath.Join(c.Brick(), "f")); err != nil {
		t.Fatalf("the brick does not hold the file: %v", err)
	}

	if err := c.StopBrick(); err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes {
		if c.Reachable(n) {
			t.Fatalf("%s reaches the volume with its brick stopped", n.Name)
		}
	}
	if err := c.StartBrick(); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(a.Mount, "f")); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read after the brick restarted: %d bytes, %v", len(got), err)
	}

	if err := c.CutLink(b); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	for c.Reachable(b) {
		if time.Since(began) > PingTimeout+20*time.Second {
			t.Fatalf("%s still reaches the volume %s after its link was cut", b.Name, time.Since(began))
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("cut link noticed after %s", time.Since(began).Round(time.Millisecond))
	if !c.Reachable(a) {
		t.Fatalf("%s lost the volume when %s's link was cut", a.Name, b.Name)
	}
	if err := c.RestoreLink(b); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(b.Mount, "f")); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read after the link came back: %d bytes, %v", len(got), err)
	}

	dir := c.dir
	names := []string{c.server.Name, c.server.hostLink}
	for _, n := range c.Nodes {
		names = append(names, n.Name, n.hostLink)
	}
	closed = true
	if err := c.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	assertGone(t, dir, names)
}

// assertGone checks that nothing of a closed cluster remains.
func assertGone(t *testing.T, dir string, names []string) {
	t.Helper()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("state directory %s remains: %v", dir, err)
	}
	if m := mountsUnder(dir); len(m) > 0 {
		t.Errorf("mounts remain: %v", m)
	}
	if p := processesMatching(func(cmdline []string) bool { return mentions(cmdline, dir) }); len(p) > 0 {
		t.Errorf("processes remain: %v", p)
	}
	for _, name := range names {
		if _, err := os.Stat("/run/netns/" + name); err == nil {
			t.Errorf("namespace %s remains", name)
		}
		if linkExists(name) {
			t.Errorf("link %s remains", name)
		}
	}
	if l, err := net.Listen("tcp", fmt.Sprintf(":%d", glusterdPort)); err != nil {
		t.Errorf("glusterd's port is still taken: %v", err)
	} else {
		l.Close()
	}
}

// TestClearStaleRemovesDeadRunsState plants the state of a harness process
// that died — a state directory, a namespace and a link named after it — and
// checks that the guard removes them, while a live owner's state stays.
func TestClearStaleRemovesDeadRunsState(t *testing.T) {
	exited := exec.Command("true")
	if err := exited.Run(); err != nil {
		t.Fatal(err)
	}
	dead := exited.Process.Pid
	deadDir, err := os.MkdirTemp("", statePrefix)
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(deadDir)
	os.WriteFile(filepath.Join(deadDir, "owner.pid"), []byte(fmt.Sprint(dead)), 0o644)
	liveDir, err := os.MkdirTemp("", statePrefix)
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(liveDir)
	os.WriteFile(filepath.Join(liveDir, "owner.pid"), []byte(fmt.Sprint(os.Getpid())), 0o644)

	ns, link, liveLink := fmt.Sprintf("%s%dzn1", linkPrefix, dead), fmt.Sprintf("%s%dzh1", linkPrefix, dead), fmt.Sprintf("%s%dzh1", linkPrefix, os.Getpid())
	if err := run("ip", "netns", "add", ns); err != nil {
		t.Fatal(err)
	}
	defer exec.Command("ip", "netns", "del", ns).Run()
	for _, l := range []string{link, liveLink} {
		if err := run("ip", "link", "add", l, "type", "veth", "peer", "name", l+"p"); err != nil {
			t.Fatal(err)
		}
		defer exec.Command("ip", "link", "del", l).Run()
	}

	ClearStale()
	if _, err := os.Stat(deadDir); !os.IsNotExist(err) {
		t.Errorf("a dead run's state directory remains")
	}
	if _, err := os.Stat("/run/netns/" + ns); err == nil {
		t.Errorf("a dead run's namespace remains")
	}
	if linkExists(link) {
		t.Errorf("a dead run's link remains")
	}
	if _, err := os.Stat(liveDir); err != nil {
		t.Errorf("a live run's state directory was removed")
	}
	if !linkExists(liveLink) {
		t.Errorf("a live run's link was removed")
	}
}
