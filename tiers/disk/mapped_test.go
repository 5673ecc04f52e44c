package disk

import (
	"bytes"
	"os"
	"syscall"
	"testing"
)

// openMemoryStore opens a store on tmpfs (/dev/shm), whose blocks loads map.
func openMemoryStore(t *testing.T) *Store {
	t.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "kvtier-mapped-")
	if err != nil {
		t.Fatalf("a store on tmpfs: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return openStore(t, Config{Dir: dir})
}

// mapAndProve maps block rel as a load does, checks it and releases it,
// returning whether it was kept mapped and proven from an earlier load.
func mapAndProve(t *testing.T, s *Store, rel string, want []byte) (kept bool) {
	t.Helper()
	r, err := s.PinBlock(rel)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	m, ok := r.Map()
	if !ok {
		t.Fatalf("block %s of a store on tmpfs was not mapped", rel)
	}
	defer m.Release()
	kept = m.Proven()
	if !kept {
		if err := r.VerifyMapped(m, func(int) {}); err != nil {
			t.Fatalf("checking the mapping of %s: %v", rel, err)
		}
	}
	if !bytes.Equal(m.Bytes(), want) {
		t.Fatalf("the mapping of %s holds other bytes", rel)
	}
	return kept
}

// keptMappings is how many proven mappings the store keeps between loads.
func keptMappings(s *Store) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mapped.Len()
}

// TestProvenMappingIsKeptForTheNextLoad maps and checks a block once: the
// next load finds it mapped and proven, and Close unmaps it.
func TestProvenMappingIsKeptForTheNextLoad(t *testing.T) {
	s := openMemoryStore(t)
	rel, data := blockRel("t", 0, hashHex(1, 64)), pageData(1, 64)
	putBlock(t, s, rel, data)
	if mapAndProve(t, s, rel, data) {
		t.Fatal("the first load found the block already mapped")
	}
	if !mapAndProve(t, s, rel, data) {
		t.Fatal("the second load did not find the proven mapping kept")
	}
	if n := keptMappings(s); n != 1 {
		t.Fatalf("%d mappings kept, want 1", n)
	}
	s.closeMapped()
	if n := keptMappings(s); n != 0 {
		t.Fatalf("%d mappings kept after closeMapped, want 0", n)
	}
}

// TestIdleKeptMappingGivesItsLeaseBack opens the file of a block kept mapped
// for writing, as the engine's uid may: the kernel signals the lease break
// and the store stops keeping the mapping and gives the lease back, which is
// what lets the open return (without the store's answer the kernel would
// take the lease away only after lease-break-time, the mapping still kept).
// The next load maps the file again and finds the bytes changed.
func TestIdleKeptMappingGivesItsLeaseBack(t *testing.T) {
	s := openMemoryStore(t)
	rel, data := blockRel("t", 0, hashHex(1, 64)), pageData(1, 64)
	putBlock(t, s, rel, data)
	mapAndProve(t, s, rel, data)
	w, err := os.OpenFile(s.Path(rel), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if n := keptMappings(s); n != 0 {
		t.Fatalf("%d mappings kept once a writer opened the file, want 0", n)
	}
	if _, err := w.WriteAt([]byte("changed"), 4096); err != nil {
		t.Fatal(err)
	}
	w.Close()
	r, err := s.PinBlock(rel)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	m, ok := r.Map()
	if !ok || m.Proven() {
		t.Fatalf("load after the write: mapped %v, proven %v; want a new, unproven mapping", ok, ok && m.Proven())
	}
	defer m.Release()
	wantErrno(t, r.VerifyMapped(m, func(int) {}), syscall.EIO, "checking the changed file")
	if s.Contains(rel) {
		t.Fatal("the changed block is still indexed")
	}
}

// TestBlockThatLeavesDropsItsMapping replaces, then removes, a block kept
// mapped: its mapping is dropped each time, and a load of the new bytes
// never sees the old ones.
func TestBlockThatLeavesDropsItsMapping(t *testing.T) {
	s := openMemoryStore(t)
	rel := blockRel("t", 0, hashHex(1, 64))
	old, replacement := pageData(1, 64), pageData(2, 64)
	putBlock(t, s, rel, old)
	mapAndProve(t, s, rel, old)
	putBlock(t, s, rel, replacement)
	if n := keptMappings(s); n != 0 {
		t.Fatalf("%d mappings kept after the block was replaced, want 0", n)
	}
	if mapAndProve(t, s, rel, replacement) {
		t.Fatal("the replaced block was served from a kept mapping")
	}
	if err := s.Remove(rel); err != nil {
		t.Fatal(err)
	}
	if n := keptMappings(s); n != 0 {
		t.Fatalf("%d mappings kept after the block was removed, want 0", n)
	}
}

// TestKeptMappingsAreBounded keeps at most maxMapped mappings, dropping the
// least recently used.
func TestKeptMappingsAreBounded(t *testing.T) {
	s := openMemoryStore(t)
	s.maxMapped = 2
	var rels []string
	var blocks [][]byte
	for i := range 3 {
		rel, data := blockRel("t", 0, hashHex(i+1, 64)), pageData(i+1, 64)
		putBlock(t, s, rel, data)
		rels, blocks = append(rels, rel), append(blocks, data)
	}
	mapAndProve(t, s, rels[0], blocks[0])
	mapAndProve(t, s, rels[1], blocks[1])
	mapAndProve(t, s, rels[0], blocks[0]) // rels[1] is now the least recent
	mapAndProve(t, s, rels[2], blocks[2])
	if n := keptMappings(s); n != 2 {
		t.Fatalf("%d mappings kept, want 2", n)
	}
	if mapAndProve(t, s, rels[1], blocks[1]) {
		t.Fatal("the least recently used mapping was kept past the bound")
	}
	if !mapAndProve(t, s, rels[2], blocks[2]) {
		t.Fatal("a recently used mapping was dropped")
	}
}
