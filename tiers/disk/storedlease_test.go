package disk

import (
	"bytes"
	"os/exec"
	"testing"
	"time"
)

// TestLoadWhileABrokenStoredLeaseIsServed: another process's open breaks
// the write lease of a block kept mapped from its store while a load serves
// that mapping; the mapping is no longer kept, and a second load of the
// block, which opens the file by name, waits for the first load's release
// and then loads the block: it does not fail on the daemon's own lease.
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
	defer reader.Wait()
	for deadline := time.Now().Add(20 * time.Second); keptMappings(s) != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the broken lease's mapping is still kept")
		}
	}
	second := make(chan error, 1)
	go func() {
		got, _, err := loadLikeTheMount(t, s, rel)
		if err == nil && !bytes.Equal(got, data) {
			t.Error("the second load got other bytes")
		}
		second <- err
	}()
	time.Sleep(100 * time.Millisecond) // room for the second load to fail early, were it to
	m.Release()
	first.Close()
	if err := <-second; err != nil {
		t.Errorf("the second load: %v", err)
	}
}
