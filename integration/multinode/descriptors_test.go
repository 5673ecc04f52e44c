package multinode_test

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"github.com/kvtierfs/kvtierfs/integration/engineio"
)

// TestHeldDescriptorsLeaveThePeerItsLanes: a process holding files open
// through a peer's mount until the peer refuses its opens (ENFILE) leaves
// the peer the descriptors its own work needs: a head started after it
// connects its lanes there, each promotion is mirrored, and the peer's own
// engine still stores and loads. Main's daemon gave every descriptor to the
// holder, and its accepts failed with EMFILE.
func TestHeldDescriptorsLeaveThePeerItsLanes(t *testing.T) {
	head, peer := &node{region: newRegion(t, "A")}, &node{region: newRegion(t, "B")}
	secret, listen := secretFile(t), freeAddr(t)
	const limit = 400
	peer.mount(t, t.TempDir(), []string{"prlimit", "--nofile=" + strconv.Itoa(limit) + ":" + strconv.Itoa(limit), "--"},
		"--listen", listen, "--row-bytes", strconv.Itoa(rowBytes), "--secret-file", secret)
	config := filepath.Join(peer.daemon.Mountpoint, "config.json")
	if err := os.WriteFile(config, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	held, err := engineio.HoldOpen(config, 2*limit)
	defer func() {
		for _, f := range held {
			f.Close()
		}
	}()
	if !errors.Is(err, syscall.ENFILE) || len(held) < limit/2 {
		t.Fatalf("one thread held %d files open through a peer limited to %d descriptors, then %v; want at least %d, then ENFILE", len(held), limit, err, limit/2)
	}

	head.mount(t, t.TempDir(), nil, "--peer", listen, "--secret-file", secret, "--replicated-kv", "on")
	if identical := promoteAll(t, head, peer, 4); identical != 4 {
		t.Fatalf("%d of 4 promoted rows identical on a peer whose descriptors a holder took", identical)
	}
	row := peer.region.Row(rows - 1)
	engineio.FillPattern(row, 99)
	path := peer.tier.BlockPath(tierDir, 0, hashOf(99))
	if _, err := peer.tier.Store(path, row); err != nil {
		t.Fatalf("the peer's own store: %v", err)
	}
	if err := peer.tier.Load(path, row); err != nil {
		t.Fatalf("the peer's own load: %v", err)
	}
	if c := peer.daemon.Stats().Counters; c.OpensRefused != 1 {
		t.Errorf("the peer counted %d opens refused, want 1", c.OpensRefused)
	}
}
