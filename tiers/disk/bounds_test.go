package disk

import (
	"os"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestLookupCursorsBounded looks a block up from many more threads than
// maxCursors within one prefix gap, as a flood of match requests (one
// thread id each) does: the store remembers at most maxCursors of them.
func TestLookupCursorsBounded(t *testing.T) {
	clock := newFakeClock()
	s := openStore(t, Config{Now: clock.Now})
	rel := blockRel("T", 0, hashHex(1, 64))
	putBlock(t, s, rel, pageData(1, 1))
	for thread := range uint32(10 * maxCursors) {
		if !s.Lookup(rel, thread) {
			t.Fatal("the block answered absent")
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.cursors) > maxCursors {
		t.Fatalf("%d lookup cursors remembered, limit %d", len(s.cursors), maxCursors)
	}
}

// TestOwnerOfStoreFiles opens a store for another owner: the root and a
// block tmp file (and the block it becomes) belong to it, owner-only.
func TestOwnerOfStoreFiles(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("giving files to another uid needs root")
	}
	owner := Owner{UID: 4242, GID: 4343}
	s := openStore(t, Config{Owner: &owner})
	rel := blockRel("T", 0, hashHex(1, 64))
	tmp := writeTmp(t, s, rel, pageData(1, 1))
	want := map[string]os.FileMode{"": os.ModeDir | PrivateDirMode, tmp: PrivateFileMode}
	for p, mode := range want {
		fi, err := os.Stat(s.Path(p))
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode() != mode || int(st.Uid) != owner.UID || int(st.Gid) != owner.GID {
			t.Errorf("%q: mode %v, owner %d:%d; want %v, %d:%d", p, fi.Mode(), st.Uid, st.Gid, mode, owner.UID, owner.GID)
		}
	}
}

// TestOtherFilesCounted writes and removes a file outside the block
// layout: it counts against the capacity with what it allocates, a write
// over the capacity is refused, and the count survives a restart.
func TestOtherFilesCounted(t *testing.T) {
	const capacity = 1 << 20
	dir := t.TempDir()
	first, err := Open(Config{Dir: dir, Capacity: capacity})
	if err != nil {
		t.Fatal(err)
	}
	if err := first.ReserveOther(64<<10, "config.json"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(first.Path("config.json"), pageData(1, 16), 0o600); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(first.Path("config.json"), &st); err != nil {
		t.Fatal(err)
	}
	first.SettleOther(&st, 64<<10)
	allocated := st.Blocks * 512
	if _, free := first.Reach(); free != capacity-allocated {
		t.Fatalf("free %d with a file of %d bytes allocated in a %d-byte store", free, allocated, capacity)
	}
	wantErrno(t, first.ReserveOther(capacity, "config.json"), syscall.ENOSPC, "a whole capacity more")
	first.Close()

	s := openStore(t, Config{Dir: dir, Capacity: capacity})
	if _, free := s.Reach(); free != capacity-allocated {
		t.Fatalf("after a restart: free %d, want %d", free, capacity-allocated)
	}
	gone := s.RemovingOther("config.json")
	if err := os.Remove(s.Path("config.json")); err != nil {
		t.Fatal(err)
	}
	gone()
	if _, free := s.Reach(); free != capacity {
		t.Fatalf("free %d after removing the only file, want %d", free, capacity)
	}
}
