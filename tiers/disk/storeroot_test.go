package disk

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestStoreRootLinkIsNotGivenAway: the engine's uid owns the directory
// holding the store (its data disk, say /nvme with --store /nvme/kvtier) and
// replaces the store by a link to a directory of root's (`mv /nvme/kvtier
// /nvme/kvtier.o && ln -s /etc /nvme/kvtier`). At its next start the root
// daemon opened the link's target, gave it to the engine's uid with mode
// 0700, and the engine then renamed and replaced root's files in it. The
// target of a link must keep its owner and mode.
func TestStoreRootLinkIsNotGivenAway(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("giving files to another uid needs root")
	}
	base := t.TempDir()
	rootsDir := filepath.Join(base, "etc")
	if err := os.Mkdir(rootsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootsDir, "passwd"), []byte("root:x:0:0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	engineDisk := filepath.Join(base, "nvme")
	if err := os.Mkdir(engineDisk, 0o755); err != nil {
		t.Fatal(err)
	}
	store := filepath.Join(engineDisk, "kvtier")
	if err := os.Symlink(rootsDir, store); err != nil {
		t.Fatal(err)
	}
	owner := Owner{UID: 4242, GID: 4343}
	s, err := Open(Config{Dir: store, Owner: &owner})
	if err == nil {
		defer s.Close()
	}
	var st syscall.Stat_t
	if err := syscall.Stat(rootsDir, &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != 0 || st.Mode&0o777 != 0o755 {
		t.Fatalf("a store path that is a link to root's directory: Open %v, and the directory is now uid %d, mode %o (was root, 755)", err, st.Uid, st.Mode&0o777)
	}
}

// TestStoreOfAnotherUserIsNotTakenOver: a --store that holds files and
// belongs to another user than the engine's (a home directory typed by
// mistake) was given to the engine's uid with mode 0700 at Open. It is
// refused naming its owner and the chown that would make it the engine's;
// an empty directory of another user and the engine's own store are taken.
func TestStoreOfAnotherUserIsNotTakenOver(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("giving files to another uid needs root")
	}
	engine := Owner{UID: 4242, GID: 4343}
	home := t.TempDir()
	if err := os.WriteFile(filepath.Join(home, ".profile"), []byte("bob's\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(home, 5151, 5151); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(home, 0o755); err != nil {
		t.Fatal(err)
	}
	s, err := Open(Config{Dir: home, Owner: &engine})
	if err == nil {
		s.Close()
		t.Fatal("Open took over another user's directory holding files")
	}
	for _, want := range []string{"uid 5151", "chown -R 4242:4343 " + home, "--engine-uid"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	var st syscall.Stat_t
	if err := syscall.Stat(home, &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != 5151 || st.Mode&0o777 != 0o755 {
		t.Errorf("refused directory is now uid %d, mode %o; want 5151, 755", st.Uid, st.Mode&0o777)
	}
	if entries, err := os.ReadDir(home); err != nil || len(entries) != 1 {
		t.Errorf("refused directory holds %v (%v); want .profile alone", entries, err)
	}

	// The chown the refusal names makes it the engine's own store.
	if err := os.Chown(home, engine.UID, engine.GID); err != nil {
		t.Fatal(err)
	}
	s, err = Open(Config{Dir: home, Owner: &engine})
	if err != nil {
		t.Fatalf("the engine's own store: %v", err)
	}
	s.Close()

	empty := t.TempDir()
	if err := os.Chown(empty, 5151, 5151); err != nil {
		t.Fatal(err)
	}
	s, err = Open(Config{Dir: empty, Owner: &engine})
	if err != nil {
		t.Fatalf("an empty directory of another user: %v", err)
	}
	s.Close()
	if err := syscall.Stat(empty, &st); err != nil || st.Uid != uint32(engine.UID) {
		t.Errorf("empty directory taken as the store: uid %d (%v), want the engine's %d", st.Uid, err, engine.UID)
	}
}

// TestEmptyRootDirectoryThroughALinkIsNotTakenOver: the engine's uid owns
// a directory on the store's path (--store /data/engine/x/kvtier) and makes
// x a link to a directory of root's that holds an empty directory of the
// store's name (/usr/local/bin on a fresh system, for --store .../bin).
// Open gave that directory to the engine's uid, mode 0700; it must keep
// its owner and mode, and the refusal name the path it leads to.
func TestEmptyRootDirectoryThroughALinkIsNotTakenOver(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("giving files to another uid needs root")
	}
	base := t.TempDir()
	roots := filepath.Join(base, "usr-local")
	empty := filepath.Join(roots, "kvtier")
	if err := os.MkdirAll(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	engineDir := filepath.Join(base, "engine")
	if err := os.Mkdir(engineDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(roots, filepath.Join(engineDir, "x")); err != nil {
		t.Fatal(err)
	}
	owner := Owner{UID: 4242, GID: 4343}
	s, err := Open(Config{Dir: filepath.Join(engineDir, "x", "kvtier"), Owner: &owner})
	if err == nil {
		s.Close()
	}
	var st syscall.Stat_t
	if err := syscall.Stat(empty, &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != 0 || st.Mode&0o777 != 0o755 {
		t.Fatalf("root's empty directory behind a link on the store's path: Open %v, and it is now uid %d, mode %o (was root, 755)", err, st.Uid, st.Mode&0o777)
	}
	if err == nil || !strings.Contains(err.Error(), "--store "+empty) {
		t.Errorf("refusal %v does not name the directory reached, --store %s", err, empty)
	}
}

// TestStoreTooDeepToNameStillOpens: the engine's uid, which owns the store
// tree, nests directories until their path passes PATH_MAX. Open walked
// the tree by path and refused the whole store (ENAMETOOLONG), so the
// daemon could not start again; the names it cannot read are now left out,
// and the blocks and files beside them indexed and counted.
func TestStoreTooDeepToNameStillOpens(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Config{Dir: dir, Capacity: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	rel := evName(0)
	putBlock(t, s, rel, pageData(0, 2))
	before := s.Used()
	s.Close()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	for range unix.PathMax/2 + 1 {
		if err := unix.Mkdirat(fd, "d", 0o700); err != nil {
			t.Fatal(err)
		}
		next, err := unix.Openat(fd, "d", unix.O_RDONLY|unix.O_DIRECTORY, 0)
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
		fd = next
	}
	unix.Close(fd)
	if err := os.WriteFile(filepath.Join(dir, "d", "other"), make([]byte, 8192), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err = Open(Config{Dir: dir, Capacity: 1 << 30})
	if err != nil {
		t.Fatalf("a store holding a directory nested past PATH_MAX: %v", err)
	}
	defer s.Close()
	if !s.Contains(rel) {
		t.Errorf("the block beside the deep directory is not indexed")
	}
	if got := s.Used(); got < before+8192 {
		t.Errorf("the store counts %d bytes, want the block's %d and d/other's 8192", got, before)
	}
}

// TestIndexingWalkDoesNotFollowASwappedDirectory: the engine's uid, which
// owns the store tree, swaps a directory of the store for a link to a
// directory outside it after the indexing walk read the directory's name
// and before it opened it. The walk went by path and listed the outside
// directory through the link: a tmp file there failed Open (its removal,
// resolved beneath the root, was refused), a block there was checked as the
// store's. The walk opens each directory from its parent's descriptor
// without following links: nothing outside is listed, touched or indexed.
func TestIndexingWalkDoesNotFollowASwappedDirectory(t *testing.T) {
	test := func(t *testing.T) {
		dir := t.TempDir()
		s, err := Open(Config{Dir: dir, Capacity: 1 << 30})
		if err != nil {
			t.Fatal(err)
		}
		rel := evName(0)
		putBlock(t, s, rel, pageData(0, 2))
		before := s.Used()
		s.Close()

		// Outside the store: a tier's tree with a published block, a
		// leftover tmp of the layout and another file.
		outside := t.TempDir()
		o, err := Open(Config{Dir: outside, Capacity: 1 << 30})
		if err != nil {
			t.Fatal(err)
		}
		foreign := blockRel("victim", 0, hashHex(7, 64))
		putBlock(t, o, foreign, pageData(7, 2))
		o.Close()
		foreignTmp := filepath.Join(outside, tmpRelFor(foreign, 9))
		if err := os.WriteFile(foreignTmp, pageData(8, 1), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(outside, "victim", "other"), make([]byte, 8192), 0o600); err != nil {
			t.Fatal(err)
		}

		if err := os.Mkdir(filepath.Join(dir, "victim"), 0o700); err != nil {
			t.Fatal(err)
		}
		swapped := false
		beforeDescend = func(rel string) {
			if rel != "victim" || swapped {
				return
			}
			if err := os.Remove(filepath.Join(dir, "victim")); err != nil {
				t.Error(err)
			}
			if err := os.Symlink(filepath.Join(outside, "victim"), filepath.Join(dir, "victim")); err != nil {
				t.Error(err)
			}
			swapped = true
		}
		t.Cleanup(func() { beforeDescend = nil })

		s, err = Open(Config{Dir: dir, Capacity: 1 << 30})
		if err != nil {
			t.Fatalf("a store whose directory was swapped for a link while indexed: %v", err)
		}
		defer s.Close()
		if !swapped {
			t.Fatal("the walk never came to descend into victim")
		}
		if !s.Contains(rel) {
			t.Errorf("the store's own block is not indexed")
		}
		if s.Contains(foreign) {
			t.Errorf("a block outside the store is indexed through the link")
		}
		if n := s.Counters().UnprovenBlocks.Load(); n != 0 {
			t.Errorf("%d block files checked, want none: the only other one is outside the store", n)
		}
		if !exists(t, foreignTmp) {
			t.Errorf("a tmp file outside the store was removed")
		}
		if got := s.Used(); got != before {
			t.Errorf("the store counts %d bytes, want its block's %d", got, before)
		}
	}
	t.Run("openat2", test)
	t.Run("walk", func(t *testing.T) {
		withoutOpenat2(t)
		test(t)
	})
}

// The engine's uid swaps a tier directory for a link to its moved self while
// the indexing walk is beneath it: the walk keeps reading the moved
// directory through its descriptor, and the leftover tmp it finds there can
// no longer be removed by its name (which now crosses a link). That costs the
// tmp, not the store: the daemon still starts, and its other blocks are
// indexed.
func TestLeftoverTmpBehindASwappedDirectoryDoesNotFailOpen(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Config{Dir: dir, Capacity: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	kept := blockRel("kept", 0, hashHex(1, 64))
	putBlock(t, s, kept, pageData(1, 2))
	moved := blockRel(testTier, 0, hashHex(2, 64))
	putBlock(t, s, moved, pageData(2, 2))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, tmpRelFor(moved, 1)), pageData(3, 1), 0o600); err != nil {
		t.Fatal(err)
	}
	group := filepath.Dir(moved)
	swapped := false
	beforeDescend = func(rel string) {
		if rel != group || swapped {
			return
		}
		tier := filepath.Join(dir, testTier)
		if err := os.Rename(tier, tier+".moved"); err != nil {
			t.Error(err)
		}
		if err := os.Symlink(tier+".moved", tier); err != nil {
			t.Error(err)
		}
		swapped = true
	}
	t.Cleanup(func() { beforeDescend = nil })

	s, err = Open(Config{Dir: dir, Capacity: 1 << 30})
	if err != nil {
		t.Fatalf("a store whose tier directory was swapped for a link while its leftover tmp was found: %v", err)
	}
	defer s.Close()
	if !swapped {
		t.Fatal("the walk never came to descend into the block's group")
	}
	if !s.Contains(kept) {
		t.Error("the block of the untouched tier is not indexed")
	}
}

// TestProbeStaysBeneathTheStoreRoot: the engine's uid, owning the directory
// holding the store, swaps the store for a link to a directory of root's
// between Open's descriptor of the root and the probe of its xattrs
// (renameat2 RENAME_EXCHANGE in a loop wins it a few mounts in ten). The
// probe went by path: the root daemon created a root-owned file in root's
// directory, set an xattr on it, and removed it by path again, so the
// files of the mounts whose link was swapped back stayed there. The probe
// makes its file beneath the root's descriptor, and nothing in the link's
// target.
func TestProbeStaysBeneathTheStoreRoot(t *testing.T) {
	base := t.TempDir()
	rootsDir := filepath.Join(base, "etc")
	if err := os.Mkdir(rootsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	store := filepath.Join(base, "kvtier")
	if err := os.Mkdir(store, 0o700); err != nil {
		t.Fatal(err)
	}
	s, err := Open(Config{Dir: store, Capacity: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := os.Rename(store, store+".moved"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(rootsDir, store); err != nil {
		t.Fatal(err)
	}
	watch, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(watch)
	if _, err := unix.InotifyAddWatch(watch, rootsDir, unix.IN_CREATE); err != nil {
		t.Fatal(err)
	}
	if err := s.probeWritable(); err != nil {
		t.Fatalf("probe of the store, its path swapped for a link: %v", err)
	}
	var events [4096]byte
	if n, err := unix.Read(watch, events[:]); n > 0 {
		ev := (*unix.InotifyEvent)(unsafe.Pointer(&events[0]))
		name := strings.TrimRight(string(events[unix.SizeofInotifyEvent:unix.SizeofInotifyEvent+int(ev.Len)]), "\x00")
		t.Fatalf("the probe created %q in the directory the store's path now leads to", name)
	} else if !errors.Is(err, unix.EAGAIN) {
		t.Fatal(err)
	}
	if names, err := os.ReadDir(store + ".moved"); err != nil || len(names) != 0 {
		t.Fatalf("the probe left %v in the store (%v)", names, err)
	}
}
