package rowsync

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvtierfs/kvtierfs/tiers/block"
	"github.com/kvtierfs/kvtierfs/tiers/shm"
)

// TestReplacedRegionIsUnmapped recreates the engine's region file (an engine
// restart) and then removes it: each old mapping is retired at once and
// unmapped retireAfter later, so no restart keeps a region's memory alive.
func TestReplacedRegionIsUnmapped(t *testing.T) {
	const rowBytes, rows = 8192, 4
	path := filepath.Join(t.TempDir(), "vllm_offload_test.mmap")
	create := func() {
		os.Remove(path)
		if err := os.WriteFile(path, make([]byte, rowBytes*rows), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	create()
	set, err := shm.NewSet(path)
	if err != nil {
		t.Fatal(err)
	}
	defer set.Close()
	set.Refresh()
	clock := time.Unix(1000, 0)
	c := NewRegions(set)
	c.now = func() time.Time { return clock }
	defer c.Close()
	if _, err := c.Local(rowBytes); err != nil {
		t.Fatal(err)
	}
	create() // the engine restarted: same name, new file
	set.Refresh()
	if _, err := c.Local(rowBytes); err != nil {
		t.Fatal(err)
	}
	if len(c.mapped) != 1 || len(c.retired) != 1 {
		t.Fatalf("after the restart: %d mapped, %d retired; want 1 and 1", len(c.mapped), len(c.retired))
	}
	clock = clock.Add(retireAfter)
	os.Remove(path) // the engine is gone
	set.Refresh()
	c.Sweep()
	if len(c.mapped) != 0 || len(c.retired) != 1 {
		t.Fatalf("after the engine left: %d mapped, %d retired; want 0 and 1 (the old file's mapping unmapped)", len(c.mapped), len(c.retired))
	}
	clock = clock.Add(retireAfter)
	c.Sweep()
	if len(c.retired) != 0 {
		t.Fatalf("%d mappings still retired after %s", len(c.retired), retireAfter)
	}
}

// A load's row reaches the same row of the peer's region through
// LoadMirror, and a row found in a region file the engine has since
// recreated is refused, the peer's row left as it was.
func TestLoadMirrorWritesThePeersRow(t *testing.T) {
	path, set, regions, local, peerRegion, node := twoNodes(t, ModeOn)
	mirror := NewLoadMirror(node, regions)
	if !mirror.Mirrors() {
		t.Fatal("a node with a peer does not mirror its loads")
	}
	file, _ := set.FileOf(path)
	load := func(row int) error {
		fillHalf(local.Row(row), uint64(row))
		data := bytes.Clone(local.Row(row))
		ref := shm.RowRef{Region: path, File: file, Row: row}
		return mirror.MirrorRow(context.Background(), ref, data, block.CRC32C(data), block.NonZeroRuns(data, 0))
	}
	if err := load(3); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(peerRegion.Row(3), local.Row(3)) {
		t.Fatal("the peer's row differs from the loaded one")
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, make([]byte, testRows*testRowBytes), 0o600); err != nil {
		t.Fatal(err)
	}
	set.Refresh()
	if err := load(5); err == nil {
		t.Fatal("a row of the replaced region file was mirrored")
	}
	if !block.IsZero(peerRegion.Row(5)) {
		t.Fatal("the peer's row was written for a row of the replaced region file")
	}
}

// digestMap is Digests over a map.
type digestMap map[string]block.Digest

func (m digestMap) Digest(rel string) (block.Digest, bool) {
	d, ok := m[rel]
	return d, ok
}

// TestStoreSamplerSamplesTheSourceRow: the source row of a stored block,
// found among the engine's regions, is compared with the peer's copy; a
// block whose bytes no row holds and a block the store does not know are
// not sampled, and a sampler of one node (nil) samples nothing.
func TestStoreSamplerSamplesTheSourceRow(t *testing.T) {
	var single *StoreSampler
	if err := single.Sample(context.Background(), "a"); err != nil {
		t.Fatalf("one node's sampler: %v", err)
	}
	_, set, regions, local, peerRegion, node := twoNodes(t, ModeAuto)
	fillHalf(local.Row(2), 2)
	fillHalf(peerRegion.Row(2), 2)
	elsewhere := bytes.Repeat([]byte{7}, testRowBytes)
	s := NewStoreSampler(node, digestMap{"a": block.DigestOf(local.Row(2)), "elsewhere": block.DigestOf(elsewhere)}, set, regions)
	if err := s.Sample(context.Background(), "unknown"); err != nil {
		t.Fatalf("a block the store does not know: %v", err)
	}
	if err := s.Sample(context.Background(), "elsewhere"); !errors.Is(err, ErrSourceRowNotFound) {
		t.Fatalf("a block no row holds: %v, want ErrSourceRowNotFound", err)
	}
	if got := node.gate.Snapshot().Samples; got != 0 {
		t.Fatalf("%d samples before a source row was found", got)
	}
	if err := s.Sample(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	if g := node.gate.Snapshot(); g.Samples != 1 || g.Mismatches != 0 {
		t.Fatalf("after one identical row: %d samples, %d mismatches; want 1, 0", g.Samples, g.Mismatches)
	}
}

// twoNodes starts a node over the region file at path (in the shm set,
// mapped by regions, its rows local) with one peer over peerRegion, both in
// mode, and waits for the peer to be up.
func twoNodes(t *testing.T, mode Mode) (path string, set *shm.Set, regions *Regions, local, peerRegion *Region, node *Node) {
	t.Helper()
	path = shmFile(t, testRows*testRowBytes)
	set, err := shm.NewSet(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { set.Close() })
	set.Refresh()
	regions = NewRegions(set)
	t.Cleanup(regions.Close)
	if local, err = regions.Local(testRowBytes); err != nil {
		t.Fatal(err)
	}
	peerRegion = shmRegion(t, testRows, testRowBytes)
	peer := startNode(t, peerRegion, mode)
	node = startNode(t, local, mode, peer.Addr().String())
	waitFor(t, "peer up", node.mirror.Healthy)
	return path, set, regions, local, peerRegion, node
}
