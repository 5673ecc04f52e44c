package mount_test

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvtierfs/kvtierfs/integration/engineio"
	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

// TestHeldDescriptorsLeaveTheDaemonItsOwn: every file opened through the
// mount holds one of the daemon's descriptors, so a process of the engine's
// uid holding opens took them all (stores then failed with EIO, and the
// daemon's own work with EMFILE). Under a limit of 400 (prlimit), a thread
// holding opens is refused with ENFILE while a quarter of the limit is still
// free; the refusals are counted and stat warns. The engine's I/O threads
// still store, load and list the tier, stat and /healthz answer (a restart
// would not free what the holder holds), and the warning clears once the
// holder closed its files.
func TestHeldDescriptorsLeaveTheDaemonItsOwn(t *testing.T) {
	const limit, kept = 400, 100
	d := mounttest.Start(t, mounttest.Options{Args: []string{"--metrics-addr", "127.0.0.1:0", "--diagnostics-window", "1s"},
		Wrapper: []string{"prlimit", fmt.Sprintf("--nofile=%d:%d", limit, limit), "--"}})
	if err := os.WriteFile(d.Path("config.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if st := d.Stats(); hasWarning(st.Warnings, "descriptors_low") || st.Descriptors.Limit != limit || st.Descriptors.Kept != kept {
		t.Fatalf("before any open: descriptors %+v, warnings %+v; want a limit of %d, %d kept, no descriptors_low", st.Descriptors, st.Warnings, limit, kept)
	}
	held, err := engineio.HoldOpen(d.Path("config.json"), 2*limit)
	defer func() {
		for _, f := range held {
			f.Close()
		}
	}()
	if !errors.Is(err, syscall.ENFILE) || len(held) < limit/2 {
		t.Fatalf("one thread held %d files open through a daemon limited to %d descriptors, then %v; want at least %d, then ENFILE", len(held), limit, err, limit/2)
	}
	t.Logf("one thread held %d files open through the mount, then %v", len(held), err)
	st := d.Stats()
	if st.Counters.OpensRefused != 1 || !hasWarning(st.Warnings, "descriptors_low") || st.Descriptors.Limit-st.Descriptors.Open >= kept {
		t.Fatalf("after the refusal: %d opens refused, descriptors %+v, warnings %+v; want 1 refused, fewer than %d free, descriptors_low", st.Counters.OpensRefused, st.Descriptors, st.Warnings, kept)
	}

	tier := openTier(t, d)
	region := newRegion(t, 2)
	path := storeBlock(t, tier, region.Row(0), 1)
	if err := tier.Load(path, region.Row(1)); err != nil || !bytes.Equal(region.Row(1), expectedRow(1)) {
		t.Fatalf("load by another thread while one holds the daemon's descriptors: %v", err)
	}
	if names, err := os.ReadDir(filepath.Dir(path)); err != nil || len(names) != 1 {
		t.Fatalf("listing of the block's directory: %v, %v", names, err)
	}
	if out, err := mounttest.Run("stat", d.Mountpoint); err != nil || !strings.Contains(out, "1 open through the mount refused") {
		t.Fatalf("stat while the descriptors are held: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`metrics=http://(\S+)/metrics`).FindStringSubmatch(d.Log())
	if m == nil {
		t.Fatalf("the daemon did not log its metrics address:\n%s", d.Log())
	}
	resp, err := http.Get("http://" + m[1] + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/healthz while the descriptors are held: %s, want 200", resp.Status)
	}

	for _, f := range held {
		f.Close()
	}
	held = nil
	// RELEASE follows close asynchronously: the warning clears once the
	// daemon closed its descriptors and a window passed without a refusal.
	for deadline := time.Now().Add(10 * time.Second); hasWarning(d.Stats().Warnings, "descriptors_low"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("descriptors_low still raised 10 s after every file was closed: %+v", d.Stats().Warnings)
		}
	}
}
