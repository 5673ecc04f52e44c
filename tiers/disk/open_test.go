package disk

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/internal/testsys"
	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// flipByte changes one byte of a file in place, as a write in the store
// tree would, moving its change time.
func flipByte(t *testing.T, p string, off int64) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x5a
	testsys.UntilChangeTimeMoves(t, p, func() {
		if _, err := f.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
	})
}

func TestOpenRebuildsIndex(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Config{Dir: dir, Capacity: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	type blk struct {
		rel  string
		data []byte
	}
	var blocks []blk
	for i := 0; i < 6; i++ {
		tier, pages, n := testTier, 2, 64
		if i%3 == 2 {
			tier, pages, n = "other_r0", 1, 32
		}
		b := blk{blockRel(tier, i%2, hashHex(i, n)), pageData(i, pages)}
		putBlock(t, s, b.rel, b.data)
		blocks = append(blocks, b)
	}
	// A tmp still being written when the daemon stops.
	openTmp := tmpRelFor(blockRel(testTier, 0, hashHex(50, 64)), 1)
	mkdirFor(t, s, openTmp)
	w, err := s.CreateTmp(openTmp, engineCreateFlags)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteAt(pageData(50, 1), 0); err != nil {
		t.Fatal(err)
	}
	// A closed, unpublished tmp.
	closedTmp := writeTmp(t, s, blockRel(testTier, 1, hashHex(51, 64)), pageData(51, 2))
	w.Close()
	s.Close()

	// Leftovers of a crash and of the engine's probes, and files that must be kept.
	leftovers := []string{
		openTmp, closedTmp,
		testTier + "/.o_direct_probe_12345.tmp",
		".o_direct_probe_777.tmp",
		testTier + "/.xattr_probe_9.tmp",
	}
	for _, rel := range leftovers[2:] {
		if err := os.WriteFile(filepath.Join(dir, rel), pageData(0, 1), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	keep := map[string][]byte{
		"model_0123456789ab/config.json":                 []byte(`{"model":"x"}`),
		testTier + "/abc/de_g0/NOTAHASH.bin":             pageData(60, 1), // malformed: kept, not indexed
		testTier + "/abc/de/" + hashHex(61, 64) + ".bin": pageData(61, 1), // not under _g: kept, not indexed
		"README": []byte("hello"),
		// *.tmp files outside the block-tmp layout are not the store's.
		"notes.tmp":                         []byte("user file"),
		testTier + "/abc/de_g0/scratch.tmp": []byte("user file"),
		testTier + "/.o_direct_probe_x.tmp": []byte("not a probe's name"),
	}
	for rel, data := range keep {
		os.MkdirAll(filepath.Dir(filepath.Join(dir, rel)), 0o755)
		if err := os.WriteFile(filepath.Join(dir, rel), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	s = openStore(t, Config{Dir: dir, Capacity: 1 << 30})
	for _, rel := range leftovers {
		if exists(t, filepath.Join(dir, rel)) {
			t.Errorf("leftover tmp %s not removed at Open", rel)
		}
	}
	for rel, data := range keep {
		got, err := os.ReadFile(filepath.Join(dir, rel))
		if err != nil || !bytes.Equal(got, data) {
			t.Errorf("non-block file %s not kept: %v", rel, err)
		}
	}
	st := s.Stats()
	if st.Blocks != int64(len(blocks)) || st.InFlightTmp != 0 {
		t.Errorf("after rebuild: %d blocks, %d tmps; want %d, 0", st.Blocks, st.InFlightTmp, len(blocks))
	}
	if got := s.RowBytes(); len(got) != 2 || got[testTier] != 2*page64 || got["other_r0"] != page64 {
		t.Errorf("RowBytes after rebuild = %v", got)
	}
	checkAccounting(t, s)
	for _, b := range blocks {
		if !s.Contains(b.rel) {
			t.Fatalf("%s not re-indexed", b.rel)
		}
		if got := readBlock(t, s, b.rel); !bytes.Equal(got, b.data) {
			t.Fatalf("%s: wrong bytes after rebuild", b.rel)
		}
	}
	// The checksums were re-read from disk: corruption is still detected.
	victim := blocks[3]
	flipByte(t, s.Path(victim.rel), page64+7)
	_, err = s.OpenBlock(victim.rel)
	wantErrno(t, err, syscall.EIO, "OpenBlock of a block corrupted after rebuild")
	if s.Contains(victim.rel) || exists(t, s.Path(victim.rel)) {
		t.Error("corrupt block kept")
	}
	if got := s.Counters().ChangedOutside.Load(); got != 1 {
		t.Errorf("ChangedOutside = %d, want 1 (a block rewritten in the store tree after the rebuild)", got)
	}
	checkAccounting(t, s)
}

func TestOpenDropsBlockWhoseSizeDisagreesWithRecord(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Config{Dir: dir, Capacity: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	good := blockRel(testTier, 0, hashHex(1, 64))
	grown := blockRel(testTier, 0, hashHex(2, 64))
	shrunk := blockRel(testTier, 1, hashHex(3, 64))
	for i, rel := range []string{good, grown, shrunk} {
		putBlock(t, s, rel, pageData(i, 2))
	}
	s.Close()
	f, err := os.OpenFile(filepath.Join(dir, grown), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write(pageData(9, 1))
	f.Close()
	if err := os.Truncate(filepath.Join(dir, shrunk), page64); err != nil {
		t.Fatal(err)
	}

	s = openStore(t, Config{Dir: dir, Capacity: 1 << 30})
	for _, rel := range []string{grown, shrunk} {
		if s.Contains(rel) {
			t.Errorf("torn block %s indexed", rel)
		}
		if exists(t, filepath.Join(dir, rel)) {
			t.Errorf("torn block %s left on disk (an engine pointed at the store would load it)", rel)
		}
	}
	if !s.Contains(good) {
		t.Fatal("intact block dropped")
	}
	if st := s.Stats(); st.Blocks != 1 {
		t.Errorf("Blocks = %d, want 1", st.Blocks)
	}
	checkAccounting(t, s)
}

// A block found without a digest record (copied or restored without xattrs,
// or written by an engine pointed straight at the store) proves nothing: it is
// not indexed, and counted. vLLM's own CRC32C, when it matches, adopts it; one
// in another format than vLLM's four big-endian bytes (the decimal text earlier
// releases read) is refused, as vLLM's loader would refuse it.
func TestOpenRefusesBlockWithoutRecord(t *testing.T) {
	dir := t.TempDir()
	bare := blockRel(testTier, 0, hashHex(1, 32))
	vouched := blockRel(testTier, 0, hashHex(2, 32))
	lying := blockRel(testTier, 0, hashHex(3, 32))
	asText := blockRel(testTier, 0, hashHex(4, 32))
	littleEndian := blockRel(testTier, 0, hashHex(5, 32))
	for i, rel := range []string{bare, vouched, lying, asText, littleEndian} {
		data := pageData(i+1, 3)
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		value := map[string][]byte{
			vouched:      vllmXattr(crcOf(data)),
			lying:        vllmXattr(crcOf(data) ^ 1),
			asText:       []byte(strconv.FormatUint(uint64(crcOf(data)), 10)),
			littleEndian: binary.LittleEndian.AppendUint32(nil, crcOf(data)),
		}[rel]
		if value != nil {
			if err := unix.Setxattr(p, block.VLLMChecksumXattr, value, 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	s := openStore(t, Config{Dir: dir, Capacity: 1 << 30})
	for _, rel := range []string{bare, lying, asText, littleEndian} {
		if s.Contains(rel) {
			t.Errorf("unproven block %s indexed", rel)
		}
	}
	if got := s.Counters().UnprovenBlocks.Load(); got != 4 {
		t.Errorf("UnprovenBlocks = %d, want 4", got)
	}
	if !exists(t, filepath.Join(dir, bare)) {
		t.Error("unproven block removed from disk: it is only left unindexed")
	}
	if !s.Contains(vouched) {
		t.Fatal("block proven by vLLM's CRC32C not indexed")
	}
	checkRecord(t, filepath.Join(dir, vouched), pageData(2, 3))
	if got := readBlock(t, s, vouched); !bytes.Equal(got, pageData(2, 3)) {
		t.Fatal("wrong bytes")
	}
	if st := s.Stats(); st.Blocks != 1 || st.PhysicalBytes != physicalOf(t, filepath.Join(dir, vouched)) {
		t.Errorf("Stats = %+v", st)
	}
}

// A block whose record holds but whose vLLM CRC32C disagrees with it would be
// dropped by vLLM's loader at its first load: it is refused at mount.
func TestOpenRefusesVLLMChecksumDisagreeingWithRecord(t *testing.T) {
	dir := t.TempDir()
	rel := blockRel(testTier, 0, hashHex(1, 32))
	s, err := Open(Config{Dir: dir, Capacity: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	putBlock(t, s, rel, pageData(1, 3))
	s.Close()
	if err := unix.Setxattr(filepath.Join(dir, rel), block.VLLMChecksumXattr, vllmXattr(crcOf(pageData(1, 3))+1), 0); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, Config{Dir: dir, Capacity: 1 << 30})
	if s.Contains(rel) {
		t.Fatal("block whose vLLM CRC32C disagrees with its record indexed")
	}
	if got := s.Counters().UnprovenBlocks.Load(); got != 1 {
		t.Errorf("UnprovenBlocks = %d, want 1", got)
	}
}

func TestOpenTwiceFails(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Config{Dir: dir, Capacity: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	rel := blockRel(testTier, 0, hashHex(1, 64))
	putBlock(t, s, rel, pageData(1, 1))
	s2, err := Open(Config{Dir: dir, Capacity: 1 << 30})
	if err == nil {
		s2.Close()
		t.Fatal("second Open of a store in use succeeded")
	}
	if !strings.Contains(err.Error(), "in use") || !strings.Contains(err.Error(), dir) {
		t.Errorf("second Open: %q; want a message naming the directory and saying it is in use", err)
	}
	// The failed Open must not have disturbed the running store.
	if got := readBlock(t, s, rel); !bytes.Equal(got, pageData(1, 1)) {
		t.Fatal("block damaged by a failed second Open")
	}
	// Also through another path to the same directory.
	if _, err := Open(Config{Dir: dir + "/./", Capacity: 1 << 30}); err == nil {
		t.Fatal("second Open through another spelling of the path succeeded")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s3, err := Open(Config{Dir: dir, Capacity: 1 << 30})
	if err != nil {
		t.Fatalf("Open after Close: %v", err)
	}
	defer s3.Close()
	if !s3.Contains(rel) {
		t.Fatal("block lost across Close/Open")
	}
}

func TestOpenBadDirectories(t *testing.T) {
	base := t.TempDir()
	missing := filepath.Join(base, "nope")
	_, err := Open(Config{Dir: missing})
	if err == nil || !strings.Contains(err.Error(), missing) || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("Open(missing dir) = %v; want a message naming it and saying it does not exist", err)
	}
	if exists(t, missing) {
		t.Error("Open created the missing directory")
	}

	file := filepath.Join(base, "file")
	os.WriteFile(file, []byte("x"), 0o644)
	_, err = Open(Config{Dir: file})
	if err == nil || !strings.Contains(err.Error(), file) || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("Open(regular file) = %v; want a 'not a directory' message naming it", err)
	}

	_, err = Open(Config{Dir: t.TempDir(), Capacity: -1})
	if err == nil || !strings.Contains(err.Error(), "capacity") {
		t.Errorf("Open with negative capacity = %v", err)
	}
}

func TestOpenReadOnlyDirectory(t *testing.T) {
	dir := t.TempDir()
	rel := blockRel(testTier, 0, hashHex(1, 64))
	os.MkdirAll(filepath.Dir(filepath.Join(dir, rel)), 0o755)
	os.WriteFile(filepath.Join(dir, rel), pageData(1, 1), 0o644)
	unix.Setxattr(filepath.Join(dir, rel), block.VLLMChecksumXattr, vllmXattr(crcOf(pageData(1, 1))), 0)
	os.WriteFile(filepath.Join(dir, ".o_direct_probe_1.tmp"), pageData(1, 1), 0o644)
	ro := dir
	if os.Geteuid() == 0 {
		// Root bypasses permission bits: use a read-only bind mount instead.
		ro = t.TempDir()
		if err := unix.Mount(dir, ro, "", unix.MS_BIND, ""); err != nil {
			t.Skipf("root ignores chmod 0500 and a bind mount is not permitted here (%v): cannot make a read-only store", err)
		}
		t.Cleanup(func() {
			if err := unix.Unmount(ro, 0); err != nil {
				t.Errorf("unmounting %s: %v", ro, err)
			}
		})
		if err := unix.Mount("", ro, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			t.Skipf("cannot remount the bind mount read-only (%v)", err)
		}
	} else {
		if err := os.Chmod(dir, 0o500); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Chmod(dir, 0o755) })
	}
	s, err := Open(Config{Dir: ro, Capacity: 1 << 30})
	if err == nil {
		s.Close()
		t.Fatal("Open of a read-only store directory succeeded")
	}
	if !strings.Contains(err.Error(), ro) || !strings.Contains(err.Error(), "not writable") {
		t.Errorf("Open(read-only) = %q; want a 'not writable' message naming the directory", err)
	}
	if !exists(t, filepath.Join(dir, rel)) {
		t.Error("block removed by a failed Open")
	}
	// The lock is released: the directory can be opened once it is writable.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	s, err = Open(Config{Dir: dir, Capacity: 1 << 30})
	if err != nil {
		t.Fatalf("Open of the writable directory after a failed read-only Open: %v", err)
	}
	defer s.Close()
	if !s.Contains(rel) {
		t.Error("block not indexed")
	}
}

func TestOpenDefaultCapacity(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, Config{Dir: dir})
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	total := int64(st.Blocks) * st.Bsize
	want := int64(float64(total) * DefaultCapacityFraction)
	got := s.Stats()
	if got.CapacityBytes != want {
		t.Errorf("default capacity = %d, want 90%% of %d = %d", got.CapacityBytes, total, want)
	}
	if got.FreeBytes <= 0 || got.FreeBytes > got.CapacityBytes {
		t.Errorf("FreeBytes = %d with capacity %d", got.FreeBytes, got.CapacityBytes)
	}
	if s.Root() != dir {
		t.Errorf("Root = %q, want %q", s.Root(), dir)
	}
	if s.Path("a/b") != filepath.Join(dir, "a/b") {
		t.Errorf("Path = %q", s.Path("a/b"))
	}
	// The writability probe leaves nothing behind.
	entries, _ := os.ReadDir(dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	if len(names) != 0 {
		t.Errorf("store directory not empty after Open: %v", names)
	}
}

func TestOpenRelativeDir(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(filepath.Dir(dir))
	s := openStore(t, Config{Dir: filepath.Base(dir), Capacity: 1 << 20})
	if s.Root() != dir {
		t.Errorf("Root = %q, want absolute %q", s.Root(), dir)
	}
}
