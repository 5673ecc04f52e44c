package disk

import (
	"bytes"
	"os"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// openMemoryStore opens a store on a tmpfs of its own, mounted in a temp
// directory and unmounted after the test: loads map its blocks.
func openMemoryStore(t *testing.T) *Store {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("kvtier-test", dir, "tmpfs", 0, "size=256m"); err != nil {
		t.Fatalf("mounting a tmpfs for the store: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmounting the store's tmpfs: %v", err)
		}
	})
	return openStore(t, Config{Dir: dir})
}

// putBlockCheckedAtLoad stores a block, then reads its file as anyone may:
// the read's open breaks the write lease of its store, so its first load
// maps and checks it.
func putBlockCheckedAtLoad(t *testing.T, s *Store, rel string, data []byte) {
	t.Helper()
	putBlock(t, s, rel, data)
	if _, err := os.ReadFile(s.Path(rel)); err != nil {
		t.Fatal(err)
	}
	awaitNoWriter(t, s.Path(rel))
}

// awaitNoWriter waits until nothing holds the file at p open for writing
// (a read lease is granted then): the store closes the descriptor of a
// mapping it stopped keeping in the background.
func awaitNoWriter(t *testing.T, p string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		_, err = unix.FcntlInt(f.Fd(), unix.F_SETLEASE, unix.F_RDLCK)
		f.Close()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s is still open for writing: %v", p, err)
		}
	}
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
	putBlockCheckedAtLoad(t, s, rel, data)
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
	putBlockCheckedAtLoad(t, s, rel, data)
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
	putBlockCheckedAtLoad(t, s, rel, old)
	mapAndProve(t, s, rel, old)
	putBlockCheckedAtLoad(t, s, rel, replacement)
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
// least recently used: a quarter of the descriptor limit, 2 under a limit
// of 8 (each holds a descriptor), and never more than maxMappedBlocks.
func TestKeptMappingsAreBounded(t *testing.T) {
	s := openMemoryStore(t)
	if want := mappedBound(descriptorLimit()); s.maxMapped != want {
		t.Fatalf("a store keeps %d mappings, want %d under the descriptor limit %d", s.maxMapped, want, descriptorLimit())
	}
	if got := mappedBound(1 << 20); got != maxMappedBlocks {
		t.Errorf("%d mappings kept under a limit of 2^20, want %d", got, maxMappedBlocks)
	}
	s.maxMapped = mappedBound(8)
	var rels []string
	var blocks [][]byte
	for i := range 3 {
		rel, data := blockRel("t", 0, hashHex(i+1, 64)), pageData(i+1, 64)
		putBlockCheckedAtLoad(t, s, rel, data)
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
