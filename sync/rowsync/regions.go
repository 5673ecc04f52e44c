package rowsync

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kvtierfs/kvtierfs/tiers/block"
	"github.com/kvtierfs/kvtierfs/tiers/shm"
)

// Regions maps the engine's regions read-write for row mirroring: the
// rows peers write into this node, and the geometry of the rows it sends. A
// mapping is made once per region file (path and the file's identity in the
// shm set, device and inode) and row size. A region file the engine
// recreates gets a new mapping, rows found in the old file are refused, and
// the old mapping is unmapped retireAfter later (a request that got it
// before lasts at most a frame's transfer or a sync deadline), so an engine
// restart does not keep the old region's memory alive.
type Regions struct {
	regions *shm.Set
	now     func() time.Time

	mu      sync.Mutex
	mapped  map[regionKey]*Region
	retired []retiredRegion
}

// retireAfter is how long a replaced region's mapping stays mapped.
const retireAfter = time.Minute

// retiredRegion is the mapping of a region file that was replaced, and when.
type retiredRegion struct {
	region *Region
	since  time.Time
}

type regionKey struct {
	path     string
	file     shm.FileID
	rowBytes int
}

// NewRegions returns an empty cache over the regions of set.
func NewRegions(set *shm.Set) *Regions {
	return &Regions{regions: set, now: time.Now, mapped: make(map[regionKey]*Region)}
}

// Get returns the mapping of the region file at path, which must still be
// the file file of the shm set, with rows of rowBytes.
func (c *Regions) Get(path string, file shm.FileID, rowBytes int) (*Region, error) {
	if now, ok := c.regions.FileOf(path); !ok || now != file {
		return nil, fmt.Errorf("region %s was replaced or removed", path)
	}
	key := regionKey{path: path, file: file, rowBytes: rowBytes}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.retireLocked()
	if r, ok := c.mapped[key]; ok {
		return r, nil
	}
	r, err := OpenRegion(path, rowBytes)
	if err != nil {
		return nil, err
	}
	if now, ok := c.regions.FileOf(path); !ok || now != file {
		r.Close()
		return nil, fmt.Errorf("region %s was replaced while it was mapped", path)
	}
	c.mapped[key] = r
	return r, nil
}

// Sweep retires the mappings of files the shm set no longer has and unmaps
// those retired long enough; the mount calls it at every region refresh.
func (c *Regions) Sweep() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.retireLocked()
}

// retireLocked retires the mappings of files the shm set no longer has
// (replaced or removed) and unmaps those retired more than retireAfter ago.
func (c *Regions) retireLocked() {
	now := c.now()
	for k, r := range c.mapped {
		if file, ok := c.regions.FileOf(k.path); !ok || file != k.file {
			c.retired = append(c.retired, retiredRegion{region: r, since: now})
			delete(c.mapped, k)
		}
	}
	kept := c.retired[:0]
	for _, r := range c.retired {
		if now.Sub(r.since) >= retireAfter {
			r.region.Close()
		} else {
			kept = append(kept, r)
		}
	}
	c.retired = kept
}

// Local is the RegionFunc of this node: its one region of rowBytes rows.
func (c *Regions) Local(rowBytes int) (*Region, error) {
	if err := c.regions.Refresh(); err != nil {
		return nil, err
	}
	path, ok := c.regions.PathFor(int64(rowBytes))
	if !ok {
		return nil, fmt.Errorf("no single shm region of %d-byte rows matches --shm-glob", rowBytes)
	}
	file, ok := c.regions.FileOf(path)
	if !ok {
		return nil, fmt.Errorf("region %s vanished", path)
	}
	return c.Get(path, file, rowBytes)
}

// Close unmaps every region.
func (c *Regions) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, r := range c.mapped {
		r.Close()
		delete(c.mapped, k)
	}
	for _, r := range c.retired {
		r.region.Close()
	}
	c.retired = nil
}

// LoadMirror mirrors the rows loads fill through a node (the mount's
// core.Mirror): each row is written into the same row of every peer's region.
type LoadMirror struct {
	node    *Node
	regions *Regions
}

// NewLoadMirror returns the mirror of node's loads, whose rows regions maps.
func NewLoadMirror(node *Node, regions *Regions) *LoadMirror {
	return &LoadMirror{node: node, regions: regions}
}

// Mirrors reports whether loads must reach the peers before they return.
func (m *LoadMirror) Mirrors() bool { return m.node.Mirrors() }

// MirrorRow writes a loaded row, data at ref with CRC32C crc and non-zero
// pages nonZero, into every peer's region and waits for their acknowledgements.
func (m *LoadMirror) MirrorRow(ctx context.Context, ref shm.RowRef, data []byte, crc uint32, nonZero []block.Run) error {
	region, err := m.regions.Get(ref.Region, ref.File, len(data))
	if err != nil {
		return err
	}
	return m.node.MirrorBlock(ctx, region, ref.Row, data, crc, nonZero)
}

// ErrSourceRowNotFound is StoreSampler.Sample's answer when no row of the
// engine's regions holds the stored block: nothing is sampled.
var ErrSourceRowNotFound = errors.New("the stored block's source row was not found")

// Digests gives a stored block's digest by its store-relative path (the
// block store).
type Digests interface {
	Digest(rel string) (block.Digest, bool)
}

// StoreSampler gives the replication gate its evidence: the source row of a
// block just stored, found among the engine's regions while the engine still
// holds it, compared with the same row on every peer (Node.SampleStoredRow).
type StoreSampler struct {
	node    *Node
	digests Digests
	rows    *shm.Set
	regions *Regions
}

// NewStoreSampler returns the sampler of node's stores, whose digests come
// from digests and whose source rows are found in rows and mapped by regions.
func NewStoreSampler(node *Node, digests Digests, rows *shm.Set, regions *Regions) *StoreSampler {
	return &StoreSampler{node: node, digests: digests, rows: rows, regions: regions}
}

// Sample compares the stored block at rel with the peers' copies of its
// source row, when the gate still wants samples; a nil sampler (one node)
// samples nothing.
func (s *StoreSampler) Sample(ctx context.Context, rel string) error {
	if s == nil || !s.node.WantStoreSample() {
		return nil
	}
	d, ok := s.digests.Digest(rel)
	if !ok {
		return nil
	}
	ref, ok := s.rows.Confirm(d, nil)
	if !ok {
		return ErrSourceRowNotFound
	}
	region, err := s.regions.Get(ref.Region, ref.File, int(d.Size))
	if err != nil {
		return err
	}
	return s.node.SampleStoredRow(ctx, region, ref.Row, rel, d.CRC)
}
