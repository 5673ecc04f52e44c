package sockdiag

import (
	"errors"
	"net"
	"os"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// needSockDiag skips where the kernel has no NETLINK_SOCK_DIAG socket:
// qemu-user emulates only a few netlink protocols.
func needSockDiag(t *testing.T) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if errors.Is(err, unix.EPROTONOSUPPORT) {
		t.Skipf("no NETLINK_SOCK_DIAG socket here (%v): qemu-user; run on a real kernel", err)
	}
	if err == nil {
		unix.Close(fd)
	}
}

// TestListenerOwner finds the owner of a listener by its address, of a
// wildcard listener by a loopback address at its port, and nothing once
// the listener is closed.
func TestListenerOwner(t *testing.T) {
	needSockDiag(t)
	for _, listen := range []string{"127.0.0.1:0", "0.0.0.0:0"} {
		l, err := net.Listen("tcp4", listen)
		if err != nil {
			t.Fatal(err)
		}
		at := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: l.Addr().(*net.TCPAddr).Port}
		if uid, err := ListenerOwner(at); err != nil || uid != uint32(os.Getuid()) {
			t.Errorf("listener on %s, asked at %s: uid %d, %v; want %d", l.Addr(), at, uid, err, os.Getuid())
		}
		l.Close()
		if uid, err := ListenerOwner(at); !errors.Is(err, unix.ENOENT) {
			t.Errorf("closed listener at %s: uid %d, %v; want ENOENT", at, uid, err)
		}
	}
}

// TestListenerOwnerBehindTheWildcard: a listener on the loopback address
// holds the wildcard's port too (its bind fails), and is found asked at
// the wildcard.
func TestListenerOwnerBehindTheWildcard(t *testing.T) {
	needSockDiag(t)
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	at := &net.TCPAddr{IP: net.IPv4zero, Port: l.Addr().(*net.TCPAddr).Port}
	if uid, err := ListenerOwner(at); err != nil || uid != uint32(os.Getuid()) {
		t.Errorf("listener on %s, asked at %s: uid %d, %v; want %d", l.Addr(), at, uid, err, os.Getuid())
	}
}

// TestListenerOwnerOfAnotherUser: a listener made by another uid is named
// by that uid.
func TestListenerOwnerOfAnotherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a socket of another uid needs root (setfsuid)")
	}
	needSockDiag(t)
	const other = 4711
	runtime.LockOSThread()
	unix.Setfsuid(other)
	fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	unix.Setfsuid(0)
	runtime.UnlockOSThread()
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrInet6{Addr: [16]byte{15: 1}}); err != nil {
		t.Skipf("no IPv6 loopback here: %v", err)
	}
	if err := unix.Listen(fd, 1); err != nil {
		t.Fatal(err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	at := &net.TCPAddr{IP: net.IPv6loopback, Port: sa.(*unix.SockaddrInet6).Port}
	if uid, err := ListenerOwner(at); err != nil || uid != other {
		t.Errorf("listener of uid %d at %s: uid %d, %v", other, at, uid, err)
	}
}
