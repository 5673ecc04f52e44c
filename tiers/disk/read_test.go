package disk

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// TestCorruptBlockIsRemoved: a block whose bytes fail verification is
// removed and counted, once: as changed outside the daemon when its file was
// written in the store tree, as a checksum failure when nothing shows a
// change of its file (its bytes changed under the filesystem: Misrecord).
func TestCorruptBlockIsRemoved(t *testing.T) {
	cases := []struct {
		name    string
		corrupt func(t *testing.T, s *Store, rel string)
		outside bool
	}{
		{"flipped byte", func(t *testing.T, s *Store, rel string) { flipByte(t, s.Path(rel), 3*page64/2) }, true},
		{"flipped first byte", func(t *testing.T, s *Store, rel string) { flipByte(t, s.Path(rel), 0) }, true},
		{"flipped last byte", func(t *testing.T, s *Store, rel string) { flipByte(t, s.Path(rel), 2*page64-1) }, true},
		{"truncated", func(t *testing.T, s *Store, rel string) {
			if err := os.Truncate(s.Path(rel), page64); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"extended", func(t *testing.T, s *Store, rel string) {
			if err := os.Truncate(s.Path(rel), 3*page64); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"changed under the filesystem", func(t *testing.T, s *Store, rel string) { s.Misrecord(rel) }, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := openStore(t, Config{Capacity: 1 << 30})
			gone := watchRemovals(s)
			bad := blockRel(testTier, 0, hashHex(1, 64))
			good := blockRel(testTier, 0, hashHex(2, 64))
			putBlock(t, s, bad, pageData(1, 2))
			putBlock(t, s, good, pageData(2, 2))
			if !s.Lookup(bad, 1) {
				t.Fatal("lookup before corruption")
			}
			tc.corrupt(t, s, bad)
			counted := func() (failures, outside int64) {
				return s.Counters().ChecksumFailures.Load(), s.Counters().ChangedOutside.Load()
			}
			want := map[bool][2]int64{false: {1, 0}, true: {0, 1}}[tc.outside]

			r, err := s.OpenBlock(bad)
			if r != nil {
				t.Error("OpenBlock returned a Reader for a corrupt block")
			}
			wantErrno(t, err, syscall.EIO, "OpenBlock of a corrupt block")
			var se *Error
			if !errors.As(err, &se) || se.Path != bad {
				t.Errorf("error %v does not name the block %s", err, bad)
			}
			if failures, outside := counted(); failures != want[0] || outside != want[1] {
				t.Errorf("%d checksum failures, %d changed outside; want %d and %d", failures, outside, want[0], want[1])
			}
			if s.Contains(bad) || s.Lookup(bad, 1) {
				t.Error("corrupt block still in the index")
			}
			if exists(t, s.Path(bad)) {
				t.Error("corrupt block still on disk (an engine pointed at the store would load it)")
			}
			if rel := gone.next(t); rel != bad {
				t.Errorf("Removed %q told, want %q", rel, bad)
			}
			// Further opens see ENOENT, not another checksum failure.
			_, err = s.OpenBlock(bad)
			wantErrno(t, err, syscall.ENOENT, "OpenBlock after removal")
			if failures, outside := counted(); failures != want[0] || outside != want[1] {
				t.Errorf("%d checksum failures, %d changed outside after a second open; want %d and %d", failures, outside, want[0], want[1])
			}
			// Nothing else is affected.
			if got := readBlock(t, s, good); !bytes.Equal(got, pageData(2, 2)) {
				t.Error("intact block damaged")
			}
			if st := s.Stats(); st.Blocks != 1 || st.LogicalBytes != 2*page64 {
				t.Errorf("Stats after corruption: %+v", st)
			}
			checkAccounting(t, s)
			// The key can be stored again.
			putBlock(t, s, bad, pageData(3, 2))
			if got := readBlock(t, s, bad); !bytes.Equal(got, pageData(3, 2)) {
				t.Error("re-stored block has wrong bytes")
			}
			checkAccounting(t, s)
		})
	}
}

// Corruption found while another load of the same block holds it open still
// removes the block; the load in flight keeps its descriptor.
func TestCorruptBlockWithReaderOpen(t *testing.T) {
	s := openStore(t, Config{Capacity: 1 << 30})
	rel := blockRel(testTier, 0, hashHex(1, 64))
	putBlock(t, s, rel, pageData(1, 1))
	r1, err := s.OpenBlock(rel)
	if err != nil {
		t.Fatal(err)
	}
	flipByte(t, s.Path(rel), 10)
	_, err = s.OpenBlock(rel)
	wantErrno(t, err, syscall.EIO, "second OpenBlock after corruption")
	if s.Contains(rel) {
		t.Fatal("corrupt block still indexed")
	}
	if err := r1.Close(); err != nil {
		t.Fatal(err)
	}
	if s.Contains(rel) {
		t.Fatal("closing the first Reader brought the block back")
	}
	checkAccounting(t, s)
}

func TestOpenBlockMissing(t *testing.T) {
	s := openStore(t, Config{Capacity: 1 << 30})
	for _, rel := range []string{blockRel(testTier, 0, hashHex(1, 64)), "config.json", ""} {
		_, err := s.OpenBlock(rel)
		wantErrno(t, err, syscall.ENOENT, "OpenBlock("+rel+")")
	}
	// A block file deleted behind the store's back.
	rel := blockRel(testTier, 0, hashHex(2, 64))
	putBlock(t, s, rel, pageData(2, 1))
	os.Remove(s.Path(rel))
	_, err := s.OpenBlock(rel)
	if Errno(err) != syscall.ENOENT {
		t.Errorf("OpenBlock of a vanished file: %v, want ENOENT", err)
	}
	if got := s.Counters().ChecksumFailures.Load(); got != 0 {
		t.Errorf("ChecksumFailures = %d for a vanished file", got)
	}
}

func TestCountRead(t *testing.T) {
	s := openStore(t, Config{Capacity: 1 << 30})
	s.CountRead(8192)
	s.CountRead(4096)
	c := s.Counters()
	if c.Reads.Load() != 2 || c.ReadBytes.Load() != 12288 {
		t.Errorf("Reads=%d ReadBytes=%d", c.Reads.Load(), c.ReadBytes.Load())
	}
}

// PinBlock pins a block without reading it; its digest is the one recorded at
// publish, the same the engine's region rows are matched against.
func TestPinBlockDigestVerifyCorrupt(t *testing.T) {
	s := openStore(t, Config{Capacity: 1 << 30})
	gone := watchRemovals(s)
	rel := blockRel(testTier, 0, hashHex(1, 64))
	data := pageData(1, 4)
	putBlock(t, s, rel, data)

	r, err := s.PinBlock(rel)
	if err != nil {
		t.Fatal(err)
	}
	d := r.Digest()
	if want := block.DigestOf(data); !reflect.DeepEqual(d, want) {
		t.Errorf("Digest = %+v, want block.DigestOf(data) = %+v", d, want)
	}
	if d.Size != int64(len(data)) || d.CRC != crcOf(data) {
		t.Errorf("Digest size/crc = %d/%08x, want %d/%08x", d.Size, d.CRC, len(data), crcOf(data))
	}
	if err := r.Verify(); err != nil {
		t.Errorf("Verify of an intact block: %v", err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}

	// Corrupt on disk: PinBlock does not read, Verify catches it.
	flipByte(t, s.Path(rel), 3*page64)
	r, err = s.PinBlock(rel)
	if err != nil {
		t.Fatalf("PinBlock reads the block: %v", err)
	}
	if got := r.Digest(); got.CRC != crcOf(data) {
		t.Error("Digest changed with the bytes on disk: it must be the record made at publish")
	}
	wantErrno(t, r.Verify(), syscall.EIO, "Verify of a corrupt block")
	r.Close()
	if s.Contains(rel) || exists(t, s.Path(rel)) {
		t.Error("corrupt block kept after Verify")
	}
	if got := s.Counters().ChangedOutside.Load(); got != 1 || s.Counters().ChecksumFailures.Load() != 0 {
		t.Errorf("ChangedOutside = %d, ChecksumFailures = %d, want 1 and 0 (the file was written in the store tree)", got, s.Counters().ChecksumFailures.Load())
	}
	if got := gone.next(t); got != rel {
		t.Errorf("Removed %q told, want %q", got, rel)
	}
	checkAccounting(t, s)

	// A load that delivered wrong bytes (found by the caller) reports Corrupt.
	putBlock(t, s, rel, data)
	r, err = s.PinBlock(rel)
	if err != nil {
		t.Fatal(err)
	}
	err = r.Corrupt("row 7 does not match the digest")
	wantErrno(t, err, syscall.EIO, "Corrupt")
	if !strings.Contains(err.Error(), "row 7 does not match the digest") {
		t.Errorf("Corrupt error %q lacks the reason", err)
	}
	r.Close()
	if s.Contains(rel) || exists(t, s.Path(rel)) {
		t.Error("block kept after Corrupt")
	}
	if got := s.Counters().ChecksumFailures.Load(); got != 1 {
		t.Errorf("ChecksumFailures = %d, want 1 (its file unchanged)", got)
	}
	if got := gone.next(t); got != rel {
		t.Errorf("Removed %q told, want %q", got, rel)
	}
	_, err = s.PinBlock(rel)
	wantErrno(t, err, syscall.ENOENT, "PinBlock of a removed block")
	checkAccounting(t, s)
}

// TestCorruptBlockCountsOnce: two loads of one block that both find it
// corrupt are one failure: one count, one removal.
func TestCorruptBlockCountsOnce(t *testing.T) {
	s, _, gone := evictStore(t, 2, Config{})
	put(t, s, 0)
	var readers []*Reader
	for range 2 {
		r, err := s.PinBlock(evName(0))
		if err != nil {
			t.Fatal(err)
		}
		readers = append(readers, r)
	}
	for _, r := range readers {
		wantErrno(t, r.Corrupt("row 3 does not match the digest"), syscall.EIO, "Corrupt")
	}
	for _, r := range readers {
		r.Close()
	}
	if got := s.Counters().ChecksumFailures.Load(); got != 1 {
		t.Errorf("ChecksumFailures = %d after two loads of one corrupt block, want 1", got)
	}
	if got := gone.next(t); got != evName(0) {
		t.Errorf("Removed %q told, want %q", got, evName(0))
	}
	checkAccounting(t, s)
}

// PinBlock protects from eviction like OpenBlock.
func TestPinBlockPinsAgainstEviction(t *testing.T) {
	s, _, gone := evictStore(t, 2, Config{})
	put(t, s, 0)
	put(t, s, 1)
	r, err := s.PinBlock(evName(0))
	if err != nil {
		t.Fatal(err)
	}
	put(t, s, 2)
	expectEvicted(t, s, gone, 1)
	r.Close()
	put(t, s, 3)
	expectEvicted(t, s, gone, 2)
	present(t, s, 0, 3)
}

// TestReadBlock fetches blocks as staging does: dense and sparse blocks come
// back whole in page-aligned buffers, from a disk filesystem (O_DIRECT) and
// from tmpfs (no O_DIRECT), also into a recycled buffer that held other
// bytes (the holes of a sparse block read as zeros); a corrupt or truncated
// block is an EIO that removes it, never a short or wrong buffer.
func TestReadBlock(t *testing.T) {
	sparse := pageData(7, 4)
	clear(sparse[block.PageSize : 3*block.PageSize])
	dirs := map[string]string{"disk": ""}
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		dirs["tmpfs"] = "/dev/shm"
	}
	for fsName, parent := range dirs {
		t.Run(fsName, func(t *testing.T) {
			dir := ""
			if parent != "" {
				var err error
				if dir, err = os.MkdirTemp(parent, "kvtier-readblock-"); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { os.RemoveAll(dir) })
			}
			s := openStore(t, Config{Capacity: 1 << 30, Dir: dir})
			for i, data := range [][]byte{pageData(6, 4), sparse} {
				rel := blockRel(testTier, 0, hashHex(10+i, 64))
				putBlock(t, s, rel, data)
				got, err := s.ReadBlock(rel)
				if err != nil {
					t.Fatalf("ReadBlock of block %d: %v", i, err)
				}
				if !bytes.Equal(got, data) || cap(got) != len(got) {
					t.Fatalf("ReadBlock of block %d: %d bytes (cap %d), want its %d bytes", i, len(got), cap(got), len(data))
				}
				if addr := uintptr(unsafe.Pointer(unsafe.SliceData(got))); addr%uintptr(block.PageSize) != 0 {
					t.Fatalf("ReadBlock of block %d returned a buffer at %#x, not page aligned", i, addr)
				}
				s.RecycleBlock(got)
			}
			for name, damage := range map[string]func(p string){
				"flipped": func(p string) { flipByte(t, p, page64+5) },
				"truncated": func(p string) {
					if err := os.Truncate(p, 2*page64); err != nil {
						t.Fatal(err)
					}
				},
			} {
				rel := blockRel(testTier, 1, hashHex(len(name), 64))
				putBlock(t, s, rel, pageData(8, 4))
				damage(s.Path(rel))
				got, err := s.ReadBlock(rel)
				if got != nil {
					t.Errorf("%s block: ReadBlock returned %d bytes", name, len(got))
				}
				wantErrno(t, err, syscall.EIO, name+" block")
				if s.Contains(rel) {
					t.Errorf("%s block still in the index", name)
				}
			}
		})
	}
}

// TestReadIntoLandsInOrder reads blocks of one and of several chunks (the
// last one partial, and more chunks than reads in flight): landed reports a growing
// run from the block's start that ends at its size; a block cut short in
// its middle chunks fails with EIO and counts one checksum failure.
func TestReadIntoLandsInOrder(t *testing.T) {
	s := openStore(t, Config{Capacity: 1 << 30})
	for i, size := range []int{ReadChunk, 3*ReadChunk + 5*block.PageSize, 9*ReadChunk + 3*block.PageSize} {
		data := bytes.Repeat(pageData(20+i, 16), size/(16*block.PageSize)+1)[:size]
		rel := blockRel(fmt.Sprintf("model%d_0123456789ab_r0", i), 0, hashHex(30+i, 64))
		putBlock(t, s, rel, data)
		r, err := s.PinBlock(rel)
		if err != nil {
			t.Fatal(err)
		}
		buf := s.Buffer(size)
		var prefixes []int
		if err := r.ReadInto(buf, func(prefix int) { prefixes = append(prefixes, prefix) }); err != nil {
			t.Fatalf("block of %d bytes: %v", size, err)
		}
		r.Close()
		if !bytes.Equal(buf, data) {
			t.Fatalf("block of %d bytes: wrong bytes", size)
		}
		for j := range prefixes {
			if j > 0 && prefixes[j] <= prefixes[j-1] || prefixes[j]%ReadChunk != 0 && prefixes[j] != size {
				t.Fatalf("block of %d bytes: landed %v, want growing runs of whole chunks", size, prefixes)
			}
		}
		if len(prefixes) == 0 || prefixes[len(prefixes)-1] != size {
			t.Fatalf("block of %d bytes: landed %v, want it to end at %d", size, prefixes, size)
		}
		s.RecycleBlock(buf)
	}
	rel := blockRel("cut_0123456789ab_r0", 1, hashHex(40, 64))
	size := 9 * ReadChunk
	putBlock(t, s, rel, bytes.Repeat(pageData(41, 16), size/(16*block.PageSize)))
	if err := os.Truncate(s.Path(rel), 4*ReadChunk+page64); err != nil {
		t.Fatal(err)
	}
	r, err := s.PinBlock(rel)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	before := s.Counters().ChangedOutside.Load()
	buf := s.Buffer(size)
	defer s.RecycleBlock(buf)
	wantErrno(t, r.ReadInto(buf, nil), syscall.EIO, "block cut short")
	if got := s.Counters().ChangedOutside.Load() - before; got != 1 || s.Contains(rel) {
		t.Fatalf("block cut short in the store tree: %d counted changed outside, still indexed %v; want 1, false", got, s.Contains(rel))
	}
}

// TestReadIntoChecksEveryPiece damages one byte at a time at the edges of the
// requests a chunk is read in (a store in memory reads block.CachePiece
// bytes per request and sums each as it lands; a disk one whole chunk per
// request), on the disk and on tmpfs: every damaged byte fails the read with
// EIO, no proven prefix reaches into its chunk, and an intact block reads
// whole.
func TestReadIntoChecksEveryPiece(t *testing.T) {
	dirs := map[string]string{"disk": ""}
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		dirs["tmpfs"] = "/dev/shm"
	}
	size := 3*ReadChunk + 5*block.PageSize
	data := bytes.Repeat(pageData(50, 16), size/(16*block.PageSize)+1)[:size]
	for fsName, parent := range dirs {
		t.Run(fsName, func(t *testing.T) {
			dir := ""
			if parent != "" {
				var err error
				if dir, err = os.MkdirTemp(parent, "kvtier-pieces-"); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { os.RemoveAll(dir) })
			}
			s := openStore(t, Config{Capacity: 1 << 30, Dir: dir})
			read := func(rel string) ([]byte, int, error) {
				r, err := s.PinBlock(rel)
				if err != nil {
					t.Fatal(err)
				}
				defer r.Close()
				// An O_DIRECT read of tmpfs is a copy by the CPU; of the disk, a DMA.
				want := ReadChunk
				if fsName == "tmpfs" {
					want = block.CachePiece
				}
				if got := s.readPiece(true); got != want {
					t.Fatalf("a store on %s reads %d bytes per O_DIRECT request, want %d", fsName, got, want)
				}
				if got := s.readPiece(false); got != block.CachePiece {
					t.Fatalf("a buffered read of a store on %s moves %d bytes per request, want %d", fsName, got, block.CachePiece)
				}
				buf := s.Buffer(size)
				proven := 0
				err = r.ReadInto(buf, func(prefix int) { proven = prefix })
				return buf, proven, err
			}
			for i, off := range []int{0, block.CachePiece - 1, block.CachePiece, 2*ReadChunk + 3*block.CachePiece + 7, ReadChunk - 1, size - 1} {
				rel := blockRel(testTier, 0, hashHex(60+i, 64))
				putBlock(t, s, rel, data)
				flipByte(t, s.Path(rel), int64(off))
				buf, proven, err := read(rel)
				wantErrno(t, err, syscall.EIO, fmt.Sprintf("byte %d damaged", off))
				if damaged := off / ReadChunk * ReadChunk; proven > damaged {
					t.Fatalf("byte %d damaged: %d bytes proven, beyond the damaged chunk's start %d", off, proven, damaged)
				}
				if s.Contains(rel) {
					t.Fatalf("byte %d damaged: the block is still indexed", off)
				}
				s.RecycleBlock(buf)
			}
			rel := blockRel(testTier, 1, hashHex(70, 64))
			putBlock(t, s, rel, data)
			buf, proven, err := read(rel)
			if err != nil || proven != size || !bytes.Equal(buf, data) {
				t.Fatalf("intact block: %v, %d bytes proven, bytes equal %v; want nil, %d, true", err, proven, bytes.Equal(buf, data), size)
			}
			s.RecycleBlock(buf)
		})
	}
}
