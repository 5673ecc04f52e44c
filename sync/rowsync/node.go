package rowsync

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log"
	"maps"
	"net"
	"slices"
	"sync/atomic"
	"time"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// Config configures a Node from the mount flags.
type Config struct {
	Listen     string                           // --listen; empty: accept no rows
	Peers      []string                         // --peer, repeated; empty: mirror nothing; may name this node (self.go)
	Secret     []byte                           // --secret-file, see ReadSecretFile
	Replicated Mode                             // --replicated-kv
	Deadline   time.Duration                    // per row and peer; 0: DefaultDeadline
	Region     RegionFunc                       // the local region, for rows peers send (needed with Listen); see rowGeometry
	RowBytes   int                              // --row-bytes: this node's row size until its own use names one; 0: unknown
	Logf       func(format string, args ...any) // nil: log.Printf
	Notes      Notes                            // keeps the replication samples across restarts; nil: none
}

// ErrNotReplicated is MirrorLoadedRow's error while the Gate disallows mirroring.
var ErrNotReplicated = errors.New("rowsync: mirroring is not allowed")

// StateInbound is the state of a PeerStats entry for an address that sent
// rows but is not a configured peer.
const StateInbound = "inbound"

// Node is one node's sync layer as the filesystem uses it: a Server for rows
// from peers, a Mirror to peers, the replication Gate and the counters. A Node
// started without Listen and Peers is a no-op.
type Node struct {
	gate     *Gate
	mirror   *Mirror // nil without peers
	server   *Server // nil without Listen
	rowBytes int     // Config.RowBytes

	rowsMirrored atomic.Uint64
}

// Snapshot is the sync section of stat and metrics.
type Snapshot struct {
	Peers        []PeerStats
	Replication  GateSnapshot
	RowsMirrored uint64
	AuthFailures uint64
	// HandshakesEvicted counts handshakes closed to make room at a flooded
	// listener: this node's (Server.HandshakesEvicted) and its peers'
	// (Mirror.HandshakesEvicted).
	HandshakesEvicted uint64
	// RowsLate counts rows from peers that arrived after their CommitBy
	// and were not written (Server.RowsLate).
	RowsLate uint64
}

// Start starts the Server (with Listen) and the Mirror (with Peers).
func Start(cfg Config) (*Node, error) {
	if cfg.Logf == nil {
		cfg.Logf = log.Printf
	}
	n := &Node{gate: NewGate(cfg.Replicated, cfg.Logf), rowBytes: cfg.RowBytes}
	if cfg.Notes != nil {
		if err := n.gate.Remember(cfg.Notes); err != nil && !errors.Is(err, fs.ErrNotExist) {
			cfg.Logf("rowsync: the store samples of an earlier run are lost: %v", err)
		}
	}
	self := newNodeID() // shared by the Server and the Mirror, see auth.go
	if cfg.Listen != "" {
		s, err := StartServer(ServerConfig{Listen: cfg.Listen, Secret: cfg.Secret, Node: self, Peers: cfg.Peers, Region: cfg.Region, RowBytes: cfg.RowBytes, Gate: n.gate, Logf: cfg.Logf})
		if err != nil {
			return nil, err
		}
		n.server = s
	}
	if len(cfg.Peers) > 0 {
		m, err := NewMirror(MirrorConfig{Peers: cfg.Peers, Listen: n.Addr(), Secret: cfg.Secret, Node: self, Deadline: cfg.Deadline, Logf: cfg.Logf})
		if err != nil {
			n.Close()
			return nil, err
		}
		n.mirror = m
	}
	return n, nil
}

// Close stops the Server and the Mirror.
func (n *Node) Close() error {
	var errs []error
	if n.mirror != nil {
		errs = append(errs, n.mirror.Close())
	}
	if n.server != nil {
		errs = append(errs, n.server.Close())
	}
	return errors.Join(errs...)
}

// RowBytes is the row size the node was configured with (--row-bytes); 0
// when none was given.
func (n *Node) RowBytes() int { return n.rowBytes }

// Enabled reports whether the node has peers or listens.
func (n *Node) Enabled() bool { return n.mirror != nil || n.server != nil }

// Addr returns the Server's address, or nil without Listen.
func (n *Node) Addr() net.Addr {
	if n.server == nil {
		return nil
	}
	return n.server.Addr()
}

// Gate returns the replication gate.
func (n *Node) Gate() *Gate { return n.gate }

// ServeLoads reports whether a block lookup may answer "present". Without
// peers it always may; with peers only while mirroring is allowed and every
// peer is up, since a load now could not reach the other ranks.
func (n *Node) ServeLoads() bool {
	return !n.Mirrors() || (n.gate.Allowed() && n.mirror.Healthy())
}

// MirrorBlock writes data, a block whose CRC32C is crc and which the caller
// has verified, into row of region on every peer and returns once each
// acknowledged that checksum. nonZero are the runs of data's non-zero pages
// (block.NonZeroRuns), found by the caller while the block arrived; the
// peers' acknowledgements would not match a block they misdescribe. The
// filesystem calls it while the engine's own read of the block into that row
// is still open (before its last READ returns), so it sends the block, not
// the live row. A non-nil error means a
// peer may hold stale bytes and the load must fail; without peers it does
// nothing.
func (n *Node) MirrorBlock(ctx context.Context, region *Region, row int, data []byte, crc uint32, nonZero []block.Run) error {
	if !n.Mirrors() {
		return nil
	}
	n.noteLocal(region)
	if !n.gate.Allowed() {
		return fmt.Errorf("%w: %s", ErrNotReplicated, n.gate.Snapshot().DecidedBy)
	}
	if len(data) != region.RowBytes() {
		return fmt.Errorf("rowsync: block of %d bytes for rows of %d", len(data), region.RowBytes())
	}
	extents, err := extentsOf(data, nonZero)
	if err != nil {
		return err
	}
	if err := n.mirror.mirror(ctx, region, row, data, extents, func() uint32 { return crc }, func() {}); err != nil {
		return err
	}
	n.rowsMirrored.Add(1)
	return nil
}

// noteLocal tells the Server the row size the filesystem uses region at.
func (n *Node) noteLocal(region *Region) {
	if n.server != nil {
		n.server.NoteLocalRowBytes(region.RowBytes())
	}
}

// Mirrors reports whether the node has peers to mirror loaded rows to: a
// peer list naming only this node's own address has none.
func (n *Node) Mirrors() bool { return n.mirror != nil && n.mirror.Remote() }

// WantStoreSample is called once per stored block and says whether the
// replication gate wants this store sampled with SampleStoredRow.
func (n *Node) WantStoreSample() bool { return n.Mirrors() && n.gate.WantSample() }

// SampleStoredRow is StoreDone for a caller that has already found the row
// holding the stored block, knows its CRC32C and got true from WantStoreSample.
func (n *Node) SampleStoredRow(ctx context.Context, region *Region, row int, key string, crc uint32) error {
	if !n.Mirrors() {
		return nil
	}
	n.noteLocal(region)
	if len(key) > MaxKeyBytes {
		return fmt.Errorf("rowsync: key of %d bytes, limit %d", len(key), MaxKeyBytes)
	}
	return n.mirror.SampleStore(ctx, n.gate, region, row, key, crc)
}

// Snapshot returns the state for stat: one entry per configured peer, plus one
// per other address that sent rows.
func (n *Node) Snapshot() Snapshot {
	s := Snapshot{
		Peers:        []PeerStats{},
		Replication:  n.gate.Snapshot(),
		RowsMirrored: n.rowsMirrored.Load(),
	}
	received := map[string]uint64{}
	if n.server != nil {
		s.AuthFailures = n.server.AuthFailures()
		s.HandshakesEvicted = n.server.HandshakesEvicted()
		s.RowsLate = n.server.RowsLate()
		received = n.server.received()
	}
	if n.mirror != nil {
		s.AuthFailures += n.mirror.AuthFailures()
		s.HandshakesEvicted += n.mirror.HandshakesEvicted()
		_, selfErr := n.mirror.selfEntries()
		for _, p := range n.mirror.peers {
			ps := n.mirror.entryStats(p, selfErr)
			ip := p.ip()
			if rows, ok := received[ip]; ok {
				ps.RowsReceived = rows
				delete(received, ip)
			}
			s.Peers = append(s.Peers, ps)
		}
	}
	for _, ip := range slices.Sorted(maps.Keys(received)) {
		s.Peers = append(s.Peers, PeerStats{Addr: ip, State: StateInbound, RowsReceived: received[ip]})
	}
	return s
}
