package kvevents

import (
	"errors"
	"net"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/internal/sockdiag"
)

// maxPeersPerSource bounds the connections of one source (a local user, or
// a remote address), so that no one source takes every one of maxPeers:
// loopback, where a bound publisher listens by default, is open to every
// local user.
const maxPeersPerSource = 8

// source names who is behind a subscriber's connection: the uid that owns
// the other end of a connection made on this host (every local user
// shares the loopback address and the host's others) or of an ipc:// one,
// else the remote address. Where the kernel
// cannot tell the uid (no sock_diag), the loopback address is the source,
// and err says why.
func source(conn net.Conn) (string, error) {
	switch c := conn.(type) {
	case *net.UnixConn:
		uid, err := unixPeerUID(c)
		if err != nil {
			return "unix socket", err
		}
		return "uid " + strconv.FormatUint(uint64(uid), 10), nil
	case *net.TCPConn:
		// A local user reaches the publisher through any of the host's
		// addresses, not only loopback: whatever the address, a socket
		// of this network namespace at the other end names its uid.
		remote := c.RemoteAddr().(*net.TCPAddr)
		uid, err := localPeerUID(remote, c.LocalAddr().(*net.TCPAddr))
		if err != nil {
			if !remote.IP.IsLoopback() {
				err = nil // a peer on another host
			}
			return "address " + remote.IP.String(), err
		}
		return "uid " + strconv.FormatUint(uint64(uid), 10), nil
	}
	return "address " + conn.RemoteAddr().String(), nil
}

// unixPeerUID is the uid of the process that connected a Unix socket
// (SO_PEERCRED).
func unixPeerUID(c *net.UnixConn) (uint32, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if credErr != nil {
		return 0, credErr
	}
	return cred.Uid, nil
}

// localPeerUID asks the kernel (sock_diag) which uid owns the TCP socket
// bound to remote and connected to local: the other end of a connection
// made on this host, in this network namespace (ENOENT for one made
// elsewhere).
func localPeerUID(remote, local *net.TCPAddr) (uint32, error) {
	family, src, dst := familyOf(remote.IP, local.IP)
	uid, err := sockdiag.TCPOwner(family, remote.Port, local.Port, src, dst)
	if family == unix.AF_INET && errors.Is(err, unix.ENOENT) {
		// A dual-stack peer's socket holds the addresses v4-mapped.
		var src6, dst6 [16]byte
		copy(src6[:], remote.IP.To16())
		copy(dst6[:], local.IP.To16())
		return sockdiag.TCPOwner(unix.AF_INET6, remote.Port, local.Port, src6, dst6)
	}
	return uid, err
}

// familyOf is the address family of a connection's two addresses, as
// inet_diag's 16-byte fields hold them.
func familyOf(src, dst net.IP) (family uint8, srcBytes, dstBytes [16]byte) {
	if s4, d4 := src.To4(), dst.To4(); s4 != nil && d4 != nil {
		copy(srcBytes[:], s4)
		copy(dstBytes[:], d4)
		return unix.AF_INET, srcBytes, dstBytes
	}
	copy(srcBytes[:], src.To16())
	copy(dstBytes[:], dst.To16())
	return unix.AF_INET6, srcBytes, dstBytes
}
