package access_test

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

// TestRegionsOfOtherUsersAreLeft: /dev/shm is every local user's, and stat
// and gc-regions run as root. Under the glob: a region the engine's user
// maps (a live engine), an orphan it left, and another user's 1 TiB sparse
// file. stat counts the engine's orphan alone as orphaned and the other
// user's file apart (it listed that file as an orphan, and gc-regions
// removed it); gc-regions --engine-uid lists it as not the engine's and
// leaves it, and without --engine-uid leaves the engine's files too.
func TestRegionsOfOtherUsersAreLeft(t *testing.T) {
	engine, other := newUser(t, "eng"), newUser(t, "oth")
	helper, _ := binaries(t, sharedDir(t))
	prefix := fmt.Sprintf("/dev/shm/kvtier-access-gc-%d-", os.Getpid())
	glob := prefix + "*.mmap"
	live, orphan, foreign := prefix+"live.mmap", prefix+"orphan.mmap", prefix+"foreign.mmap"
	for _, p := range []string{live, orphan, foreign} {
		t.Cleanup(func() { os.Remove(p) })
	}
	if line := startHelperAs(t, engine, helper, "region", live); line != "mapped" {
		t.Fatalf("the engine's region: %s", line)
	}
	if out, ok := as(engine, nil, "truncate", "-s", "1M", orphan); !ok {
		t.Fatalf("the engine's orphan: %s", out)
	}
	if out, ok := as(other, nil, "truncate", "-s", "1T", foreign); !ok {
		t.Fatalf("the other user's file: %s", out)
	}
	d := mounttest.Start(t, mounttest.Options{ShmGlob: glob, Args: []string{"--allow-other", "--engine-uid", strconv.Itoa(engine.uid)}})

	out, err := mounttest.Run("stat", d.Mountpoint, "--shm-glob", glob)
	if err != nil || !strings.Contains(out, "orphaned regions: 1 mapped by no process") || !strings.Contains(out, orphan+"  1.0 MiB") ||
		strings.Contains(out, foreign+"  1.0 TiB") || !strings.Contains(out, "other users' files under the glob: 1 (1.0 TiB), not the engine's regions") {
		t.Fatalf("stat: %v\n%s", err, out)
	}

	notEngines := func(u testUser, path, size string) string {
		return fmt.Sprintf("not the engine's (uid %d): left %s (%s)", u.uid, path, size)
	}
	engineUID := strconv.Itoa(engine.uid)
	out, err = mounttest.Run("gc-regions", "--shm-glob", glob, "--engine-uid", engineUID, "--dry-run")
	if !strings.Contains(out, notEngines(other, foreign, "1.0 TiB")) || strings.Contains(out, "orphaned "+foreign) || strings.Contains(out, "remove "+foreign) ||
		!(strings.Contains(out, "would remove "+orphan) || strings.Contains(out, "not proven orphaned "+orphan)) {
		t.Errorf("gc-regions --dry-run: %v\n%s", err, out)
	}
	out, err = mounttest.Run("gc-regions", "--shm-glob", glob)
	if !strings.Contains(out, notEngines(engine, orphan, "1.0 MiB")) || !strings.Contains(out, notEngines(engine, live, "256.0 KiB")) ||
		!strings.Contains(out, notEngines(other, foreign, "1.0 TiB")) || !strings.Contains(out, "0 orphaned regions removed") {
		t.Errorf("gc-regions without --engine-uid: %v\n%s", err, out)
	}
	// gc-regions refuses when some process cannot be read (a sandbox's PID 1):
	// what it removes is checked in cmd/kvtierfs; here that it never takes
	// the other user's file or the live region.
	out, err = mounttest.Run("gc-regions", "--shm-glob", glob, "--engine-uid", engineUID)
	if !strings.Contains(out, notEngines(other, foreign, "1.0 TiB")) || strings.Contains(out, "removed "+live) {
		t.Errorf("gc-regions --engine-uid: %v\n%s", err, out)
	}
	for _, p := range []string{live, foreign} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("gc-regions took %s: %v", p, err)
		}
	}
}
