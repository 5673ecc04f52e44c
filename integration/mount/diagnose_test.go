package mount_test

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/kvtierfs/kvtierfs/integration/engineio"
	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

// diagRow is the row size of the diagnostics tests: one page, so that the
// thousands of blocks the thresholds need stay small.
var diagRow = engineio.PageSize

// diagWindow is the tests' diagnostics window: long enough that a loaded
// machine still fits each test's stores and lookups inside one window.
const diagWindow = 3 * time.Second

// The rules are unit tests of staging/diagnose and the events that feed
// them a test of fusefs (TestMountFeedsTheDiagnostics), without waiting out a
// window; what stays here needs the engine's region and the whole daemon: a
// warning reaching stats.json, and a healthy workload staying quiet.

// diagMount mounts with a diagWindow diagnostics window and a 64 KiB write-only
// threshold, and a region of regionRows rows of diagRow bytes.
func diagMount(t *testing.T, regionRows int) (*mounttest.Daemon, *engineio.Tier, *engineio.Region) {
	t.Helper()
	region, err := engineio.CreateRegion(fmt.Sprintf("/dev/shm/kvtier-test-diag-%s-%d.mmap", t.Name(), os.Getpid()), regionRows, diagRow)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { region.Close() })
	d := mounttest.Start(t, mounttest.Options{ShmGlob: region.Path,
		Args: []string{"--diagnostics-window", diagWindow.String(), "--diagnostics-min-bytes", "64KiB", "--staging-bytes", "0"}})
	// No rule judges a mount younger than its window.
	time.Sleep(diagWindow + 100*time.Millisecond)
	return d, openTier(t, d), region
}

// storeSmall stores block i of group g with one-page content.
func storeSmall(t *testing.T, tier *engineio.Tier, region *engineio.Region, g, i int) string {
	t.Helper()
	row := region.Row(0)
	fillRow(row, i)
	path := tier.BlockPath(tierDir, g, hashOf(i))
	if _, err := tier.Store(path, row); err != nil {
		t.Fatal(err)
	}
	return path
}

// warningsAfterWindow waits out the read grace (a quarter of the window) and
// returns the warning codes.
func warningsAfterWindow(t *testing.T, d *mounttest.Daemon) map[string]string {
	t.Helper()
	time.Sleep(diagWindow/4 + 100*time.Millisecond)
	codes := map[string]string{}
	for _, w := range d.Stats().Warnings {
		codes[w.Code] = w.Message
	}
	return codes
}

func TestDiagnosePrimaryTierExhaustion(t *testing.T) {
	const rows = 64
	d, tier, region := diagMount(t, rows)
	// Keys answer present but are never read: the engine's matching walk ate
	// its primary rows and vetoed the hit.
	for i := 0; i < rows+8; i++ {
		path := storeSmall(t, tier, region, 0, i)
		if !tier.Exists(path) {
			t.Fatalf("block %d absent", i)
		}
	}
	if codes := warningsAfterWindow(t, d); codes["primary_tier_exhausted"] == "" {
		t.Fatalf("warnings %v: want primary_tier_exhausted", codes)
	}
}

func TestDiagnoseHealthyWorkloadIsQuiet(t *testing.T) {
	d, tier, region := diagMount(t, 64)
	for i := 0; i < 64; i++ {
		path := storeSmall(t, tier, region, 0, i)
		storeSmall(t, tier, region, 1, 100+i)
		if !tier.Exists(path) || !tier.Exists(tier.BlockPath(tierDir, 1, hashOf(100+i))) {
			t.Fatalf("block %d absent", i)
		}
		for _, p := range []string{path, tier.BlockPath(tierDir, 1, hashOf(100+i))} {
			if err := tier.Load(p, region.Row(1)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if codes := warningsAfterWindow(t, d); len(codes) != 0 {
		t.Fatalf("a healthy workload raised warnings: %v", codes)
	}
}
