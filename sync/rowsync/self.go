package rowsync

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
)

// One peer list for a whole group. A DaemonSet gives every node of a TP group
// the same --peer list, so each node finds itself in it. An entry is this
// node itself when:
//   - it names this node's own listening address literally: the listen
//     address, or, for a listener on the unspecified address, a loopback
//     address or an address of one of this host's interfaces, with the
//     listen port. Configuration alone says so; nothing on the network can
//     change it, so such an entry is skipped at once and never dialed.
//   - or its handshake reached this node's own Server (a host name, NAT or a
//     relay in between): the Welcome names this node. The network can
//     arrange that too (a relay handing a node's connection to a real peer
//     back to the node itself), and skipping a real peer would leave its rank
//     stale while loads succeed. So such an entry is skipped only while the
//     list shows it is a group's shared list: it is the only entry that
//     reaches this node, at least one other entry exists, and every other
//     entry's Server is up and answered a Welcome with the digest of the
//     same list (a group configured node by node, each listing the others,
//     has a different list on every node). Otherwise the entry counts as a
//     peer that is down, with a message that says why.

// StateSelf is the state of a PeerStats entry that is this node itself, skipped.
const StateSelf = "self"

// errSelf ends a handshake that reached this node's own Server.
var errSelf = errors.New("rowsync: this address reaches this node itself")

// PeerListDigest is the SHA-256 of a peer list: its distinct entries, sorted,
// each followed by a newline.
type PeerListDigest [32]byte

// peerListDigest returns the digest of peers.
func peerListDigest(peers []string) PeerListDigest {
	sorted := slices.Compact(slices.Sorted(slices.Values(peers)))
	var b strings.Builder
	for _, p := range sorted {
		b.WriteString(p)
		b.WriteByte('\n')
	}
	return sha256.Sum256([]byte(b.String()))
}

// listensAt reports whether peer, a literal IP:port, is an address the
// listener at listen accepts connections on. localIPs are this host's
// interface addresses. Host names are never resolved here (a name server can
// lie): they are recognised by their handshake.
func listensAt(peer string, listen *net.TCPAddr, localIPs []netip.Addr) bool {
	if listen == nil {
		return false
	}
	ap, err := netip.ParseAddrPort(peer)
	if err != nil || ap.Port() != uint16(listen.Port) {
		return false
	}
	ip := ap.Addr().Unmap().WithZone("")
	l, ok := netip.AddrFromSlice(listen.IP)
	if !ok {
		return false
	}
	l = l.Unmap()
	if !l.IsUnspecified() {
		return ip == l
	}
	return ip.IsLoopback() || slices.Contains(localIPs, ip)
}

// interfaceIPs returns this host's interface addresses; none when they cannot
// be listed (every entry is then left to its handshake).
func interfaceIPs() []netip.Addr {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var ips []netip.Addr
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				ips = append(ips, ip.Unmap())
			}
		}
	}
	return ips
}

// selfEntries sorts the peer entries into the ones to mirror to and the ones
// skipped as this node itself; err is non-nil when an entry reached this
// node through its handshake and may not be skipped (see above): the node
// is then not healthy and no row may be mirrored.
func (m *Mirror) selfEntries() (targets []*peerLanes, err error) {
	var reached []*peerLanes // entries whose handshake reached this node
	literal := 0
	for _, pl := range m.peers {
		switch {
		case pl.literalSelf:
			literal++
		case pl.reachedSelf():
			reached = append(reached, pl)
		default:
			targets = append(targets, pl)
		}
	}
	if len(reached) == 0 {
		return targets, nil
	}
	why := ""
	switch {
	case literal+len(reached) > 1:
		why = fmt.Sprintf("%d entries of the list reach this node, at most one may", literal+len(reached))
	case len(targets) == 0:
		why = "no other entry confirms that this is a group's shared list"
	default:
		for _, pl := range targets {
			if d, ok := pl.peerList(); !ok || d != m.peerList {
				why = fmt.Sprintf("peer %s has not confirmed the same peer list (a node-by-node list must not name this node)", pl.addr)
				break
			}
		}
	}
	if why == "" {
		return targets, nil
	}
	addrs := make([]string, len(reached))
	for i, pl := range reached {
		addrs[i] = pl.addr
	}
	return targets, fmt.Errorf("%w: --peer %s reaches this node itself, and it is not skipped: %s", ErrPeerDown, strings.Join(addrs, ", "), why)
}
