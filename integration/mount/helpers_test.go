// Package mount_test runs one kvtierfs mount end to end, as the engine uses
// it: stores, lookups, loads and matches through a real FUSE mount, with
// faults, hostile input, the control files and the service around it.
// Mirroring between nodes is integration/multinode's.
package mount_test

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvtierfs/kvtierfs/integration/engineio"
	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

func TestMain(m *testing.M) { mounttest.Main(m) }

// rowBytes is the CI-size row: 64 pages.
const rowBytes = 256 << 10

// tierDir is the engine's per-model directory used by these tests.
const tierDir = "TestModel_0123456789ab_r0"

// hashOf is the chunk hash of block i.
func hashOf(i int) string {
	sum := sha256.Sum256([]byte(fmt.Sprintf("chunk-%d", i)))
	return hex.EncodeToString(sum[:])
}

// fillRow writes the deterministic content of block i into row.
func fillRow(row []byte, i int) { engineio.FillPattern(row, uint64(i)) }

// expectedRow is the content of block i.
func expectedRow(i int) []byte {
	row := make([]byte, rowBytes)
	fillRow(row, i)
	return row
}

// newRegion creates a shm region under /dev/shm that is removed at cleanup.
func newRegion(t *testing.T, rows int) *engineio.Region {
	t.Helper()
	path := fmt.Sprintf("/dev/shm/kvtier-test-%s-%d.mmap", filepath.Base(t.Name()), os.Getpid())
	r, err := engineio.CreateRegion(path, rows, rowBytes)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// openTier opens the engine's view of a mount and checks the O_DIRECT probe.
func openTier(t *testing.T, d *mounttest.Daemon) *engineio.Tier {
	t.Helper()
	tier, err := engineio.OpenTier(d.Mountpoint)
	if err != nil {
		t.Fatal(err)
	}
	if !tier.Direct {
		t.Fatal("O_DIRECT probe failed on the mount: the engine would fall back to buffered I/O")
	}
	return tier
}

// storeBlock stores block i from a region row.
func storeBlock(t *testing.T, tier *engineio.Tier, row []byte, i int) string {
	t.Helper()
	fillRow(row, i)
	path := tier.BlockPath(tierDir, 0, hashOf(i))
	if _, err := tier.Store(path, row); err != nil {
		t.Fatal(err)
	}
	return path
}
