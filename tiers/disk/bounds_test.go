package disk

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/tiers/batch"
)

// TestLookupCursorsBounded looks a block up from many more threads than
// batch.MaxCursors within one prefix gap, as a flood of match requests (one
// thread id each) does: the store remembers at most batch.MaxCursors of them.
func TestLookupCursorsBounded(t *testing.T) {
	clock := newFakeClock()
	s := openStore(t, Config{Now: clock.Now})
	rel := blockRel("T", 0, hashHex(1, 64))
	putBlock(t, s, rel, pageData(1, 1))
	for thread := range uint32(10 * batch.MaxCursors) {
		if !s.Lookup(rel, thread) {
			t.Fatal("the block answered absent")
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lookups.Len() > batch.MaxCursors {
		t.Fatalf("%d lookup cursors remembered, limit %d", s.lookups.Len(), batch.MaxCursors)
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
	st := writeOther(t, first, "config.json", pageData(1, 16))
	allocated := st.Blocks * 512
	if _, free := first.Reach(); free != capacity-allocated {
		t.Fatalf("free %d with a file of %d bytes allocated in a %d-byte store", free, allocated, capacity)
	}
	wantErrno(t, first.ReserveOther(capacity, &st, "config.json"), syscall.ENOSPC, "a whole capacity more")
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

// writeOther writes a file outside the block layout as the mount does:
// create it, reserve room for its bytes, write them, settle what it
// allocates. It returns the file's attributes.
func writeOther(t *testing.T, s *Store, rel string, data []byte) unix.Stat_t {
	t.Helper()
	f, err := os.OpenFile(s.Path(rel), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	if err := s.ReserveOther(int64(len(data)), &st, rel); err != nil {
		t.Fatalf("ReserveOther(%s): %v", rel, err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	s.SettleOther(&st, int64(len(data)))
	return st
}

// TestOtherFilesBounded: the engine's uid makes files outside the block
// layout without end (each counts against the capacity, but the table of
// them grew by one per file, ~100M entries for a large store). The table
// holds at most MaxOtherFiles: a write that would take another place is
// refused with EDQUOT, a tracked file is still written, a refusal for space
// takes no place, and files found past the bound at Open count against the
// capacity (never too little) without taking places.
func TestOtherFilesBounded(t *testing.T) {
	const capacity = 1 << 20
	const bound = 3
	dir := t.TempDir()
	if _, err := Open(Config{Dir: dir, Capacity: capacity, MaxOtherFiles: -1}); err == nil {
		t.Fatal("a negative bound on the other files was taken")
	}
	s, err := Open(Config{Dir: dir, Capacity: capacity, MaxOtherFiles: bound})
	if err != nil {
		t.Fatal(err)
	}
	var allocated int64
	var st unix.Stat_t
	perFile := make([]int64, bound)
	for i := range bound {
		st = writeOther(t, s, fmt.Sprintf("f%d", i), pageData(i, 1))
		perFile[i] = st.Blocks * 512
		allocated += perFile[i]
	}
	if err := s.ReserveOther(1, &st, "f2"); err != nil {
		t.Errorf("a write to a tracked file with the table full: %v", err)
	}
	s.SettleOther(&st, 1)

	f, err := os.OpenFile(s.Path("more"), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var more unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &more); err != nil {
		t.Fatal(err)
	}
	wantErrno(t, s.ReserveOther(4096, &more, "more"), syscall.EDQUOT, "a fourth file of three")
	if n := s.Counters().OtherFilesRefused.Load(); n != 1 {
		t.Errorf("%d refusals counted, want 1", n)
	}
	if st := s.Stats(); st.OtherFiles != bound || st.OtherFilesMax != bound {
		t.Errorf("stats: %d other files of at most %d, want %d of %d", st.OtherFiles, st.OtherFilesMax, bound, bound)
	}

	gone := s.RemovingOther("f0")
	if err := os.Remove(s.Path("f0")); err != nil {
		t.Fatal(err)
	}
	gone()
	allocated -= perFile[0]
	wantErrno(t, s.ReserveOther(2*capacity, &more, "more"), syscall.ENOSPC, "more than the capacity")
	if n := s.Stats().OtherFiles; n != bound-1 {
		t.Errorf("%d other files after a refusal for space, want %d: the refused file kept a place", n, bound-1)
	}
	if err := s.ReserveOther(4096, &more, "more"); err != nil {
		t.Fatalf("a file taking the place of a removed one: %v", err)
	}
	if _, err := f.Write(pageData(9, 1)); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fstat(int(f.Fd()), &more); err != nil {
		t.Fatal(err)
	}
	s.SettleOther(&more, 4096)
	allocated += more.Blocks * 512
	if _, free := s.Reach(); free != capacity-allocated {
		t.Errorf("free %d, want %d: the other files' bytes", free, capacity-allocated)
	}
	s.Close()

	s = openStore(t, Config{Dir: dir, Capacity: capacity, MaxOtherFiles: bound - 1})
	if st := s.Stats(); st.OtherFiles != bound-1 || st.OtherFilesUntracked != 1 {
		t.Errorf("reopened with a bound of %d: %d tracked, %d untracked; want %d and 1", bound-1, st.OtherFiles, st.OtherFilesUntracked, bound-1)
	}
	if _, free := s.Reach(); free != capacity-allocated {
		t.Errorf("reopened: free %d, want %d: a file past the bound must still count", free, capacity-allocated)
	}
	refused := 0
	for _, rel := range []string{"f1", "f2", "more"} {
		st, err := s.Lstat(rel)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.ReserveOther(1, &st, rel); errors.Is(err, syscall.EDQUOT) {
			refused++
			continue
		} else if err != nil {
			t.Fatal(err)
		}
		s.SettleOther(&st, 1)
	}
	if refused != 1 {
		t.Errorf("%d of the three files refused a write, want the one past the bound", refused)
	}
}
