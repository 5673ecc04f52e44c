package disk

import (
	"errors"
	"os"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/internal/testsys"
)

// ownChanges makes the changes the daemon itself makes to a published
// block's file: a load moves its access time, and through the mount an
// engine sets its times (utimensat) and an xattr, set again until the
// file's change time moved, or the test would prove nothing.
func ownChanges(t *testing.T, s *Store, rel string) {
	t.Helper()
	r, err := s.PinBlock(rel)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Accessed(); err != nil {
		t.Fatal(err)
	}
	r.Close()
	if _, err := s.SetTimes(rel, unix.Timespec{Sec: 1}, unix.Timespec{Sec: 2}); err != nil {
		t.Fatal(err)
	}
	testsys.UntilChangeTimeMoves(t, s.Path(rel), func() {
		if ok, err := s.ChangeOnFile(rel, func(fd int) error { return unix.Fsetxattr(fd, "user.test", []byte("x"), 0) }); !ok || err != nil {
			t.Fatalf("xattr through the store: %v, %v", ok, err)
		}
	})
}

// TestOwnChangesAreNotOutside: after the daemon's own changes to a block's
// file, a block whose bytes no longer match (the disk's doing: Misrecord)
// counts as a checksum failure, not as changed outside the daemon.
func TestOwnChangesAreNotOutside(t *testing.T) {
	s := openStore(t, Config{Capacity: 1 << 30})
	rel := blockRel(testTier, 0, hashHex(1, 64))
	putBlock(t, s, rel, pageData(1, 2))
	ownChanges(t, s, rel)
	s.Misrecord(rel)
	_, err := s.OpenBlock(rel)
	wantErrno(t, err, syscall.EIO, "OpenBlock of a block the disk changed")
	if failures, outside := s.Counters().ChecksumFailures.Load(), s.Counters().ChangedOutside.Load(); failures != 1 || outside != 0 {
		t.Errorf("%d checksum failures, %d changed outside; want 1 and 0", failures, outside)
	}
}

// TestChangeOutsideOutlivesOwnChanges: a block written in the store tree
// counts as changed outside the daemon even once the daemon changed its
// file itself since.
func TestChangeOutsideOutlivesOwnChanges(t *testing.T) {
	s := openStore(t, Config{Capacity: 1 << 30})
	rel := blockRel(testTier, 0, hashHex(1, 64))
	putBlock(t, s, rel, pageData(1, 2))
	flipByte(t, s.Path(rel), 5)
	ownChanges(t, s, rel)
	_, err := s.OpenBlock(rel)
	wantErrno(t, err, syscall.EIO, "OpenBlock of a block written in the store tree")
	if failures, outside := s.Counters().ChecksumFailures.Load(), s.Counters().ChangedOutside.Load(); failures != 0 || outside != 1 {
		t.Errorf("%d checksum failures, %d changed outside; want 0 and 1", failures, outside)
	}
}

// TestReplacedFileIsChangedOutside: another file renamed over a block's
// name in the store tree, the block's bytes but not its file, counts as
// changed outside when it fails its checksum.
func TestReplacedFileIsChangedOutside(t *testing.T) {
	s := openStore(t, Config{Capacity: 1 << 30})
	rel := blockRel(testTier, 0, hashHex(1, 64))
	putBlock(t, s, rel, pageData(1, 2))
	other := s.Path(rel) + ".other"
	data := pageData(2, 2)
	if err := os.WriteFile(other, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := unix.Rename(other, s.Path(rel)); err != nil {
		t.Fatal(err)
	}
	_, err := s.OpenBlock(rel)
	wantErrno(t, err, syscall.EIO, "OpenBlock of another file under a block's name")
	if got := s.Counters().ChangedOutside.Load(); got != 1 {
		t.Errorf("%d changed outside, want 1", got)
	}
}

// TestOnlyChangesTakeTheBlocksLock: a read of a block's xattrs (vLLM reads
// its checksum's at every load) takes no change lock; a change takes its
// own block's only.
func TestOnlyChangesTakeTheBlocksLock(t *testing.T) {
	s := openStore(t, Config{Capacity: 1 << 30})
	rel, other := blockRel(testTier, 0, hashHex(1, 64)), blockRel(testTier, 0, hashHex(2, 64))
	putBlock(t, s, rel, pageData(1, 2))
	putBlock(t, s, other, pageData(2, 2))
	s.mu.Lock()
	b, o := s.blocks[rel], s.blocks[other]
	s.mu.Unlock()
	free := func(e *entry) bool {
		if !e.changing.TryLock() {
			return false
		}
		e.changing.Unlock()
		return true
	}
	var whileRead, whileChanged, otherWhileChanged bool
	if _, err := s.ReadOnFile(rel, func(fd int) error {
		whileRead = free(b)
		_, err := unix.Fgetxattr(fd, "user.test", nil)
		if err == unix.ENODATA {
			return nil
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ChangeOnFile(rel, func(fd int) error {
		whileChanged, otherWhileChanged = free(b), free(o)
		return unix.Fsetxattr(fd, "user.test", []byte("x"), 0)
	}); err != nil {
		t.Fatal(err)
	}
	if !whileRead || whileChanged || !otherWhileChanged {
		t.Errorf("block's change lock free while its xattr was read %v, while set %v; another block's while set %v; want true, false, true",
			whileRead, whileChanged, otherWhileChanged)
	}
}

// TestPublishedTmpTakesNoChange: an xattr call that found a tmp before its
// publish and ran after it is ENOENT, never an unrecorded change of the
// block's file through the tmp's descriptor (the writer still holds it).
func TestPublishedTmpTakesNoChange(t *testing.T) {
	s := openStore(t, Config{Capacity: 1 << 30})
	rel := blockRel(testTier, 0, hashHex(1, 64))
	mkdirFor(t, s, rel)
	tmp := tmpRelFor(rel, int(tmpSeq.Add(1)))
	w, err := s.CreateTmp(tmp, engineCreateFlags)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := w.WriteAt(pageData(1, 2), 0); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	tf := s.tmps[tmp]
	s.mu.Unlock()
	if err := s.Publish(tmp, rel); err != nil {
		t.Fatal(err)
	}
	ran := false
	err = tf.onFile(func(int) error { ran = true; return nil })
	if !errors.Is(err, syscall.ENOENT) || ran {
		t.Errorf("a call on the tmp after its publish: %v, ran %v; want ENOENT, not run", err, ran)
	}
}

// TestEntrySize: an entry is one per block (millions): it stays in Go's
// 288-byte size class, its file's state without a size, which the entry's
// own stands for: a file of another size is another than the one seen.
func TestEntrySize(t *testing.T) {
	if size := unsafe.Sizeof(entry{}); size > 288 {
		t.Errorf("entry is %d bytes, want 288 or less", size)
	}
	var st unix.Stat_t
	if err := unix.Stat(os.DevNull, &st); err != nil {
		t.Fatal(err)
	}
	seen := &entry{size: st.Size, seen: stateOf(&st)}
	resized := &entry{size: st.Size + 1, seen: stateOf(&st)}
	if !seen.sameFile(&st) || resized.sameFile(&st) {
		t.Errorf("the file seen is the same %v, at another size %v; want true, false", seen.sameFile(&st), resized.sameFile(&st))
	}
}
