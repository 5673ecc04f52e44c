package disk

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io/fs"
	"math/rand/v2"
	"os"
	"path"
	"slices"
	"strconv"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

const testTier = "model_0123456789ab_r0"

func usedBytes(s *Store) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.used
}

func TestPublishRoundTrip(t *testing.T) {
	s := openStore(t, Config{Capacity: 1 << 30})
	cases := []struct {
		rel   string
		pages int
	}{
		{blockRel(testTier, 0, hashHex(1, 64)), 3},
		{blockRel(testTier, 0, hashHex(2, 32)), 3},
		{blockRel(testTier, 1, hashHex(3, 64)), 3},
	}
	var written int64
	for i, c := range cases {
		data := pageData(i, c.pages)
		mkdirFor(t, s, c.rel)
		tmp := tmpRelFor(c.rel, 1000+i)
		w, err := s.CreateTmp(tmp, engineCreateFlags)
		if err != nil {
			t.Fatal(err)
		}
		if !s.IsTracked(tmp) {
			t.Errorf("%s not tracked after CreateTmp", tmp)
		}
		// The kernel splits the engine's single write into sequential requests.
		for off := 0; off < len(data); off += 5000 {
			end := min(off+5000, len(data))
			if n, err := w.WriteAt(data[off:end], int64(off)); err != nil || n != end-off {
				t.Fatalf("WriteAt(off %d) = %d, %v", off, n, err)
			}
		}
		written += int64(len(data))
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if s.Contains(c.rel) {
			t.Fatalf("%s visible before Publish", c.rel)
		}
		if err := s.Publish(tmp, c.rel); err != nil {
			t.Fatalf("Publish: %v", err)
		}
		if exists(t, s.Path(tmp)) {
			t.Errorf("tmp %s still on disk after Publish", tmp)
		}
		if s.IsTracked(tmp) {
			t.Errorf("tmp %s still tracked after Publish", tmp)
		}
		onDisk, err := os.ReadFile(s.Path(c.rel))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(onDisk, data) {
			t.Fatalf("store file of %s differs from the written bytes (the block must be exactly the row)", c.rel)
		}
		checkRecord(t, s.Path(c.rel), data)
		if !s.Contains(c.rel) || !s.Lookup(c.rel, 1) {
			t.Errorf("%s not found after Publish", c.rel)
		}
		r, err := s.OpenBlock(c.rel)
		if err != nil {
			t.Fatalf("OpenBlock: %v", err)
		}
		if r.Size() != int64(len(data)) {
			t.Errorf("Reader.Size = %d, want %d", r.Size(), len(data))
		}
		got := make([]byte, len(data))
		if _, err := r.File().ReadAt(got, 0); err != nil {
			t.Fatal(err)
		}
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, data) {
			t.Fatalf("OpenBlock returned different bytes for %s", c.rel)
		}
	}
	ctr := s.Counters()
	if ctr.Writes.Load() != int64(len(cases)) || ctr.WriteBytes.Load() != written {
		t.Errorf("Writes=%d WriteBytes=%d, want %d, %d", ctr.Writes.Load(), ctr.WriteBytes.Load(), len(cases), written)
	}
	if ctr.ChecksumFailures.Load() != 0 {
		t.Errorf("ChecksumFailures = %d", ctr.ChecksumFailures.Load())
	}
	if ctr.Lookups.Load() != 3 || ctr.LookupHits.Load() != 3 {
		t.Errorf("Lookups=%d hits=%d", ctr.Lookups.Load(), ctr.LookupHits.Load())
	}
	if s.Lookup(blockRel(testTier, 0, hashHex(99, 64)), 1) {
		t.Error("Lookup of a missing block answered true")
	}
	if ctr.Lookups.Load() != 4 || ctr.LookupHits.Load() != 3 {
		t.Errorf("after a miss: Lookups=%d hits=%d", ctr.Lookups.Load(), ctr.LookupHits.Load())
	}
	checkAccounting(t, s)
}

// A tmp reopened without O_TRUNC is not known to be written sequentially from
// zero; Publish must then checksum the file itself.
func TestPublishReopenedTmpChecksumsFile(t *testing.T) {
	s := openStore(t, Config{Capacity: 1 << 30})
	rel := blockRel(testTier, 0, hashHex(5, 64))
	data := pageData(5, 2)
	mkdirFor(t, s, rel)
	tmp := tmpRelFor(rel, 1)
	w, err := s.CreateTmp(tmp, engineCreateFlags)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteAt(data[:block.PageSize], 0); err != nil {
		t.Fatal(err)
	}
	w.Close()
	w, err = s.CreateTmp(tmp, syscall.O_WRONLY)
	if err != nil {
		t.Fatalf("reopening a closed tmp: %v", err)
	}
	if _, err := w.WriteAt(data[page64:], page64); err != nil {
		t.Fatal(err)
	}
	w.Close()
	if err := s.Publish(tmp, rel); err != nil {
		t.Fatal(err)
	}
	checkRecord(t, s.Path(rel), data)
	if got := readBlock(t, s, rel); !bytes.Equal(got, data) {
		t.Fatal("wrong bytes")
	}
	checkAccounting(t, s)
}

// TestWriteOutOfOrder checks that writes out of order, a truncate to the row
// size and a fallocate before the writes (what a per-rank engine worker may
// do) publish a block whose digest is the bytes' own.
func TestWriteOutOfOrder(t *testing.T) {
	s := openStore(t, Config{Capacity: 1 << 30})
	rel := blockRel(testTier, 0, hashHex(7, 64))
	mkdirFor(t, s, rel)
	tmp := tmpRelFor(rel, 1)
	w, err := s.CreateTmp(tmp, engineCreateFlags)
	if err != nil {
		t.Fatal(err)
	}
	data := pageData(7, 4)
	if err := w.Allocate(0, int64(len(data)), 0); err != nil {
		t.Fatal(err)
	}
	if err := w.Truncate(int64(len(data))); err != nil {
		t.Fatal(err)
	}
	for _, page := range []int{2, 0, 3, 1, 0} { // the last one rewrites page 0
		off := page * block.PageSize
		if _, err := w.WriteAt(data[off:off+block.PageSize], int64(off)); err != nil {
			t.Fatalf("write of page %d: %v", page, err)
		}
	}
	w.Close()
	if err := s.Publish(tmp, rel); err != nil {
		t.Fatal(err)
	}
	d, ok := s.Digest(rel)
	if !ok || d.Size != int64(len(data)) || d.CRC != block.CRC32C(data) {
		t.Fatalf("digest %+v, want size %d crc %08x", d, len(data), block.CRC32C(data))
	}
	if got := readBlock(t, s, rel); !bytes.Equal(got, data) {
		t.Fatal("the block written out of order reads back other bytes")
	}
	checkAccounting(t, s)
}

func TestPublishRejectsBadSizes(t *testing.T) {
	s := openStore(t, Config{Capacity: 1 << 30})
	for i, size := range []int{0, 1, 100, block.PageSize - 1, block.PageSize + 1, 3*block.PageSize + 512} {
		rel := blockRel(testTier, 0, hashHex(100+i, 64))
		mkdirFor(t, s, rel)
		tmp := tmpRelFor(rel, i)
		w, err := s.CreateTmp(tmp, engineCreateFlags)
		if err != nil {
			t.Fatal(err)
		}
		if size > 0 {
			if _, err := w.WriteAt(pageData(i, 4)[:size], 0); err != nil {
				t.Fatal(err)
			}
		}
		w.Close()
		err = s.Publish(tmp, rel)
		wantErrno(t, err, syscall.EINVAL, "Publish of a "+strconv.Itoa(size)+"-byte tmp")
		if s.Contains(rel) || exists(t, s.Path(rel)) {
			t.Fatalf("%d-byte block was published", size)
		}
		if !exists(t, s.Path(tmp)) || !s.IsTracked(tmp) {
			t.Fatalf("refused Publish lost the tmp (the engine unlinks it itself)")
		}
		checkAccounting(t, s)
		if err := s.RemoveTmp(tmp); err != nil {
			t.Fatal(err)
		}
	}
	if got := s.Counters().Writes.Load(); got != 0 {
		t.Errorf("Writes = %d, want 0", got)
	}
	if st := s.Stats(); st.Blocks != 0 || st.InFlightTmp != 0 {
		t.Errorf("Stats = %+v, want empty", st)
	}
	if usedBytes(s) != 0 {
		t.Errorf("used = %d, want 0", usedBytes(s))
	}
}

func TestPublishRowSizeMismatch(t *testing.T) {
	s := openStore(t, Config{Capacity: 1 << 30})
	a := blockRel(testTier, 0, hashHex(1, 64))
	putBlock(t, s, a, pageData(1, 2))

	// Another block of the same tier, even in another group, must be a row too.
	for _, group := range []int{0, 1} {
		b := blockRel(testTier, group, hashHex(2, 64))
		tmp := writeTmp(t, s, b, pageData(2, 3))
		err := s.Publish(tmp, b)
		wantErrno(t, err, syscall.EINVAL, "Publish of a 3-page block into a 2-page tier")
		if s.Contains(b) || exists(t, s.Path(b)) {
			t.Fatal("mismatched block published")
		}
		if err := s.RemoveTmp(tmp); err != nil {
			t.Fatal(err)
		}
	}
	// Another tier has its own row size.
	other := blockRel("other_tier_r0", 0, hashHex(3, 64))
	putBlock(t, s, other, pageData(3, 3))
	if got := s.RowBytes(); len(got) != 2 || got[testTier] != 2*page64 || got["other_tier_r0"] != 3*page64 {
		t.Errorf("RowBytes = %v", got)
	}

	// With two blocks in the tier, a replacement of a different size is refused too.
	a2 := blockRel(testTier, 0, hashHex(4, 64))
	putBlock(t, s, a2, pageData(4, 2))
	tmp := writeTmp(t, s, a, pageData(5, 1))
	wantErrno(t, s.Publish(tmp, a), syscall.EINVAL, "resizing one of two blocks")
	if got := readBlock(t, s, a); !bytes.Equal(got, pageData(1, 2)) {
		t.Fatal("refused replacement changed the block")
	}
	s.RemoveTmp(tmp)
	checkAccounting(t, s)

	// The only block of a tier may be replaced by one of another size: the
	// tier's row size follows it.
	if err := s.Remove(a2); err != nil {
		t.Fatal(err)
	}
	putBlock(t, s, a, pageData(6, 1))
	if got := s.RowBytes()[testTier]; got != page64 {
		t.Errorf("RowBytes[%s] = %d after replacing its only block with a 1-page one", testTier, got)
	}
	if got := readBlock(t, s, a); !bytes.Equal(got, pageData(6, 1)) {
		t.Fatal("wrong bytes after replacement")
	}
	checkAccounting(t, s)
}

func TestPublishFromAnotherDirectory(t *testing.T) {
	s := openStore(t, Config{Capacity: 1 << 30})
	h := hashHex(1, 64)
	dest := blockRel(testTier, 0, h)
	for _, src := range []string{
		blockRel(testTier, 1, h),              // another group
		blockRel("other_r0", 0, h),            // another tier
		blockRel(testTier, 0, hashHex(2, 64)), // another hash's directory
	} {
		tmp := writeTmp(t, s, src, pageData(1, 1))
		err := s.Publish(tmp, dest)
		wantErrno(t, err, syscall.EXDEV, "Publish from "+tmp)
		if s.Contains(dest) || exists(t, s.Path(dest)) {
			t.Fatal("block published across directories")
		}
		if !s.IsTracked(tmp) || !exists(t, s.Path(tmp)) {
			t.Fatal("refused Publish lost the tmp")
		}
		if err := s.RemoveTmp(tmp); err != nil {
			t.Fatal(err)
		}
	}
	checkAccounting(t, s)
}

// The kernel releases a closed descriptor asynchronously, so the engine's
// rename may arrive before the release: Publish of an open tmp publishes the
// bytes written so far and seals the tmp against further writes.
func TestPublishWhileWriterOpen(t *testing.T) {
	s := openStore(t, Config{Capacity: 1 << 30})
	rel := blockRel(testTier, 0, hashHex(1, 64))
	mkdirFor(t, s, rel)
	tmp := tmpRelFor(rel, 1)
	w, err := s.CreateTmp(tmp, engineCreateFlags)
	if err != nil {
		t.Fatal(err)
	}
	data := pageData(1, 2)
	if _, err := w.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	if err := s.Publish(tmp, rel); err != nil {
		t.Fatalf("Publish before the writer's release: %v", err)
	}
	if !s.Contains(rel) {
		t.Fatal("block not published")
	}
	// The published block is immutable: a late write through the old descriptor is refused.
	_, err = w.WriteAt(pageData(2, 1), int64(len(data)))
	wantErrno(t, err, syscall.EBADF, "WriteAt after Publish")
	if fi, err := os.Stat(s.Path(rel)); err != nil || fi.Size() != int64(len(data)) {
		t.Fatalf("block after a refused late write: %v, %v", fi, err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if got := readBlock(t, s, rel); !bytes.Equal(got, data) {
		t.Fatal("wrong bytes")
	}
	// Publishing the same tmp again fails and leaves the block alone.
	if err := s.Publish(tmp, rel); err == nil {
		t.Fatal("second Publish of the same tmp succeeded")
	}
	if got := readBlock(t, s, rel); !bytes.Equal(got, data) {
		t.Fatal("wrong bytes after a second Publish")
	}
	if got := s.Counters().Writes.Load(); got != 1 {
		t.Errorf("Writes = %d, want 1", got)
	}
	checkAccounting(t, s)
}

func TestPublishInvalidArguments(t *testing.T) {
	s := openStore(t, Config{Capacity: 1 << 30})
	rel := blockRel(testTier, 0, hashHex(1, 64))
	tmp := writeTmp(t, s, rel, pageData(1, 1))

	// Destination is not a block name.
	dir := rel[:len(rel)-len(hashHex(1, 64))-len(".bin")]
	for _, dest := range []string{dir + "config.json", dir + "NOTHEX.bin", tmpRelFor(rel, 77)} {
		wantErrno(t, s.Publish(tmp, dest), syscall.EINVAL, "Publish to "+dest)
		if exists(t, s.Path(dest)) {
			t.Fatalf("%s created", dest)
		}
	}
	// A tmp the store did not create.
	foreign := tmpRelFor(rel, 99)
	if err := os.WriteFile(s.Path(foreign), pageData(2, 1), 0o644); err != nil {
		t.Fatal(err)
	}
	wantErrno(t, s.Publish(foreign, rel), syscall.EINVAL, "Publish of an untracked tmp")
	if s.Contains(rel) {
		t.Fatal("untracked tmp published")
	}
	// A tmp that was removed.
	if err := s.RemoveTmp(tmp); err != nil {
		t.Fatal(err)
	}
	wantErrno(t, s.Publish(tmp, rel), syscall.EINVAL, "Publish of a removed tmp")
	if s.Contains(rel) || exists(t, s.Path(rel)) {
		t.Fatal("removed tmp published")
	}
	os.Remove(s.Path(foreign))
	checkAccounting(t, s)
}

func TestReplaceBlockKeepsAccountingExact(t *testing.T) {
	s := openStore(t, Config{Capacity: 64 * page64})
	a := blockRel(testTier, 0, hashHex(1, 64))
	b := blockRel(testTier, 0, hashHex(2, 64))
	putBlock(t, s, a, pageData(1, 2))
	putBlock(t, s, b, pageData(2, 2))
	before := s.Stats()

	// Replace a while a load of the old version is in flight.
	r, err := s.OpenBlock(a)
	if err != nil {
		t.Fatal(err)
	}
	for v := 10; v < 15; v++ {
		putBlock(t, s, a, pageData(v, 2))
		checkAccounting(t, s)
	}
	old := make([]byte, 2*block.PageSize)
	if _, err := r.File().ReadAt(old, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(old, pageData(1, 2)) {
		t.Error("a load in flight saw a torn or new block, want the whole old one")
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if got := readBlock(t, s, a); !bytes.Equal(got, pageData(14, 2)) {
		t.Fatal("replacement not visible")
	}
	after := s.Stats()
	if after.Blocks != 2 || after.LogicalBytes != before.LogicalBytes || after.PhysicalBytes != before.PhysicalBytes || after.FreeBytes != before.FreeBytes {
		t.Errorf("stats changed by replacing a block with one of the same size:\nbefore %+v\nafter  %+v", before, after)
	}
	if got := s.Counters().Writes.Load(); got != 7 {
		t.Errorf("Writes = %d, want 7", got)
	}
	if got := s.Counters().Evictions.Load(); got != 0 {
		t.Errorf("Evictions = %d, want 0", got)
	}
	checkAccounting(t, s)
}

func TestRemoveTmp(t *testing.T) {
	s := openStore(t, Config{Capacity: 1 << 30})
	rel := blockRel(testTier, 0, hashHex(1, 64))

	// Closed tmp.
	tmp := writeTmp(t, s, rel, pageData(1, 3))
	if usedBytes(s) != 3*page64 {
		t.Fatalf("used = %d with a 3-page tmp", usedBytes(s))
	}
	if err := s.RemoveTmp(tmp); err != nil {
		t.Fatal(err)
	}
	if exists(t, s.Path(tmp)) || s.IsTracked(tmp) || usedBytes(s) != 0 {
		t.Fatalf("after RemoveTmp: exists=%v tracked=%v used=%d", exists(t, s.Path(tmp)), s.IsTracked(tmp), usedBytes(s))
	}
	if err := s.RemoveTmp(tmp); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("second RemoveTmp: %v, want ENOENT", err)
	}

	// Open tmp: unlinked now, its bytes stay accounted until the writer closes.
	tmp = tmpRelFor(rel, 2)
	w, err := s.CreateTmp(tmp, engineCreateFlags)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteAt(pageData(2, 1), 0); err != nil {
		t.Fatal(err)
	}
	if err := s.RemoveTmp(tmp); err != nil {
		t.Fatal(err)
	}
	if exists(t, s.Path(tmp)) || s.IsTracked(tmp) {
		t.Fatal("open tmp still there after RemoveTmp")
	}
	if _, err := w.WriteAt(pageData(3, 1), page64); err != nil {
		t.Fatalf("write to an unlinked open tmp: %v", err)
	}
	if usedBytes(s) != 2*page64 {
		t.Errorf("used = %d while the unlinked tmp is open, want %d", usedBytes(s), 2*block.PageSize)
	}
	// The same name may be created again meanwhile.
	w2, err := s.CreateTmp(tmp, engineCreateFlags)
	if err != nil {
		t.Fatalf("recreate after RemoveTmp: %v", err)
	}
	if _, err := w2.WriteAt(pageData(4, 1), 0); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if usedBytes(s) != page64 {
		t.Errorf("used = %d after the orphaned writer closed, want %d", usedBytes(s), block.PageSize)
	}
	w2.Close()
	if err := s.Publish(tmp, rel); err != nil {
		t.Fatalf("Publish of the recreated tmp: %v", err)
	}
	if got := readBlock(t, s, rel); !bytes.Equal(got, pageData(4, 1)) {
		t.Fatal("the recreated tmp's bytes were not published")
	}
	checkAccounting(t, s)
}

func TestCreateTmpErrors(t *testing.T) {
	s := openStore(t, Config{Capacity: 1 << 30})
	rel := blockRel(testTier, 0, hashHex(1, 64))
	mkdirFor(t, s, rel)
	for _, bad := range []string{rel, "config.json", testTier + "/.o_direct_probe_1.tmp", rel + ".tmp"} {
		_, err := s.CreateTmp(bad, engineCreateFlags)
		wantErrno(t, err, syscall.EINVAL, "CreateTmp("+bad+")")
		if exists(t, s.Path(bad)) {
			t.Errorf("CreateTmp(%s) created a file", bad)
		}
	}
	tmp := tmpRelFor(rel, 1)
	w, err := s.CreateTmp(tmp, engineCreateFlags)
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.CreateTmp(tmp, engineCreateFlags)
	wantErrno(t, err, syscall.EBUSY, "second CreateTmp while open")
	if w.File() == nil || w.File().Name() != s.Path(tmp) {
		t.Errorf("Writer.File() = %v", w.File())
	}
	if err := w.Sync(); err != nil {
		t.Errorf("Sync: %v", err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	_, err = s.CreateTmp(tmp, engineCreateFlags)
	if !errors.Is(err, fs.ErrExist) {
		t.Errorf("O_EXCL CreateTmp of an existing tmp: %v, want EEXIST", err)
	}
	_, err = w.WriteAt(pageData(1, 1), 0)
	wantErrno(t, err, syscall.EBADF, "WriteAt after Close")
	missing := tmpRelFor(blockRel(testTier, 0, hashHex(2, 64)), 1)
	if _, err := s.CreateTmp(missing, engineCreateFlags); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("CreateTmp in a missing directory: %v, want ENOENT", err)
	}
	if fi, err := os.Stat(s.Path(tmp)); err != nil || fi.Mode().Perm() != PrivateFileMode {
		t.Errorf("tmp mode: %v, %v; want %o whatever the engine asks (private by default)", fi, err, PrivateFileMode)
	}
	if err := s.RemoveTmp(tmp); err != nil {
		t.Fatal(err)
	}
	checkAccounting(t, s)
}

func TestForgetTmp(t *testing.T) {
	s := openStore(t, Config{Capacity: 1 << 30})
	rel := blockRel(testTier, 0, hashHex(1, 64))
	tmp := writeTmp(t, s, rel, pageData(1, 2))
	if usedBytes(s) != 2*page64 {
		t.Fatalf("used = %d", usedBytes(s))
	}
	// Renamed by the FUSE layer to a name outside the block layout.
	if err := os.Rename(s.Path(tmp), s.Path(testTier+"/notes.txt")); err != nil {
		t.Fatal(err)
	}
	s.ForgetTmp(tmp, testTier+"/notes.txt")
	if s.IsTracked(tmp) || usedBytes(s) != 2*page64 {
		t.Errorf("after ForgetTmp: tracked=%v used=%d; the renamed file still counts", s.IsTracked(tmp), usedBytes(s))
	}
	s.ForgetTmp(tmp, testTier+"/notes.txt") // idempotent
	if usedBytes(s) != 2*page64 {
		t.Errorf("second ForgetTmp changed used to %d", usedBytes(s))
	}
	checkAccounting(t, s)
}

func TestRemoveBlock(t *testing.T) {
	s := openStore(t, Config{Capacity: 1 << 30})
	a := blockRel(testTier, 0, hashHex(1, 64))
	b := blockRel(testTier, 1, hashHex(2, 64))
	putBlock(t, s, a, pageData(1, 1))
	putBlock(t, s, b, pageData(2, 1))
	if !s.HasBlocksUnder(testTier) || !s.HasBlocksUnder(testTier+"/") {
		t.Error("HasBlocksUnder(tier) is false")
	}
	if s.HasBlocksUnder("model_0123456789") {
		t.Error("HasBlocksUnder matched a name prefix, not a directory")
	}
	if err := s.Remove(a); err != nil {
		t.Fatal(err)
	}
	if s.Contains(a) || s.Lookup(a, 1) || exists(t, s.Path(a)) {
		t.Fatal("removed block still present")
	}
	if _, err := s.OpenBlock(a); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("OpenBlock of a removed block: %v, want ENOENT", err)
	}
	if err := s.Remove(a); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Remove of a missing block: %v, want ENOENT", err)
	}
	checkAccounting(t, s)
	if err := s.Remove(b); err != nil {
		t.Fatal(err)
	}
	if s.HasBlocksUnder(testTier) {
		t.Error("HasBlocksUnder(tier) true with no blocks")
	}
	if got := s.RowBytes(); len(got) != 0 {
		t.Errorf("RowBytes = %v with no blocks", got)
	}
	checkAccounting(t, s)
}

// TestPublishRefusesTmpWithRefusedWrite checks that a tmp file one of whose
// writes was refused (no space) can never become a block, even if later writes
// fill it.
func TestPublishRefusesTmpWithRefusedWrite(t *testing.T) {
	s := openStore(t, Config{Capacity: 3 * page64})
	rel := blockRel(testTier, 0, hashHex(6, 64))
	data := pageData(6, 2)
	mkdirFor(t, s, rel)
	tmp := tmpRelFor(rel, 1)
	w, err := s.CreateTmp(tmp, engineCreateFlags)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteAt(pageData(6, 4), 0); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("write beyond the capacity: %v, want ENOSPC", err)
	}
	for off := 0; off < len(data); off += block.PageSize {
		if _, err := w.WriteAt(data[off:off+block.PageSize], int64(off)); err != nil {
			t.Fatal(err)
		}
	}
	w.Close()
	if err := s.Publish(tmp, rel); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("publish after a refused write: %v, want EINVAL", err)
	}
	if s.Contains(rel) {
		t.Fatal("a tmp with a refused write was published")
	}
}

// A fallocate that punches or zeroes bytes already written changes the file
// behind the checksum taken as the writes arrived: the block published has
// the file's own digest, and loads back as the file holds it.
func TestPublishAfterPunchOrZeroRange(t *testing.T) {
	for i, mode := range []uint32{unix.FALLOC_FL_PUNCH_HOLE | unix.FALLOC_FL_KEEP_SIZE, unix.FALLOC_FL_ZERO_RANGE | unix.FALLOC_FL_KEEP_SIZE} {
		s := openStore(t, Config{Capacity: 1 << 30})
		rel := blockRel(testTier, 0, hashHex(20+i, 64))
		data := pageData(20+i, 4)
		mkdirFor(t, s, rel)
		tmp := tmpRelFor(rel, 1)
		w, err := s.CreateTmp(tmp, engineCreateFlags)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.WriteAt(data, 0); err != nil {
			t.Fatal(err)
		}
		if err := w.Allocate(page64, page64, mode); err != nil {
			t.Fatalf("fallocate mode %#x: %v", mode, err)
		}
		w.Close()
		if err := s.Publish(tmp, rel); err != nil {
			t.Fatal(err)
		}
		want := bytes.Clone(data)
		clear(want[block.PageSize : 2*block.PageSize])
		checkRecord(t, s.Path(rel), want)
		if got := readBlock(t, s, rel); !bytes.Equal(got, want) {
			t.Fatalf("mode %#x: wrong bytes", mode)
		}
	}
}

// vLLM PR #57912 sets its CRC32C on the tmp before the rename, as four
// big-endian bytes: a matching one publishes, a disagreeing one or one in
// another format (which vLLM's loader would refuse) is refused at the rename
// and nothing is published.
func TestPublishChecksVLLMChecksum(t *testing.T) {
	s := openStore(t, Config{Capacity: 1 << 30})
	data := pageData(7, 3)
	for i, c := range []struct {
		what      string
		value     []byte
		published bool
	}{
		{"vLLM's bytes", vllmXattr(crcOf(data)), true},
		{"a disagreeing CRC32C", vllmXattr(crcOf(data) ^ 0x80), false},
		{"the CRC32C little endian", binary.LittleEndian.AppendUint32(nil, crcOf(data)), false},
		{"the CRC32C as decimal text", []byte(strconv.FormatUint(uint64(crcOf(data)), 10)), false},
	} {
		rel := blockRel(testTier, 0, hashHex(100+i, 64))
		tmp := writeTmp(t, s, rel, data)
		if err := unix.Setxattr(s.Path(tmp), block.VLLMChecksumXattr, c.value, 0); err != nil {
			t.Fatal(err)
		}
		err := s.Publish(tmp, rel)
		if c.published {
			if err != nil || !s.Contains(rel) {
				t.Errorf("%s: Publish = %v, indexed %v; want published", c.what, err, s.Contains(rel))
			}
			continue
		}
		wantErrno(t, err, syscall.EIO, c.what)
		if s.Contains(rel) || exists(t, s.Path(rel)) {
			t.Errorf("%s: block published", c.what)
		}
	}
	if got := s.Counters().ChecksumFailures.Load(); got != 2 {
		t.Errorf("ChecksumFailures = %d, want 2 (a CRC32C of another format is no checksum failure)", got)
	}
}

// TestScatteredTmpWritesAreBounded: writes that leave a tmp more disjoint
// ranges than maxTmpRanges are refused (EDQUOT) before they land; a write
// that joins ranges already written is taken. Main took every one, each
// merged with all ranges before it: 50,000 one-byte writes every other
// byte took 43 s of the daemon.
func TestScatteredTmpWritesAreBounded(t *testing.T) {
	s := openStore(t, Config{Capacity: 1 << 30})
	rel := blockRel(testTier, 0, hashHex(8, 64))
	mkdirFor(t, s, rel)
	w, err := s.CreateTmp(tmpRelFor(rel, 1), engineCreateFlags&^syscall.O_DIRECT)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	one := []byte{1}
	for i := range maxTmpRanges {
		if _, err := w.WriteAt(one, int64(2*i)); err != nil {
			t.Fatalf("write %d of one byte every other byte: %v", i, err)
		}
	}
	if _, err := w.WriteAt(one, 2*maxTmpRanges); !errors.Is(err, syscall.EDQUOT) {
		t.Errorf("a write leaving range %d: %v, want EDQUOT", maxTmpRanges+1, err)
	}
	if _, err := w.WriteAt(one, 1); err != nil {
		t.Errorf("a write joining the first two ranges: %v", err)
	}
	if _, err := w.WriteAt(one, 2*maxTmpRanges); err != nil {
		t.Errorf("a new range once two were joined: %v", err)
	}
}

// TestCoverKeepsRangesLikeABitmap checks tmpFile.cover against a bitmap of
// the bytes written: its ranges are sorted, apart and exactly those bytes.
func TestCoverKeepsRangesLikeABitmap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 200 {
		var tmp tmpFile
		var bits [256]bool
		for range 40 {
			start := rng.Int64N(256)
			end := min(256, start+rng.Int64N(24))
			tmp.cover(start, end)
			for b := start; b < end; b++ {
				bits[b] = true
			}
			var want [][2]int64
			for b := int64(0); b < 256; b++ {
				if bits[b] && (b == 0 || !bits[b-1]) {
					want = append(want, [2]int64{b, b})
				}
				if bits[b] {
					want[len(want)-1][1] = b + 1
				}
			}
			if !slices.Equal(tmp.written, want) {
				t.Fatalf("round %d: ranges %v after cover(%d, %d), want %v", round, tmp.written, start, end, want)
			}
		}
	}
}

// TestHasBlocksUnderCountsEachDirectory: every directory above an indexed
// block or a tracked tmp holds blocks, its siblings and the block's own
// name do not, and nothing does once they are gone; the store keeps the
// counts as blocks and tmps come and go (main scanned every block under the
// lock for each directory rename: 84 ms at a million blocks).
func TestHasBlocksUnderCountsEachDirectory(t *testing.T) {
	s := openStore(t, Config{Capacity: 1 << 30})
	rel := blockRel(testTier, 0, hashHex(11, 64))
	putBlock(t, s, rel, pageData(11, 1))
	tmpRel := tmpRelFor(blockRel(testTier, 1, hashHex(12, 64)), 1)
	mkdirFor(t, s, tmpRel)
	w, err := s.CreateTmp(tmpRel, engineCreateFlags)
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{testTier, testTier + "/", path.Dir(rel), path.Dir(path.Dir(rel)), path.Dir(tmpRel)} {
		if !s.HasBlocksUnder(dir) {
			t.Errorf("HasBlocksUnder(%q) = false with %s and %s stored", dir, rel, tmpRel)
		}
	}
	for _, dir := range []string{"other", testTier + "x", rel, path.Dir(rel) + "x"} {
		if s.HasBlocksUnder(dir) {
			t.Errorf("HasBlocksUnder(%q) = true", dir)
		}
	}
	checkAccounting(t, s)
	w.Close()
	if err := s.Remove(rel); err != nil {
		t.Fatal(err)
	}
	if err := s.RemoveTmp(tmpRel); err != nil {
		t.Fatal(err)
	}
	if s.HasBlocksUnder(testTier) {
		t.Errorf("HasBlocksUnder(%q) = true once the block and the tmp are gone", testTier)
	}
	checkAccounting(t, s)
}
