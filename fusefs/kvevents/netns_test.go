package kvevents

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// inNetnsEnv marks the test binary re-run inside a network namespace of its
// own (unshare --net), where it may give its loopback device another address.
const inNetnsEnv = "KVTIERFS_TEST_KVEVENTS_NETNS"

// hostAddress is the address, not a loopback one, that the host of
// TestOneUserCannotTakeEverySlotThroughAHostAddress has besides loopback.
var hostAddress = [4]byte{10, 200, 0, 1}

// TestOneUserCannotTakeEverySlotThroughAHostAddress: the host has an
// address besides loopback (its network card's), and the publisher is bound
// to every address (--kv-events-bind-all, so that routers on other nodes
// reach it). One local user connects through loopback and through that
// address: main took the second kind's source for a remote peer's address,
// not the user's uid, so the user held maxPeersPerSource connections per
// address of the host on top of its loopback ones, enough on a host with a
// few addresses to take every slot. Run in a network namespace the test
// makes (a re-run of this binary under unshare --net), whose loopback
// device is given the address.
func TestOneUserCannotTakeEverySlotThroughAHostAddress(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a network namespace and a socket of another uid need root")
	}
	// As in TestOneUserCannotTakeEverySlot: the uid comes from sock_diag,
	// which qemu-user does not emulate.
	if fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG); err == nil {
		unix.Close(fd)
	} else if errors.Is(err, unix.EPROTONOSUPPORT) {
		t.Skipf("no NETLINK_SOCK_DIAG socket here (%v): qemu-user; run on a real kernel", err)
	}
	if os.Getenv(inNetnsEnv) == "" {
		unsharePath, err := exec.LookPath("unshare")
		if err != nil {
			t.Fatalf("unshare (util-linux) is needed: %v", err)
		}
		cmd := exec.Command(unsharePath, "--net", os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), inNetnsEnv+"=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("in a network namespace of its own: %v\n%s", err, out)
		}
		return
	}
	for _, args := range [][]string{{"link", "set", "lo", "up"}, {"addr", "add", net.IP(hostAddress[:]).String() + "/32", "dev", "lo"}} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v\n%s", args, err, out)
		}
	}
	p, err := Start(Options{Endpoint: "tcp://*:0", BindAll: true})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	port := p.Addr().(*net.TCPAddr).Port
	const flooder = 4711
	kept := 0
	for i := range maxPeers {
		from := hostAddress
		if i%2 == 0 {
			from = [4]byte{127, 0, 0, 1}
		}
		conn := dialFrom(t, from, port, flooder)
		if sub, err := handshakeRaw(conn, "SUB"); err == nil && subscribeRaw(sub) == nil {
			kept++
		}
	}
	if kept > maxPeersPerSource {
		t.Errorf("one uid holds %d subscribed connections through loopback and the host's address, want at most %d", kept, maxPeersPerSource)
	}
}

// dialFrom connects a socket of uid, bound to addr, to the same address's
// port.
func dialFrom(t *testing.T, addr [4]byte, port, uid int) net.Conn {
	t.Helper()
	runtime.LockOSThread()
	unix.Setfsuid(uid)
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	unix.Setfsuid(0)
	runtime.UnlockOSThread()
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "socket")
	defer f.Close()
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: addr}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Connect(fd, &unix.SockaddrInet4{Port: port, Addr: addr}); err != nil {
		t.Fatal(err)
	}
	conn, err := net.FileConn(f)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}
