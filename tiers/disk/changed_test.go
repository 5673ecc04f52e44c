package disk

import (
	"os"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// ownChanges makes the changes the daemon itself makes to a published
// block's file: a load moves its access time, and through the mount an
// engine sets its times (utimensat) and an xattr. Each moves the file's
// change time, which the test checks, or it would prove nothing.
func ownChanges(t *testing.T, s *Store, rel string) {
	t.Helper()
	var before unix.Stat_t
	if err := unix.Stat(s.Path(rel), &before); err != nil {
		t.Fatal(err)
	}
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
	if ok, err := s.OnFile(rel, func(fd int) error { return unix.Fsetxattr(fd, "user.test", []byte("x"), 0) }); !ok || err != nil {
		t.Fatalf("xattr through the store: %v, %v", ok, err)
	}
	var after unix.Stat_t
	if err := unix.Stat(s.Path(rel), &after); err != nil {
		t.Fatal(err)
	}
	if after.Ctim == before.Ctim {
		t.Fatalf("the daemon's own changes left the change time at %v", after.Ctim)
	}
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
