package disk

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/tiers/block"
	"github.com/kvtierfs/kvtierfs/tiers/internal/beneath"
)

// failPwrite makes the store's writes land only the first `land` bytes, in
// a short write, and then fail with ENOSPC, until the test ends.
func failPwrite(t *testing.T, land int) {
	t.Helper()
	left := land
	pwriteAt = func(fd int, p []byte, off int64) (int, error) {
		if left == 0 {
			return 0, syscall.ENOSPC
		}
		n := min(len(p), left)
		left -= n
		return unix.Pwrite(fd, p[:n], off)
	}
	t.Cleanup(func() { pwriteAt = unix.Pwrite })
}

// A short write (a store filesystem nearly full) advances the tmp's size and
// checksum over the bytes that landed only, and returns the capacity reserved
// for the rest.
func TestShortPwrite(t *testing.T) {
	for _, flags := range []int{engineCreateFlags, syscall.O_CREAT | syscall.O_EXCL | syscall.O_WRONLY} {
		s := openStore(t, Config{Capacity: 1 << 30})
		rel := evName(int(flags & syscall.O_DIRECT))
		mkdirFor(t, s, rel)
		tmp := tmpRelFor(rel, 1)
		w, err := s.CreateTmp(tmp, flags)
		if err != nil {
			t.Fatal(err)
		}
		data := pageData(7, 4)
		// O_DIRECT writes land in whole pages; buffered ones at any byte.
		landed := 2*block.PageSize + 100
		if flags&syscall.O_DIRECT != 0 {
			landed = 2 * block.PageSize
		}
		failPwrite(t, landed)
		n, err := w.WriteAt(data, 0)
		wantErrno(t, err, syscall.ENOSPC, "write failing after a short write")
		if n != landed {
			t.Fatalf("WriteAt = %d, want the %d bytes that landed", n, landed)
		}
		pwriteAt = unix.Pwrite
		w.tmp.mu.Lock()
		size, crc, allocated := w.tmp.size, w.tmp.sum.CRC(), w.tmp.allocated
		w.tmp.mu.Unlock()
		if size != int64(landed) || crc != crcOf(data[:landed]) || allocated != int64(landed) {
			t.Fatalf("tmp size %d crc %08x allocated %d; want %d, %08x, %d", size, crc, allocated, landed, crcOf(data[:landed]), landed)
		}
		if usedBytes(s) != int64(landed) {
			t.Fatalf("used = %d, want %d: capacity reserved for unwritten bytes kept", usedBytes(s), landed)
		}
		// The writer may go on from where the bytes end.
		if n, err := w.WriteAt(data[landed:], int64(landed)); err != nil || n != len(data)-landed {
			t.Fatalf("resuming the write: %d, %v", n, err)
		}
		w.Close()
		if err := s.Publish(tmp, rel); err != nil {
			t.Fatal(err)
		}
		if got := readBlock(t, s, rel); !bytes.Equal(got, data) {
			t.Fatal("block bytes differ after a resumed short write")
		}
	}
}

// A short write followed by success is retried: the whole write lands.
func TestShortPwriteRetried(t *testing.T) {
	s := openStore(t, Config{Capacity: 1 << 30})
	calls := 0
	pwriteAt = func(fd int, p []byte, off int64) (int, error) {
		calls++
		if calls == 1 && len(p) > block.PageSize {
			return unix.Pwrite(fd, p[:block.PageSize], off)
		}
		return unix.Pwrite(fd, p, off)
	}
	t.Cleanup(func() { pwriteAt = unix.Pwrite })
	rel := evName(0)
	putBlock(t, s, rel, pageData(3, 3))
	if calls < 2 {
		t.Fatalf("%d writes: the short write was not continued", calls)
	}
	if got := readBlock(t, s, rel); !bytes.Equal(got, pageData(3, 3)) {
		t.Fatal("wrong bytes")
	}
}

// A tmp file whose writer closed it and never renamed it (a killed engine
// thread) is removed once older than TmpMaxAge and its bytes released; an
// open one is kept however old.
func TestTmpExpires(t *testing.T) {
	clock := newFakeClock()
	s := openStore(t, Config{Capacity: 1 << 30, Now: clock.Now, TmpMaxAge: time.Minute})
	abandoned := writeTmp(t, s, evName(0), pageData(0, 2))
	openRel := evName(1)
	mkdirFor(t, s, openRel)
	openTmp := tmpRelFor(openRel, 99)
	w, err := s.CreateTmp(openTmp, engineCreateFlags)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteAt(pageData(1, 1), 0); err != nil {
		t.Fatal(err)
	}
	clock.Advance(30 * time.Second)
	writeTmp(t, s, evName(2), pageData(2, 1)) // a sweep within the bound
	if !exists(t, s.Path(abandoned)) || !s.IsTracked(abandoned) {
		t.Fatal("tmp removed before its age bound")
	}
	clock.Advance(31 * time.Second)
	young := writeTmp(t, s, evName(3), pageData(3, 1)) // a sweep past it
	if exists(t, s.Path(abandoned)) || s.IsTracked(abandoned) {
		t.Fatal("abandoned tmp kept past its age bound")
	}
	if !exists(t, s.Path(openTmp)) || !s.IsTracked(openTmp) || !exists(t, s.Path(young)) {
		t.Fatal("an open or young tmp was removed")
	}
	if got := s.Counters().TmpsExpired.Load(); got != 1 {
		t.Fatalf("TmpsExpired = %d, want 1", got)
	}
	w.Close()
	checkAccounting(t, s)
}

// Abandoned tmp files that fill the capacity do not make stores fail: they
// are expired when room is needed. Before expiry, the refusal names them.
func TestAbandonedTmpsDoNotFillTheStore(t *testing.T) {
	clock := newFakeClock()
	s := openStore(t, Config{Capacity: 4 * page64, Now: clock.Now, TmpMaxAge: time.Minute})
	for i := range 4 {
		writeTmp(t, s, evName(i), pageData(i, 1))
	}
	rel := evName(9)
	mkdirFor(t, s, rel)
	w, err := s.CreateTmp(tmpRelFor(rel, 1), engineCreateFlags)
	if err != nil {
		t.Fatal(err)
	}
	_, err = w.WriteAt(pageData(9, 1), 0)
	wantErrno(t, err, syscall.ENOSPC, "write into a store full of young tmp files")
	if !strings.Contains(err.Error(), "5 tmp files not yet renamed") {
		t.Errorf("ENOSPC message %q does not name the tmp files", err)
	}
	clock.Advance(2 * time.Minute)
	if _, err := w.WriteAt(pageData(9, 1), 0); err != nil {
		t.Fatalf("write after the tmp files expired: %v", err)
	}
	w.Close()
	if err := s.Publish(tmpRelFor(rel, 1), rel); err != nil {
		t.Fatal(err)
	}
	if got := s.Counters().TmpsExpired.Load(); got != 4 {
		t.Errorf("TmpsExpired = %d, want 4", got)
	}
	checkAccounting(t, s)
}

// A directory holding a tracked tmp file counts as holding blocks: renaming
// it would lose track of the tmp.
func TestDirectoryWithTmpHoldsBlocks(t *testing.T) {
	s := openStore(t, Config{Capacity: 1 << 30})
	rel := evName(0)
	tmp := writeTmp(t, s, rel, pageData(0, 1))
	dir := filepath.Dir(rel)
	if !s.HasBlocksUnder(dir) || !s.HasBlocksUnder(testTier) {
		t.Fatal("directory holding a tmp file reported empty of blocks")
	}
	if err := s.RemoveTmp(tmp); err != nil {
		t.Fatal(err)
	}
	if s.HasBlocksUnder(dir) {
		t.Fatal("directory still reported holding blocks")
	}
}

// copyWithRecord copies a block file and its digest record over another path.
func copyWithRecord(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	rec, ok := storeRecord(t, from)
	if !ok {
		t.Fatalf("%s has no record", from)
	}
	if err := os.WriteFile(to, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(to, block.RecordXattr, rec, 0); err != nil {
		t.Fatal(err)
	}
}

// A block file replaced by another block's bytes and record (a restore gone
// wrong, a copy over the wrong name) is refused at Open: the record names
// the block it was written for.
func TestRecordBindsTheBlockName(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Config{Dir: dir, Capacity: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	a, b := evName(0), evName(2) // same group, same size
	putBlock(t, s, a, pageData(0, 2))
	putBlock(t, s, b, pageData(2, 2))
	s.Close()
	copyWithRecord(t, filepath.Join(dir, b), filepath.Join(dir, a))
	s = openStore(t, Config{Dir: dir, Capacity: 1 << 30})
	if s.Contains(a) {
		got := readBlock(t, s, a)
		t.Fatalf("block %s indexed with another block's bytes and record (serves block b: %v)", a, bytes.Equal(got, pageData(2, 2)))
	}
	if !s.Contains(b) {
		t.Fatal("the genuine block was not indexed")
	}
	if got := s.Counters().UnprovenBlocks.Load(); got != 1 {
		t.Errorf("UnprovenBlocks = %d, want 1", got)
	}
}

// A published block whose record was stripped (a copy without xattrs) is
// not indexed.
func TestStrippedRecordRefused(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Config{Dir: dir, Capacity: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	rel := evName(0)
	putBlock(t, s, rel, pageData(0, 2))
	s.Close()
	if err := unix.Removexattr(filepath.Join(dir, rel), block.RecordXattr); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, Config{Dir: dir, Capacity: 1 << 30})
	if s.Contains(rel) || s.Counters().UnprovenBlocks.Load() != 1 {
		t.Fatalf("block without its record: indexed %v, unproven %d", s.Contains(rel), s.Counters().UnprovenBlocks.Load())
	}
}

// Records in the formats written before records were bound to their whole
// name (v1: nothing, v2: no tier) are read, and bound to the block's name at
// Open; they carry no chunk CRCs, so the block is proven whole, and its first
// read adds them.
func TestOlderRecordsUpgraded(t *testing.T) {
	for _, version := range []string{"v1", "v2"} {
		t.Run(version, func(t *testing.T) {
			dir := t.TempDir()
			s, err := Open(Config{Dir: dir, Capacity: 1 << 30})
			if err != nil {
				t.Fatal(err)
			}
			rel := evName(0)
			_, name := block.Parse(rel)
			putBlock(t, s, rel, pageData(0, 2))
			s.Close()
			p := filepath.Join(dir, rel)
			rec, _ := storeRecord(t, p)
			d, _, _, err := block.UnmarshalRecord(rec)
			if err != nil || len(d.Chunks) != 1 {
				t.Fatalf("published record %x: %v, %d chunk CRCs", rec, err, len(d.Chunks))
			}
			old := binary.BigEndian.AppendUint64(nil, uint64(d.Size))
			old = binary.BigEndian.AppendUint32(old, d.CRC)
			old = append(old, byte(len(d.Samples)))
			for _, smp := range d.Samples {
				old = binary.BigEndian.AppendUint32(old, smp.Off)
				old = binary.BigEndian.AppendUint64(old, smp.Value)
			}
			if version == "v2" {
				key := append([]byte{0x02}, binary.BigEndian.AppendUint64(nil, uint64(name.Group))...)
				key = append(append(key, byte(len(name.Hash))), name.Hash...)
				old = append(key, old...)
			}
			if err := unix.Setxattr(p, block.RecordXattr, old, 0); err != nil {
				t.Fatal(err)
			}
			s = openStore(t, Config{Dir: dir, Capacity: 1 << 30})
			if !s.Contains(rel) {
				t.Fatalf("block with a %s record not indexed", version)
			}
			now, _ := storeRecord(t, p)
			back, binding, bound, err := block.UnmarshalRecord(now)
			if err != nil || !bound || binding != name.Binding() || back.CRC != d.CRC || back.Chunks != nil {
				t.Fatalf("record after Open %x: %v, bound to %+v (%v), %d chunk CRCs; want bound to %+v", now, err, binding, bound, len(back.Chunks), name.Binding())
			}
			got, err := s.ReadBlock(rel)
			if err != nil || !bytes.Equal(got, pageData(0, 2)) {
				t.Fatalf("ReadBlock: %v, or wrong bytes", err)
			}
			s.RecycleBlock(got)
			if now, _ := storeRecord(t, p); !bytes.Equal(now, rec) {
				t.Fatalf("record after the first read %x, want the record a store writes %x", now, rec)
			}
			checkAccounting(t, s)
		})
	}
}

// A block copied with its xattrs from another rank's tier (`…_r1` into
// `…_r0`) carries a record bound to that tier: it is left unindexed, while
// the original is served.
func TestBlockCopiedFromAnotherTierRefused(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Config{Dir: dir, Capacity: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	h := hashHex(1, 64)
	r1 := blockRel("model_0123456789ab_r1", 0, h)
	r0 := blockRel("model_0123456789ab_r0", 0, h)
	putBlock(t, s, r1, pageData(1, 2))
	s.Close()
	data, err := os.ReadFile(filepath.Join(dir, r1))
	if err != nil {
		t.Fatal(err)
	}
	rec, _ := storeRecord(t, filepath.Join(dir, r1))
	copyTo := filepath.Join(dir, r0)
	if err := os.MkdirAll(filepath.Dir(copyTo), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(copyTo, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(copyTo, block.RecordXattr, rec, 0); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, Config{Dir: dir, Capacity: 1 << 30})
	if s.Contains(r0) {
		t.Fatal("a block copied with its record from tier _r1 into _r0 is indexed")
	}
	if !s.Contains(r1) {
		t.Fatal("the original block is not indexed")
	}
	if got := s.Counters().UnprovenBlocks.Load(); got != 1 {
		t.Errorf("UnprovenBlocks = %d, want 1", got)
	}
}

// A tmp swapped for a symbolic link (to a root-only file) before its rename
// is refused: the target is neither opened for writing, extended nor given an
// xattr, and no block appears. The same for a tmp swapped for another file.
func TestPublishRefusesSwappedTmp(t *testing.T) {
	for _, swap := range []string{"symlink", "other file"} {
		t.Run(swap, func(t *testing.T) {
			s := openStore(t, Config{Capacity: 1 << 30})
			target := filepath.Join(t.TempDir(), "shadow")
			secret := []byte("root:x:0:0::/:/bin\n")[:17]
			if err := os.WriteFile(target, secret, 0o600); err != nil {
				t.Fatal(err)
			}
			rel := evName(0)
			tmp := writeTmp(t, s, rel, pageData(0, 64))
			if err := os.Remove(s.Path(tmp)); err != nil {
				t.Fatal(err)
			}
			if swap == "symlink" {
				err := os.Symlink(target, s.Path(tmp))
				if err != nil {
					t.Fatal(err)
				}
			} else if err := os.WriteFile(s.Path(tmp), pageData(5, 64), 0o600); err != nil {
				t.Fatal(err)
			}
			err := s.Publish(tmp, rel)
			wantErrno(t, err, syscall.EPERM, "Publish of a swapped tmp")
			if got, _ := os.ReadFile(target); !bytes.Equal(got, secret) {
				t.Fatalf("link target changed: %d bytes", len(got))
			}
			if rec, ok := storeRecord(t, target); ok {
				t.Fatalf("link target got the store's xattr %x", rec)
			}
			if s.Contains(rel) || exists(t, s.Path(rel)) {
				t.Fatal("a block was published from the swapped tmp")
			}
			if got := s.Counters().PublishRefused.Load(); got != 1 {
				t.Errorf("PublishRefused = %d, want 1", got)
			}
		})
	}
}

// A tmp name that is a hard link to another file (a published block) is not
// opened for writing.
func TestCreateTmpRefusesHardLink(t *testing.T) {
	s := openStore(t, Config{Capacity: 1 << 30})
	rel := evName(0)
	putBlock(t, s, rel, pageData(0, 1))
	tmp := tmpRelFor(rel, 5)
	if err := os.Link(s.Path(rel), s.Path(tmp)); err != nil {
		t.Fatal(err)
	}
	_, err := s.CreateTmp(tmp, syscall.O_CREAT|syscall.O_WRONLY|syscall.O_TRUNC)
	wantErrno(t, err, syscall.EPERM, "CreateTmp over a hard link to a block")
	if got := readBlock(t, s, rel); !bytes.Equal(got, pageData(0, 1)) {
		t.Fatal("block changed")
	}
}

// A directory of the layout replaced by a symbolic link leading out of the
// store is not followed by CreateTmp.
// Both with openat2 and with the walk used where it is missing.
func TestCreateTmpDoesNotFollowDirectoryLinks(t *testing.T) {
	eachResolver(t, testCreateTmpDoesNotFollowDirectoryLinks)
}

func testCreateTmpDoesNotFollowDirectoryLinks(t *testing.T) {
	s := openStore(t, Config{Capacity: 1 << 30})
	outside := t.TempDir()
	rel := evName(0)
	dir := filepath.Dir(s.Path(rel))
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, dir); err != nil {
		t.Fatal(err)
	}
	_, err := s.CreateTmp(tmpRelFor(rel, 1), engineCreateFlags)
	if err == nil {
		t.Fatal("CreateTmp through a directory link succeeded")
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Fatalf("file created outside the store: %v", entries)
	}
}

// A removal never follows a directory of the layout replaced by a link out
// of the store.
func TestRemoveDoesNotFollowDirectoryLinks(t *testing.T) {
	eachResolver(t, testRemoveDoesNotFollowDirectoryLinks)
}

func testRemoveDoesNotFollowDirectoryLinks(t *testing.T) {
	s := openStore(t, Config{Capacity: 1 << 30})
	rel := evName(0)
	putBlock(t, s, rel, pageData(0, 1))
	outside := t.TempDir()
	victim := filepath.Join(outside, filepath.Base(rel))
	if err := os.WriteFile(victim, []byte("not the store's"), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Dir(s.Path(rel))
	if err := os.Rename(dir, dir+".moved"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, dir); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(rel); err == nil {
		t.Error("Remove through a directory link succeeded")
	}
	if !exists(t, victim) {
		t.Fatal("Remove deleted a file outside the store")
	}
}

// A rename that arrives before the writer's release (the kernel releases
// asynchronously) counts the bytes once, as the block's, and the kept
// descriptor is closed at the release.
func TestPublishBeforeCloseAccounting(t *testing.T) {
	s := openStore(t, Config{Capacity: 1 << 30})
	rel := evName(0)
	mkdirFor(t, s, rel)
	tmp := tmpRelFor(rel, 1)
	w, err := s.CreateTmp(tmp, engineCreateFlags)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteAt(pageData(0, 2), 0); err != nil {
		t.Fatal(err)
	}
	if err := s.Publish(tmp, rel); err != nil {
		t.Fatal(err)
	}
	checkAccounting(t, s)
	if w.tmp.file == nil {
		t.Fatal("descriptor closed while the writer still holds it")
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if w.tmp.file != nil {
		t.Fatal("descriptor kept after publish and release")
	}
	checkAccounting(t, s)
	if got := readBlock(t, s, rel); !bytes.Equal(got, pageData(0, 2)) {
		t.Fatal("wrong bytes")
	}
}

// eachResolver runs a test with openat2 and again as on a kernel without it
// (openat2 answering ENOSYS), where the store walks paths itself.
func eachResolver(t *testing.T, test func(t *testing.T)) {
	t.Run("openat2", test)
	t.Run("walk", func(t *testing.T) {
		withoutOpenat2(t)
		test(t)
	})
}

// withoutOpenat2 makes the store walk its paths, as where openat2 answers
// ENOSYS, until the test ends.
func withoutOpenat2(t *testing.T) {
	t.Cleanup(beneath.WithoutOpenat2())
}

// Without openat2 the walk still resolves the layout (a block stores and
// loads), refuses a link in any directory of a path and a final link, and
// never leaves the root.
func TestWalkWithoutOpenat2(t *testing.T) {
	withoutOpenat2(t)
	s := openStore(t, Config{Capacity: 1 << 30})
	rel := evName(0)
	putBlock(t, s, rel, pageData(0, 1))
	if got := readBlock(t, s, rel); !bytes.Equal(got, pageData(0, 1)) {
		t.Fatal("wrong bytes through the walk")
	}
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "f"), []byte("outside"), 0o600); err != nil {
		t.Fatal(err)
	}
	tier := filepath.Join(s.Root(), "linked")
	if err := os.Symlink(outside, tier); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "f"), filepath.Join(s.Root(), "final")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		rel  string
		want syscall.Errno
	}{
		{"linked/f", syscall.ENOTDIR},
		{"final", syscall.ELOOP},
		{"../" + filepath.Base(outside) + "/f", syscall.EXDEV},
		{"/etc/passwd", syscall.EXDEV},
	} {
		f, err := s.openFile(c.rel, os.O_RDONLY, 0)
		if err == nil {
			f.Close()
			t.Errorf("%s opened through the walk", c.rel)
			continue
		}
		wantErrno(t, err, c.want, c.rel)
	}
}

// What the mount resolves its operations with (OpenAt, OpenParent, Lstat)
// refuses a linked directory anywhere in a path, with openat2 and without,
// and still resolves the names beneath the root.
func TestMountResolutionRefusesLinks(t *testing.T) {
	eachResolver(t, func(t *testing.T) {
		s := openStore(t, Config{Capacity: 1 << 30})
		outside := t.TempDir()
		if err := os.MkdirAll(filepath.Join(outside, "d"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(s.Root(), "T", "d"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(outside, filepath.Join(s.Root(), "L")); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Lstat("T/d"); err != nil {
			t.Fatalf("Lstat T/d: %v", err)
		}
		dirfd, name, err := s.OpenParent("T/d/x")
		if err != nil || name != "x" {
			t.Fatalf("OpenParent T/d/x: %q, %v", name, err)
		}
		unix.Close(dirfd)
		if st, err := s.Lstat("L"); err != nil || st.Mode&unix.S_IFMT != unix.S_IFLNK {
			t.Fatalf("Lstat of the link itself: mode %o, %v", st.Mode, err)
		}
		for _, rel := range []string{"L/d", "L/d/x"} {
			if _, err := s.Lstat(rel); !errors.Is(err, unix.ENOTDIR) && !errors.Is(err, unix.ELOOP) {
				t.Errorf("Lstat %s: %v, want ENOTDIR or ELOOP", rel, err)
			}
			if fd, _, err := s.OpenParent(rel + "/y"); err == nil {
				unix.Close(fd)
				t.Errorf("OpenParent %s/y opened a directory through the link", rel)
			}
			if fd, err := s.OpenAt(rel, unix.O_RDONLY|unix.O_DIRECTORY, 0); err == nil {
				unix.Close(fd)
				t.Errorf("OpenAt %s opened a directory through the link", rel)
			}
		}
	})
}

// TestRecordForgedInTheStoreTree: the engine's uid owns the store tree, so
// it can write a published block's bytes and digest record there directly
// (DESIGN "Threat model"). While the store is open that changes nothing it
// serves: loads check the digest the store holds from the publish, so the
// forged bytes fail (EIO) and the block is dropped. A record forged alone,
// left for the next Open, is taken as the block's digest, and the block's
// own bytes then fail its first load: bytes that disagree with the record
// on the file are never served either way.
func TestRecordForgedInTheStoreTree(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Config{Dir: dir, Capacity: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	stored, forged := pageData(0, 2), pageData(7, 2)
	forge := func(rel string, data []byte) {
		t.Helper()
		_, name := block.Parse(rel)
		rec, err := block.DigestOf(forged).MarshalRecord(name.Binding())
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, rel)
		if data != nil {
			if err := os.WriteFile(p, data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if err := unix.Setxattr(p, block.RecordXattr, rec, 0); err != nil {
			t.Fatal(err)
		}
	}
	open, later := evName(0), evName(2)
	putBlock(t, s, open, stored)
	putBlock(t, s, later, stored)

	forge(open, forged)
	if data, err := s.ReadBlock(open); !errors.Is(err, syscall.EIO) {
		t.Errorf("load of a block whose bytes and record were forged in the store tree: %v (forged bytes: %v); want EIO",
			err, err == nil && bytes.Equal(data, forged))
	}
	if s.Contains(open) {
		t.Error("the forged block is still indexed after its failed load")
	}

	forge(later, nil)
	s.Close()
	s = openStore(t, Config{Dir: dir, Capacity: 1 << 30})
	if data, err := s.ReadBlock(later); !errors.Is(err, syscall.EIO) {
		t.Errorf("load of a block whose record alone was forged before Open: %v (its own bytes: %v); want EIO",
			err, err == nil && bytes.Equal(data, stored))
	}
}

// TestBlockSwappedForAFIFOIsDropped: a FIFO the engine's uid put at a
// published block's name in the store tree fails the block's load at once,
// and the block is dropped; main's open waited for a writer to the FIFO.
func TestBlockSwappedForAFIFOIsDropped(t *testing.T) {
	s := openStore(t, Config{Capacity: 1 << 30})
	rel := evName(0)
	putBlock(t, s, rel, pageData(0, 2))
	if err := os.Remove(s.Path(rel)); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(s.Path(rel), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ReadBlock(rel); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("load of a block that is a FIFO in the store: %v, want ENOENT", err)
	}
	if s.Contains(rel) {
		t.Error("the block swapped for a FIFO is still indexed")
	}
}

// TestRefusedWriteIsNoIOError: a write the store filesystem refuses for what
// the caller asked (EFBIG past its largest file, EINVAL), or one past a
// tmp's bound on disjoint ranges (EDQUOT), counts as a rejected write, not
// a store I/O error (whose warning says "check the disk"); a failing disk's
// EIO still counts as one.
func TestRefusedWriteIsNoIOError(t *testing.T) {
	for _, c := range []struct {
		errno    syscall.Errno
		refused  bool
		fromDisk bool
	}{{syscall.EFBIG, true, true}, {syscall.EINVAL, true, true}, {syscall.EIO, false, true}, {syscall.EDQUOT, true, false}} {
		s := openStore(t, Config{Capacity: 1 << 30})
		rel := evName(0)
		mkdirFor(t, s, rel)
		w, err := s.CreateTmp(tmpRelFor(rel, 1), syscall.O_CREAT|syscall.O_EXCL|syscall.O_WRONLY)
		if err != nil {
			t.Fatal(err)
		}
		data := pageData(7, 1)
		if c.fromDisk {
			pwriteAt = func(int, []byte, int64) (int, error) { return 0, c.errno }
		} else {
			// Every other page: the tmp's disjoint ranges run out.
			for i := range maxTmpRanges {
				if _, err := w.WriteAt(data, int64(2*i*block.PageSize)); err != nil {
					t.Fatal(err)
				}
			}
		}
		_, err = w.WriteAt(data, int64(2*maxTmpRanges*block.PageSize))
		pwriteAt = unix.Pwrite
		wantErrno(t, err, c.errno, c.errno.Error())
		w.Close()
		got := s.Counters()
		if refused := got.RejectedWrites.Load() == 1 && got.IOErrors.Load() == 0; refused != c.refused ||
			!c.refused && (got.IOErrors.Load() != 1 || got.RejectedWrites.Load() != 0) {
			t.Errorf("%v: %d rejected writes, %d store I/O errors", c.errno, got.RejectedWrites.Load(), got.IOErrors.Load())
		}
	}
}
