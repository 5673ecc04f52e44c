package rowsync

import (
	"os"
	"path/filepath"
	"testing"
	"time"

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
