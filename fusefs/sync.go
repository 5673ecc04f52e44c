package fusefs

import (
	"context"
	"fmt"
	"sync"
	"syscall"

	"github.com/kvtierfs/kvtierfs/fusefs/core"
	rowsync "github.com/kvtierfs/kvtierfs/sync"
	"github.com/kvtierfs/kvtierfs/tiers/shm"
)

// SyncRegions maps the engine's regions read-write for row mirroring: the
// rows this node sends and the rows peers write into it. A mapping is made
// once per region file (path and inode) and row size, and stays mapped until
// Close, because the mirror and the server may use it at any time; a region
// file the engine recreates gets a new mapping.
type SyncRegions struct {
	regions *shm.Set

	mu     sync.Mutex
	mapped map[syncRegionKey]*rowsync.Region
}

type syncRegionKey struct {
	path     string
	ino      uint64
	rowBytes int
}

// NewSyncRegions returns an empty cache over the regions of set.
func NewSyncRegions(set *shm.Set) *SyncRegions {
	return &SyncRegions{regions: set, mapped: make(map[syncRegionKey]*rowsync.Region)}
}

// Get returns the mapping of the region file at path with rows of rowBytes.
func (c *SyncRegions) Get(path string, rowBytes int) (*rowsync.Region, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return nil, fmt.Errorf("region %s: %w", path, err)
	}
	key := syncRegionKey{path: path, ino: st.Ino, rowBytes: rowBytes}
	c.mu.Lock()
	defer c.mu.Unlock()
	if r, ok := c.mapped[key]; ok {
		return r, nil
	}
	r, err := rowsync.OpenRegion(path, rowBytes)
	if err != nil {
		return nil, err
	}
	c.mapped[key] = r
	return r, nil
}

// Local is the rowsync.RegionFunc of this node: its one region of rowBytes rows.
func (c *SyncRegions) Local(rowBytes int) (*rowsync.Region, error) {
	if err := c.regions.Refresh(); err != nil {
		return nil, err
	}
	path, ok := c.regions.PathFor(int64(rowBytes))
	if !ok {
		return nil, fmt.Errorf("no single shm region of %d-byte rows matches --shm-glob", rowBytes)
	}
	return c.Get(path, rowBytes)
}

// Close unmaps every region.
func (c *SyncRegions) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, r := range c.mapped {
		r.Close()
		delete(c.mapped, k)
	}
}

// rowMirror is the peers as loads reach them; nil on a single node.
func (f *FS) rowMirror() core.Mirror {
	if f.sync == nil {
		return nil
	}
	return &peerMirror{node: f.sync, regions: f.syncRegions}
}

// peerMirror mirrors loaded rows through the sync node.
type peerMirror struct {
	node    *rowsync.Node
	regions *SyncRegions
}

func (m *peerMirror) Mirrors() bool { return m.node.Mirrors() }

func (m *peerMirror) MirrorRow(ctx context.Context, ref shm.RowRef, block []byte, crc uint32) error {
	region, err := m.regions.Get(ref.Region, len(block))
	if err != nil {
		return err
	}
	return m.node.MirrorBlock(ctx, region, ref.Row, block, crc)
}

// sampleStore lets the replication gate compare a stored block's source row
// with the same row on every peer, while the engine still holds the row.
func (f *FS) sampleStore(ctx context.Context, rel string) {
	if f.sync == nil || f.regions == nil || !f.sync.WantStoreSample() {
		return
	}
	d, ok := f.store.Digest(rel)
	if !ok {
		return
	}
	ref, ok := f.regions.Confirm(d, nil)
	if !ok {
		f.logger.Debug("store not sampled: its source row was not found", "path", rel)
		return
	}
	region, err := f.syncRegions.Get(ref.Region, int(d.Size))
	if err == nil {
		err = f.sync.SampleStoredRow(ctx, region, ref.Row, rel, d.CRC)
	}
	if err != nil {
		f.logger.Warn("store sample for the replication gate failed", "path", rel, "err", err)
	}
}
