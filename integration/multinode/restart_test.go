package multinode_test

import (
	"testing"
)

// TestFreshPairIsNotMirroringOff mounts a healthy pair that has stored
// nothing yet: stat shows no mirroring_off warning, only undecided auto.
func TestFreshPairIsNotMirroringOff(t *testing.T) {
	addr := freeAddr(t)
	head, _, _ := twoNodes(t, true, nil, nil, addr, addr)
	waitPeerUp(t, head)
	st := head.daemon.Stats()
	for _, w := range st.Warnings {
		if w.Code == "mirroring_off" {
			t.Fatalf("a fresh healthy pair warns %s: %s", w.Code, w.Message)
		}
	}
	if st.Replication == nil || st.Replication.Allowed || st.Replication.Samples != 0 {
		t.Fatalf("replication of a fresh pair %+v, want auto undecided", st.Replication)
	}
}

// TestRestartKeepsReplicationEvidence stores replicated rows (auto samples
// them and mirrors), restarts the head on its full store and looks the
// blocks up without storing anything new: they answer present at once.
func TestRestartKeepsReplicationEvidence(t *testing.T) {
	addr := freeAddr(t)
	head, peer, secret := twoNodes(t, true, nil, nil, addr, addr)
	const chunks = 4
	storeChunks(t, head, peer, chunks, true)
	if st := head.daemon.Stats(); st.Replication == nil || !st.Replication.Allowed {
		t.Fatalf("replication %+v after identical samples, want mirroring allowed", st.Replication)
	}

	store := head.daemon.Store
	if err := head.daemon.Stop(); err != nil {
		t.Fatalf("stopping the head: %v", err)
	}
	head.mount(t, store, nil, "--peer", addr, "--secret-file", secret)
	waitPeerUp(t, head)
	for i := range chunks {
		if !head.tier.Exists(head.tier.BlockPath(tierDir, 0, hashOf(i))) {
			t.Errorf("chunk %d answers absent after the restart", i)
		}
	}
	st := head.daemon.Stats()
	if st.Replication == nil || !st.Replication.Allowed || st.Counters.LookupsWithheld != 0 {
		t.Fatalf("after the restart: replication %+v, %d lookups withheld; want mirroring allowed and none withheld",
			st.Replication, st.Counters.LookupsWithheld)
	}
	if st.Counters.Writes != 0 {
		t.Fatalf("%d stores after the restart: the test must not give auto new samples", st.Counters.Writes)
	}
}
