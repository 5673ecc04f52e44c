package multinode_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/kvtierfs/kvtierfs/sync/rowsync"
)

// A present block answers absent while the peer is down, within the peer's
// detection and the kernel's entry lifetime, and present again at the first
// lookup once the peer is back: a withheld answer is never cached (DESIGN
// "Lookups and the kernel's caches"), whereas other absent names are for an
// hour.
func TestWithheldLookupsEndWithThePeersReturn(t *testing.T) {
	addr := freeAddr(t)
	head, peer, secret := twoNodes(t, true, nil, nil, addr, addr)
	storeChunks(t, head, peer, 4, true)
	present := head.tier.BlockPath(tierDir, 0, hashOf(0))
	if !head.tier.Exists(present) {
		t.Fatal("a stored block answers absent while the peer is up")
	}

	peer.daemon.Stop()
	for start := time.Now(); head.tier.Exists(present); time.Sleep(50 * time.Millisecond) {
		if time.Since(start) > 10*time.Second {
			t.Fatal("a lookup still answers present 10 s after the peer went down")
		}
	}
	if head.tier.Exists(present) {
		t.Fatal("a lookup answered present again while the peer is down")
	}

	peer.mount(t, t.TempDir(), nil, "--listen", addr, "--row-bytes", strconv.Itoa(rowBytes), "--secret-file", secret)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if ps := head.daemon.Stats().Peers; len(ps) == 1 && ps[0].State == rowsync.StateUp {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the peer is not up 30 s after it came back: %+v", head.daemon.Stats().Peers)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !head.tier.Exists(present) {
		t.Fatal("a block withheld while the peer was down still answers absent after it came back")
	}
}
