package netns

import (
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// inNode runs fn on a thread in node's network namespace: sockets fn creates
// belong to that namespace for good.
func inNode(t *testing.T, g *Group, node int, fn func()) {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	self, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	defer self.Close()
	target, err := os.Open(strings.TrimPrefix(g.Wrapper(node)[1], "--net="))
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
			panic(err) // the thread must not go back to the pool in another namespace
		}
	}()
	fn()
}

// TestGroup makes two nodes: node 0 reaches a listener at node 1's address
// across the bridge, the host's namespace has no such address, and Close
// leaves no namespace.
func TestGroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("network namespaces need root")
	}
	g, err := New("kvtnetns", 2)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	var ln net.Listener
	inNode(t, g, 1, func() {
		if ln, err = net.Listen("tcp", g.IP(1)+":7470"); err != nil {
			t.Fatal(err)
		}
	})
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Write([]byte("node 1"))
			c.Close()
		}
	}()
	var got []byte
	inNode(t, g, 0, func() {
		c, err := net.Dial("tcp", g.IP(1)+":7470")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if local := c.LocalAddr().(*net.TCPAddr).IP.String(); local != g.IP(0) {
			t.Errorf("node 0 dialed from %s, want %s", local, g.IP(0))
		}
		got, _ = io.ReadAll(c)
	})
	if string(got) != "node 1" {
		t.Fatalf("node 0 read %q from node 1", got)
	}
	if l, err := net.Listen("tcp", g.IP(1)+":0"); err == nil {
		l.Close()
		t.Fatalf("node 1's address %s exists in the host's namespace", g.IP(1))
	}
	names := append([]string(nil), g.names...)
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	list, _ := exec.Command("ip", "netns", "list").CombinedOutput()
	for _, name := range names {
		if strings.Contains(string(list), name) {
			t.Errorf("namespace %s left after Close", name)
		}
	}
}
