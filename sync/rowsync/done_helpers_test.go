package rowsync

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/kvtierfs/kvtierfs/tiers/block"
	"github.com/kvtierfs/kvtierfs/tiers/shm"
)

// LoadDone and StoreDone drive a Node as the filesystem does: the row that
// holds a block is found in the engine's region by the block's digest
// (shm.Set.Confirm, as fusefs and fusefs/core do), then the Node mirrors the
// row (MirrorBlock) or samples it (SampleStoredRow).

// errNoSingleRow is LoadDone's and StoreDone's error when no row of the
// region holds the block, or more than one does: mirroring a stale copy
// would leave the right row stale on the peers.
var errNoSingleRow = errors.New("rowsync test: no single row of the region holds the block")

// regionSets holds the shm.Set over each region file the tests open
// (openRegion), through which findRow identifies rows.
var regionSets sync.Map // *Region → *shm.Set

// watchRegion makes the region at path findable by findRow until the test ends.
func watchRegion(tb testing.TB, r *Region, path string) {
	tb.Helper()
	set, err := shm.NewSet(path)
	if err != nil {
		tb.Fatal(err)
	}
	if err := set.Refresh(); err != nil {
		tb.Fatal(err)
	}
	regionSets.Store(r, set)
	tb.Cleanup(func() {
		regionSets.Delete(r)
		set.Close()
	})
}

// findRow returns the one row of region that holds data now.
func findRow(region *Region, data []byte) (int, error) {
	set, ok := regionSets.Load(region)
	if !ok {
		return 0, errors.New("rowsync test: region not opened with openRegion")
	}
	ref, ok := set.(*shm.Set).Confirm(block.DigestOf(data), nil)
	if !ok {
		return 0, errNoSingleRow
	}
	return ref.Row, nil
}

// LoadDone finds the row of region that now holds data and mirrors it
// (MirrorBlock); without peers it does nothing.
func (n *Node) LoadDone(ctx context.Context, region *Region, data []byte) error {
	if n.mirror == nil {
		return nil
	}
	if !n.gate.Allowed() {
		return fmt.Errorf("%w: %s", ErrNotReplicated, n.gate.Snapshot().DecidedBy)
	}
	row, err := findRow(region, data)
	if err != nil {
		return err
	}
	return n.MirrorBlock(ctx, region, row, data, block.CRC32C(data), block.NonZeroRuns(data, 0))
}

// StoreDone finds the row of region holding a stored block and, when the gate
// wants this store sampled, compares it with the peers' (SampleStoredRow).
func (n *Node) StoreDone(ctx context.Context, region *Region, key string, data []byte) error {
	if !n.WantStoreSample() {
		return nil
	}
	row, err := findRow(region, data)
	if err != nil {
		return fmt.Errorf("sample %q: %w", key, err)
	}
	return n.SampleStoredRow(ctx, region, row, key, block.CRC32C(data))
}
