package rowsync

import (
	"context"
	"fmt"
)

// MirrorBlock writes block, whose CRC32C is crc and which the caller has
// verified, into row of region on every peer and returns once each
// acknowledged that checksum. The filesystem calls it while the engine's
// own read of the block into that row is still open, so it sends the block,
// not the live row. A non-nil error means a peer may hold stale bytes and
// the load must fail; without peers it does nothing.
func (n *Node) MirrorBlock(ctx context.Context, region *Region, row int, block []byte, crc uint32) error {
	if n.mirror == nil {
		return nil
	}
	if !n.gate.Allowed() {
		return fmt.Errorf("%w: %s", ErrNotReplicated, n.gate.Snapshot().DecidedBy)
	}
	if len(block) != region.RowBytes() {
		return fmt.Errorf("rowsync: block of %d bytes for rows of %d", len(block), region.RowBytes())
	}
	if err := n.mirror.mirror(ctx, region, row, block, func() uint32 { return crc }, func() {}); err != nil {
		return err
	}
	n.rowsMirrored.Add(1)
	return nil
}
