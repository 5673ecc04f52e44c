// Package sockdiag asks the kernel (NETLINK_SOCK_DIAG) which uid owns a TCP
// socket of this network namespace: the other end of a connection made on
// this host, or the listener that holds a port.
package sockdiag

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"time"

	"golang.org/x/sys/unix"
)

// ListenerOwner is the uid of the socket listening on addr, or on the
// wildcard address at its port; ENOENT where none listens there. For the
// wildcard itself (an unspecified addr), whose bind fails while any of the
// host's addresses is held at the port, a listener on one of them (the
// loopback's included) counts too.
func ListenerOwner(addr *net.TCPAddr) (uint32, error) {
	uid, err := listenerAt(addr)
	if !errors.Is(err, unix.ENOENT) || (addr.IP != nil && !addr.IP.IsUnspecified()) {
		return uid, err
	}
	hostAddrs, hostErr := net.InterfaceAddrs()
	if hostErr != nil {
		return uid, err
	}
	for _, a := range hostAddrs {
		if ipNet, ok := a.(*net.IPNet); ok {
			if held, heldErr := listenerAt(&net.TCPAddr{IP: ipNet.IP, Port: addr.Port}); heldErr == nil {
				return held, nil
			}
		}
	}
	return uid, err
}

// listenerAt is ListenerOwner at addr only.
func listenerAt(addr *net.TCPAddr) (uint32, error) {
	var src [16]byte
	family := uint8(unix.AF_INET)
	if ip4 := addr.IP.To4(); ip4 != nil {
		copy(src[:], ip4)
	} else if addr.IP != nil {
		family = unix.AF_INET6
		copy(src[:], addr.IP.To16())
	}
	return TCPOwner(family, addr.Port, 0, src, [16]byte{})
}

// Sizes and offsets of linux/inet_diag.h's structures.
const (
	diagRequestLen = 56 // struct inet_diag_req_v2
	diagUIDOffset  = 64 // idiag_uid in struct inet_diag_msg
	diagReplyLen   = diagUIDOffset + 8
)

// TCPOwner looks one TCP socket up by its addresses (SOCK_DIAG_BY_FAMILY
// without NLM_F_DUMP), in this network namespace, and returns its owner's
// uid. The addresses are 16 bytes, an IPv4 one in the first 4 (family
// AF_INET); a listener is found by its own address and port with dport 0
// and dst zero.
func TCPOwner(family uint8, sport, dport int, src, dst [16]byte) (uint32, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return 0, fmt.Errorf("sock_diag: %w", err)
	}
	defer unix.Close(fd)
	timeout := unix.NsecToTimeval(time.Second.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &timeout); err != nil {
		return 0, err
	}
	msg := make([]byte, unix.NLMSG_HDRLEN, unix.NLMSG_HDRLEN+diagRequestLen)
	binary.NativeEndian.PutUint32(msg[0:], uint32(unix.NLMSG_HDRLEN+diagRequestLen))
	binary.NativeEndian.PutUint16(msg[4:], unix.SOCK_DIAG_BY_FAMILY)
	binary.NativeEndian.PutUint16(msg[6:], unix.NLM_F_REQUEST)
	binary.NativeEndian.PutUint32(msg[8:], 1) // sequence number
	msg = append(msg, family, unix.IPPROTO_TCP, 0, 0)
	msg = binary.NativeEndian.AppendUint32(msg, ^uint32(0)) // every state
	msg = binary.BigEndian.AppendUint16(msg, uint16(sport))
	msg = binary.BigEndian.AppendUint16(msg, uint16(dport))
	msg = append(msg, src[:]...)
	msg = append(msg, dst[:]...)
	msg = binary.NativeEndian.AppendUint32(msg, 0)          // any interface
	msg = binary.NativeEndian.AppendUint64(msg, ^uint64(0)) // INET_DIAG_NOCOOKIE
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, fmt.Errorf("sock_diag: %w", err)
	}
	reply := make([]byte, 4096)
	n, _, err := unix.Recvfrom(fd, reply, 0)
	if err != nil {
		return 0, fmt.Errorf("sock_diag: %w", err)
	}
	if n < unix.NLMSG_HDRLEN+4 {
		return 0, errors.New("sock_diag: short reply")
	}
	body := reply[unix.NLMSG_HDRLEN:n]
	switch binary.NativeEndian.Uint16(reply[4:]) {
	case unix.NLMSG_ERROR:
		return 0, fmt.Errorf("sock_diag: %w", unix.Errno(-int32(binary.NativeEndian.Uint32(body))))
	case unix.SOCK_DIAG_BY_FAMILY:
		if len(body) < diagReplyLen {
			return 0, errors.New("sock_diag: short reply")
		}
		return binary.NativeEndian.Uint32(body[diagUIDOffset:]), nil
	}
	return 0, errors.New("sock_diag: unexpected reply")
}
