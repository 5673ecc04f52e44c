package disk

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/tiers/block"
	"github.com/kvtierfs/kvtierfs/tiers/shm"
)

// placeOnly places a tmp pending its proof, as a passthrough tmp is placed
// (the mark, the rename and the index), and returns the tmp and the block,
// their proof not started: the state a daemon stopped right after the
// renameat leaves. The caller runs s.prove(t, b) or leaves the tmp's mutex
// locked.
func placeOnly(t *testing.T, s *Store, tmpRel, destRel string) (*tmpFile, *entry) {
	t.Helper()
	tmp, name, err := s.publishedTmp(tmpRel, destRel)
	if err != nil {
		t.Fatal(err)
	}
	tmp.mu.Lock()
	f, unmarked, err := tmp.wholeRow(tmpRel)
	if err != nil {
		tmp.mu.Unlock()
		t.Fatal(err)
	}
	b, err := s.place(tmp, f, unmarked, tmpRel, destRel, name, nil)
	if err != nil {
		tmp.mu.Unlock()
		t.Fatal(err)
	}
	return tmp, b
}

// A publication names a block, comes from a tmp in the block's directory,
// and a tmp written through the store.
func TestPublishedTmpChecksNames(t *testing.T) {
	s := openStore(t, Config{Capacity: 1 << 30})
	rel := blockRel(testTier, 0, hashHex(1, 64))
	tmp := writeTmp(t, s, rel, pageData(1, 2))
	other := blockRel(testTier, 0, hashHex(2, 64))
	for _, c := range []struct {
		tmp, dest string
		want      syscall.Errno
	}{
		{tmp, filepath.Dir(rel) + "/notablock", syscall.EINVAL},
		{tmp, other, syscall.EXDEV},
		{tmpRelFor(rel, 999), rel, syscall.EINVAL},
	} {
		_, _, err := s.publishedTmp(c.tmp, c.dest)
		wantErrno(t, err, c.want, c.tmp+" -> "+c.dest)
	}
	got, name, err := s.publishedTmp(tmp, rel)
	if err != nil || got != s.tmps[tmp] || name.Hash != hashHex(1, 64) {
		t.Fatalf("publishedTmp of a written tmp = %p, %+v, %v", got, name, err)
	}
}

// wholeRow refuses a tmp already published, one a write was refused for,
// one of no whole pages and one with bytes never written; it extends a
// file whose last pages were zeros left as holes to its writes' end.
func TestWholeRow(t *testing.T) {
	s := openStore(t, Config{Capacity: 1 << 30})
	rel := blockRel(testTier, 0, hashHex(1, 64))
	tmp := func(data []byte) *tmpFile {
		return s.tmps[writeTmp(t, s, rel, data)]
	}
	sealed := tmp(pageData(1, 1))
	sealed.sealed = true
	refused := tmp(pageData(1, 1))
	refused.refused = true
	short := tmp(pageData(1, 1)[:100])
	gap := tmp(pageData(1, 1))
	gap.written = nil
	for _, c := range []struct {
		what string
		tmp  *tmpFile
		want syscall.Errno
	}{
		{"published already", sealed, syscall.ENOENT},
		{"a write refused", refused, syscall.EINVAL},
		{"not whole pages", short, syscall.EINVAL},
		{"bytes never written", gap, syscall.EINVAL},
	} {
		_, _, err := c.tmp.wholeRow("tmp")
		wantErrno(t, err, c.want, c.what)
	}

	data := pageData(3, 3)
	clear(data[2*block.PageSize:])
	holes := tmp(data)
	if size, _, _ := fileSize(holes.file); size != 2*page64 {
		t.Fatalf("file of a tmp whose last page is zero holds %d bytes, want the 2 pages written", size)
	}
	f, physical, err := holes.wholeRow("tmp")
	if err != nil {
		t.Fatal(err)
	}
	if size, onDisk, _ := fileSize(f); size != 3*page64 || physical != onDisk {
		t.Fatalf("after wholeRow: file of %d bytes allocating %d, reported %d; want 3 pages", size, onDisk, physical)
	}
}

// Right after the rename's reply, before the proof: the block holds its
// name, marked pending with this boot's id and without a record, and its
// rename counted one filesystem block more than the file holds. A daemon
// stopped there loses nothing: the next Open proves the file from its bytes
// and writes its record.
func TestCrashBeforeProofKeepsTheBlock(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Config{Dir: dir, Capacity: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	rel := blockRel(testTier, 0, hashHex(1, 64))
	data := pageData(1, 4)
	tmp, b := placeOnly(t, s, writeTmp(t, s, rel, data), rel)
	pending := make([]byte, 8192)
	n, err := unix.Getxattr(s.Path(rel), pendingXattr, pending)
	if err != nil || !bytes.Equal(pending[:n], s.pendingMark(rel)) {
		t.Fatalf("pending mark %q, %v; want the boot id and the name %q", pending[:max(n, 0)], err, s.pendingMark(rel))
	}
	if _, ok := storeRecord(t, s.Path(rel)); !ok {
		t.Fatal("no store xattr on the placed block")
	}
	if _, err := unix.Getxattr(s.Path(rel), block.RecordXattr, pending); err != unix.ENODATA {
		t.Fatalf("record on a block not proven yet: %v", err)
	}
	if got, onDisk := s.Stats().PhysicalBytes, physicalOf(t, s.Path(rel)); got != onDisk && got != onDisk+s.fsBlock {
		t.Fatalf("placed block counts %d bytes, its file allocates %d: want as much, or one filesystem block (%d) more for the record", got, onDisk, s.fsBlock)
	}
	if b.proof == nil {
		t.Fatal("placed block has no proof to wait for")
	}
	// The daemon stops here: the proof never runs.
	tmp.file.Close()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openStore(t, Config{Dir: dir, Capacity: 1 << 30})
	if got := readBlock(t, s, rel); !bytes.Equal(got, data) {
		t.Fatal("the block pending at the stop loads other bytes")
	}
	checkRecord(t, s.Path(rel), data)
	if _, err := unix.Getxattr(s.Path(rel), pendingXattr, pending); err != unix.ENODATA {
		t.Fatalf("pending mark left after the block was proven at Open: %v", err)
	}
	checkAccounting(t, s)
}

// A block left pending by a boot before this one (the machine crashed in
// its proof's window) may have been torn in the page cache: it is not
// indexed, but left on disk and counted as unproven, even with a record.
func TestPendingOfAnEarlierBootIsUnproven(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Config{Dir: dir, Capacity: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	rel := blockRel(testTier, 0, hashHex(1, 64))
	putBlock(t, s, rel, pageData(1, 2))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(filepath.Join(dir, rel), pendingXattr, []byte("00000000-0000-0000-0000-000000000000"), 0); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, Config{Dir: dir, Capacity: 1 << 30})
	if s.Contains(rel) || s.Counters().UnprovenBlocks.Load() != 1 {
		t.Fatalf("indexed %v, unproven %d; want a pending block of another boot unproven", s.Contains(rel), s.Counters().UnprovenBlocks.Load())
	}
	if !exists(t, filepath.Join(dir, rel)) {
		t.Fatal("the unproven block's file was removed")
	}
}

// A load that pins a block during its proof gets the proven digest, not
// the rename's placeholder; the time it waited is timed.
func TestLoadWaitsForTheProof(t *testing.T) {
	s := openStore(t, Config{Capacity: 1 << 30})
	rel := blockRel(testTier, 0, hashHex(1, 64))
	data := pageData(1, 3)
	tmp, b := placeOnly(t, s, writeTmp(t, s, rel, data), rel)
	pinned := make(chan block.Digest)
	go func() {
		r, err := s.PinBlock(rel)
		if err != nil {
			t.Error(err)
			close(pinned)
			return
		}
		d := r.Digest()
		r.Close() // before the test's accounting check
		pinned <- d
	}()
	s.prove(tmp, b)
	if d := <-pinned; d.CRC != crcOf(data) || d.Size != int64(len(data)) {
		t.Fatalf("pinned during the proof: digest %+v, want crc %08x", d, crcOf(data))
	}
	if d, ok := s.Digest(rel); !ok || d.CRC != crcOf(data) {
		t.Fatalf("Digest after the proof = %+v, %v", d, ok)
	}
	checkAccounting(t, s)
}

// A proof that cannot read the block's bytes (the file cut short behind
// the store's back) drops the block, removes its file and fails the loads
// waiting for it with EIO; the next load finds no block.
func TestFailedProofDropsTheBlock(t *testing.T) {
	s := openStore(t, Config{Capacity: 1 << 30})
	rel := blockRel(testTier, 0, hashHex(1, 64))
	data := pageData(1, 3)
	tmpRel := writeTmp(t, s, rel, data)
	s.tmps[tmpRel].sequential = false // checksummed from the file
	tmp, b := placeOnly(t, s, tmpRel, rel)
	if err := os.Truncate(s.Path(rel), page64); err != nil {
		t.Fatal(err)
	}
	s.prove(tmp, b)
	if b.proof.err == nil {
		t.Fatal("the proof of a file cut short passed")
	}
	if s.Contains(rel) || exists(t, s.Path(rel)) {
		t.Fatal("the block that failed its proof is still there")
	}
	if _, err := s.PinBlock(rel); !errorIs(err, syscall.ENOENT) {
		t.Fatalf("load after a failed proof = %v, want ENOENT", err)
	}
	if got := s.Counters().ChecksumFailures.Load(); got != 0 {
		t.Errorf("ChecksumFailures = %d: a file cut short is no disagreement with vLLM's CRC32C", got)
	}
	checkAccounting(t, s)
}

// errorIs reports whether err carries errno.
func errorIs(err error, errno syscall.Errno) bool { return err != nil && Errno(err) == errno }

// rowsIn maps a region of rows in a temporary directory, as the engine's
// /dev/shm region would be.
func rowsIn(t *testing.T, rows [][]byte) *shm.Set {
	t.Helper()
	path := filepath.Join(t.TempDir(), "region")
	if err := os.WriteFile(path, bytes.Join(rows, nil), 0o600); err != nil {
		t.Fatal(err)
	}
	set, err := shm.NewSet(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := set.Refresh(); err != nil {
		t.Fatal(err)
	}
	return set
}

// passthroughStore writes data into a tmp the way the kernel writes a
// passthrough store (to the descriptor Passthrough gives, without the
// daemon), releases it and publishes it.
func passthroughStore(t *testing.T, s *Store, rel string, data []byte) {
	t.Helper()
	mkdirFor(t, s, rel)
	tmp := tmpRelFor(rel, int(tmpSeq.Add(1)))
	w, err := s.CreateTmp(tmp, engineCreateFlags)
	if err != nil {
		t.Fatal(err)
	}
	fd, ok := w.Passthrough()
	if !ok {
		t.Fatal("no passthrough for a tier whose rows a region holds")
	}
	if n, err := unix.Pwrite(fd, data, 0); err != nil || n != len(data) {
		t.Fatalf("pwrite %d, %v", n, err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Publish(tmp, rel); err != nil {
		t.Fatal(err)
	}
}

// A passthrough store's digest comes from the region's row its bytes came
// from (its file unread beyond the probe run, so unchecked), and its zero
// pages become holes; bytes no row holds are read back from the file. Both
// load back proven.
func TestSealPassthrough(t *testing.T) {
	const pages = 16
	rowBytes := int64(pages) * page64
	half := pageData(2, pages)
	clear(half[:rowBytes/2])
	s := openStore(t, Config{Capacity: 1 << 30})
	s.UseRows(rowsIn(t, [][]byte{pageData(1, pages), half}))
	first := blockRel(testTier, 0, hashHex(1, 64))
	putBlock(t, s, first, pageData(1, pages)) // the tier's row size

	fromRow := blockRel(testTier, 0, hashHex(2, 64))
	passthroughStore(t, s, fromRow, half)
	if s.Counters().StoresFromRow.Load() != 1 || s.Counters().StoresReadBack.Load() != 0 {
		t.Fatalf("from row %d, read back %d; want the store found in its row",
			s.Counters().StoresFromRow.Load(), s.Counters().StoresReadBack.Load())
	}
	if b := s.blocks[fromRow]; !b.unchecked {
		t.Error("a block whose digest came from a row counts as checked against its file")
	}
	if onDisk := physicalOf(t, s.Path(fromRow)); onDisk > rowBytes/2+s.fsBlock {
		t.Errorf("the zero half of a row from the region is not a hole: %d bytes allocated", onDisk)
	}

	nowhere := pageData(3, pages)
	clear(nowhere[rowBytes/4 : rowBytes/2])
	readBack := blockRel(testTier, 0, hashHex(3, 64))
	passthroughStore(t, s, readBack, nowhere)
	if s.Counters().StoresReadBack.Load() != 1 {
		t.Fatalf("read back %d, want the store no row holds read back", s.Counters().StoresReadBack.Load())
	}
	if b := s.blocks[readBack]; b.unchecked {
		t.Error("a block read back from its file counts as unchecked")
	}
	for rel, want := range map[string][]byte{fromRow: half, readBack: nowhere} {
		checkRecord(t, s.Path(rel), want)
		if got := readBlock(t, s, rel); !bytes.Equal(got, want) {
			t.Errorf("%s loads other bytes", rel)
		}
	}
	checkAccounting(t, s)
}

// readBack sums a file in chunks, takes its probe windows and lists its
// all-zero page runs, merged across chunks.
func TestReadBack(t *testing.T) {
	s := openStore(t, Config{Capacity: 1 << 30})
	pages := 2*readBackChunk/block.PageSize + 3
	data := pageData(4, pages)
	zeroFrom, zeroTo := readBackChunk-2*block.PageSize, readBackChunk+block.PageSize
	clear(data[zeroFrom:zeroTo])
	clear(data[len(data)-block.PageSize:])
	f := tempFile(t, data)
	direct := false
	row, err := s.readBack(f, int64(len(data)), &direct)
	if err != nil {
		t.Fatal(err)
	}
	if row.Sum.CRC() != crcOf(data) || row.Sum.Len() != int64(len(data)) {
		t.Fatalf("crc %08x over %d bytes, want %08x over %d", row.Sum.CRC(), row.Sum.Len(), crcOf(data), len(data))
	}
	want := [][2]int64{{int64(zeroFrom), int64(zeroTo)}, {int64(len(data) - block.PageSize), int64(len(data))}}
	if len(row.ZeroRuns) != len(want) || row.ZeroRuns[0] != want[0] || row.ZeroRuns[1] != want[1] {
		t.Fatalf("zero runs %v, want %v", row.ZeroRuns, want)
	}
	d, err := block.NewDigest(&row.Sum, func(off int64) (uint64, error) {
		for i, o := range block.ProbeOffsets(int64(len(data))) {
			if o == off {
				return row.Probes[i], nil
			}
		}
		return 0, syscall.EINVAL
	})
	if err != nil || !d.SamplesMatch(data) {
		t.Fatalf("probe windows read back do not match the file: %v", err)
	}
}

// A block left pending by a stopped daemon and then copied with its xattrs
// into another rank's tier (cp -a, rsync -X) carries a pending mark of this
// boot; the mark names the block it was taken for, so the copy is not
// proven from its bytes under a name it was never written for.
func TestPendingMarkCopiedToAnotherRankIsUnproven(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Config{Dir: dir, Capacity: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	rel := blockRel(testTier, 0, hashHex(1, 64))
	data := pageData(1, 4)
	tmp, _ := placeOnly(t, s, writeTmp(t, s, rel, data), rel)
	// The daemon stops here: the proof never runs.
	tmp.file.Close()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	copied := blockRel("model_0123456789ab_r1", 0, hashHex(1, 64))
	if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, copied)), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, copied), data, 0o600); err != nil {
		t.Fatal(err)
	}
	mark := make([]byte, 8192)
	n, err := unix.Getxattr(filepath.Join(dir, rel), pendingXattr, mark)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(filepath.Join(dir, copied), pendingXattr, mark[:n], 0); err != nil {
		t.Fatal(err)
	}

	s = openStore(t, Config{Dir: dir, Capacity: 1 << 30})
	if !s.Contains(rel) {
		t.Fatal("the block pending at the stop is not indexed")
	}
	if s.Contains(copied) || s.Counters().UnprovenBlocks.Load() != 1 {
		t.Fatalf("copy indexed %v, unproven %d; want the copy under another rank's name unproven", s.Contains(copied), s.Counters().UnprovenBlocks.Load())
	}
}

// A row below Config.PassthroughMinRow is not passed through: its writes
// reach the daemon, which sums them as they arrive, so its rename neither
// reads the file nor scans the region. A row of at least that size is.
func TestPassthroughMinRow(t *testing.T) {
	const pages = 16
	rowBytes := int64(pages) * page64
	for _, tc := range []struct {
		minRow int64
		want   bool
	}{{0, true}, {rowBytes, true}, {rowBytes + page64, false}} {
		s := openStore(t, Config{Capacity: 1 << 30, PassthroughMinRow: tc.minRow})
		data := pageData(2, pages)
		s.UseRows(rowsIn(t, [][]byte{pageData(1, pages), data}))
		putBlock(t, s, blockRel(testTier, 0, hashHex(1, 64)), pageData(1, pages)) // the tier's row size
		rel := blockRel(testTier, 0, hashHex(2, 64))
		mkdirFor(t, s, rel)
		tmp := tmpRelFor(rel, int(tmpSeq.Add(1)))
		w, err := s.CreateTmp(tmp, engineCreateFlags)
		if err != nil {
			t.Fatal(err)
		}
		fd, ok := w.Passthrough()
		if ok != tc.want {
			t.Fatalf("rows of %d bytes, passthrough from %d: passed through %v, want %v", rowBytes, tc.minRow, ok, tc.want)
		}
		if ok {
			_, err = unix.Pwrite(fd, data, 0)
		} else {
			_, err = w.WriteAt(data, 0)
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if err := s.Publish(tmp, rel); err != nil {
			t.Fatal(err)
		}
		probes := s.PhaseStats()[PhaseProbe.String()].Count
		if fromRow := s.Counters().StoresFromRow.Load(); ok != (probes == 1 && fromRow == 1) {
			t.Errorf("passed through %v: %d probes, %d stores from a row", ok, probes, fromRow)
		}
		checkRecord(t, s.Path(rel), data)
		if got := readBlock(t, s, rel); !bytes.Equal(got, data) {
			t.Errorf("passed through %v: the block loads other bytes", ok)
		}
		checkAccounting(t, s)
	}
}

// A tmp written through the daemon is recorded before its rename and placed
// proven: no pending mark, no proof after the renameat. A daemon stopped
// right after the renameat leaves the block at its name with its record,
// indexed at the next mount without reading it; one stopped between the
// record and the renameat leaves a tmp, removed at the next mount.
func TestDaemonWrittenBlockIsRecordedBeforeItsRename(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Config{Dir: dir, Capacity: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	rel := blockRel(testTier, 0, hashHex(1, 64))
	data := pageData(1, 4)
	putBlock(t, s, rel, data)
	phases := s.PhaseStats()
	for _, p := range []Phase{PhasePending, PhaseProof} {
		if n := phases[p.String()].Count; n != 0 {
			t.Errorf("%s timed %d times for a block written through the daemon: want it recorded before its rename", p, n)
		}
	}
	checkRecord(t, s.Path(rel), data)
	checkAccounting(t, s)

	placed := blockRel(testTier, 0, hashHex(2, 64))
	placedData := pageData(2, 4)
	unrenamed := blockRel(testTier, 0, hashHex(3, 64))
	for _, c := range []struct {
		rel    string
		data   []byte
		rename bool
	}{{placed, placedData, true}, {unrenamed, pageData(3, 4), false}} {
		tmpRel := writeTmp(t, s, c.rel, c.data)
		tmp, name, err := s.publishedTmp(tmpRel, c.rel)
		if err != nil {
			t.Fatal(err)
		}
		tmp.mu.Lock()
		f, unmarked, err := tmp.wholeRow(tmpRel)
		if err != nil {
			t.Fatal(err)
		}
		recorded := s.recordBeforeRename(tmp, f, name)
		if recorded == nil {
			t.Fatal("a tmp written through the daemon was not recorded before its rename")
		}
		defer tmp.file.Close()
		if !c.rename {
			checkRecord(t, s.Path(tmpRel), c.data)
			continue // the daemon stops here, before the renameat
		}
		b, err := s.place(tmp, f, unmarked, tmpRel, c.rel, name, recorded)
		if err != nil {
			t.Fatal(err)
		}
		if b.proof != nil {
			t.Error("a block recorded before its rename has a proof to wait for")
		}
		// The daemon stops here, right after the renameat.
		checkRecord(t, s.Path(c.rel), c.data)
		if onDisk := physicalOf(t, s.Path(c.rel)); b.physical != onDisk {
			t.Errorf("the placed block counts %d bytes, its file allocates %d: want exactly that, its record written", b.physical, onDisk)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openStore(t, Config{Dir: dir, Capacity: 1 << 30})
	for rel, want := range map[string][]byte{rel: data, placed: placedData} {
		if got := readBlock(t, s, rel); !bytes.Equal(got, want) {
			t.Errorf("%s loads other bytes after the restart", rel)
		}
	}
	if s.Contains(unrenamed) || s.Counters().UnprovenBlocks.Load() != 0 {
		t.Errorf("block never renamed indexed %v, unproven %d; want neither", s.Contains(unrenamed), s.Counters().UnprovenBlocks.Load())
	}
	for name := range regularFilesOnDisk(t, dir) {
		if kind, _ := block.Parse(name); kind == block.TmpFile {
			t.Errorf("tmp %s left after the restart; want the recorded tmp removed", name)
		}
	}
	checkAccounting(t, s)
}
