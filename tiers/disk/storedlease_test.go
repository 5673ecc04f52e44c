package disk

import (
	"bytes"
	"os/exec"
	"testing"
	"time"
)

// waitFor polls cond until it holds; the deadline (well below the kernel's
// lease-break-time, 45 s) only turns a hang into a failure.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestLoadWhileABrokenStoredLeaseIsServed: another process's open breaks
// the write lease of a block kept mapped from its store while a load serves
// that mapping, so the mapping is no longer kept. A second load of the
// block meanwhile must neither open the file by name, which waits on the
// daemon's own lease until the first load's release (or fails at once where
// the open is non-blocking), nor be served from that mapping: it reads and
// checks the file through the mapping's descriptor.
func TestLoadWhileABrokenStoredLeaseIsServed(t *testing.T) {
	s := openMemoryStore(t)
	rel, data := blockRel("t", 0, hashHex(1, 64)), pageData(1, 64)
	putBlock(t, s, rel, data)
	first, err := s.PinBlock(rel)
	if err != nil {
		t.Fatal(err)
	}
	m, ok := first.Map()
	if !ok || !m.ProvenAtStore() {
		t.Fatalf("the first load found no mapping kept from the store (%v)", ok)
	}
	reader := exec.Command("cat", s.Path(rel))
	if err := reader.Start(); err != nil {
		t.Fatal(err)
	}
	released := false
	release := func() {
		if !released {
			released = true
			m.Release()
			first.Close()
		}
	}
	defer reader.Wait()
	defer release()
	waitFor(t, "the broken lease's mapping no longer kept", func() bool { return keptMappings(s) == 0 })

	second := make(chan error, 1)
	go func() {
		got, atStore, err := loadLikeTheMount(t, s, rel)
		if err == nil && (atStore || !bytes.Equal(got, data)) {
			t.Errorf("the second load: from the store's mapping %v, same bytes %v", atStore, bytes.Equal(got, data))
		}
		second <- err
	}()
	var loaded error
	waitFor(t, "the second load, while the first still serves the mapping", func() bool {
		select {
		case loaded = <-second:
			return true
		default:
			return false
		}
	})
	if loaded != nil {
		t.Errorf("the second load: %v", loaded)
	}
}

// TestReaderOfAStoreFileLeavesItsServedLoad: an open for reading of a block
// file kept mapped from its store (a backup reading the store) breaks the
// write lease only to a read lease: the load serving the mapping may go on,
// for writers are still kept out, and the mapping is kept no longer. An
// open for writing that follows turns the break into one to no lease, and
// the load may serve no more.
func TestReaderOfAStoreFileLeavesItsServedLoad(t *testing.T) {
	s := openMemoryStore(t)
	rel, data := blockRel("t", 0, hashHex(2, 64)), pageData(2, 64)
	putBlock(t, s, rel, data)
	r, err := s.PinBlock(rel)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	m, ok := r.Map()
	if !ok || !m.ProvenAtStore() {
		t.Fatalf("no mapping kept from the store (%v)", ok)
	}
	reader := exec.Command("cat", s.Path(rel))
	if err := reader.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the reader's break", func() bool { return !m.Held() })
	if !m.KeepsWritersOut() {
		t.Fatal("a reader's open fails the load that serves the mapping")
	}
	writer := exec.Command("sh", "-c", `exec 3>>"$0"`, s.Path(rel))
	if err := writer.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the writer's break", func() bool { return !m.KeepsWritersOut() })
	m.Release()
	if err := reader.Wait(); err != nil {
		t.Errorf("the reader: %v", err)
	}
	if err := writer.Wait(); err != nil {
		t.Errorf("the writer: %v", err)
	}
}
