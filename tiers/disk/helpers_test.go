package disk

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"iter"
	"maps"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// fakeClock is a goroutine-safe injectable clock for Config.Now.
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	// A realistic base: lastLookup of a never-looked-up block is 0, so the clock
	// must be far from the epoch for such blocks to be unprotected.
	c.ns.Store(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC).UnixNano())
	return c
}

func (c *fakeClock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// hashHex returns a deterministic lowercase hex hash of n characters (n <= 64).
func hashHex(i, n int) string {
	sum := sha256.Sum256([]byte("block-" + strconv.Itoa(i)))
	return hex.EncodeToString(sum[:])[:n]
}

// blockRel is the engine's path of a block: <tier>/<h[0:3]>/<h[3:5]>_g<group>/<h>.bin.
func blockRel(tier string, group int, h string) string {
	return fmt.Sprintf("%s/%s/%s_g%d/%s.bin", tier, h[:3], h[3:5], group, h)
}

// tmpRelFor is the engine's tmp name for a block.
func tmpRelFor(rel string, n int) string { return fmt.Sprintf("%s_%d.tmp", rel, n) }

// pageData returns pages*block.PageSize deterministic bytes for a seed.
func pageData(seed, pages int) []byte {
	b := make([]byte, pages*block.PageSize)
	x := uint32(seed)*2654435761 + 12345
	for i := range b {
		x = x*1664525 + 1013904223
		b[i] = byte(x >> 24)
	}
	return b
}

func crcOf(b []byte) uint32 { return crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)) }

// vllmXattr is the value vLLM PR #57912 sets as user.vllm.kv_crc32c: the
// CRC32C in four big-endian bytes (io.py _store_block:
// crc32c(view_slice).to_bytes(4, "big")).
func vllmXattr(crc uint32) []byte { return binary.BigEndian.AppendUint32(nil, crc) }

// openStore opens a store in a fresh temporary directory (unless cfg.Dir is set)
// and closes it when the test ends.
func openStore(t testing.TB, cfg Config) *Store {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	s, err := Open(cfg)
	if err != nil {
		t.Fatalf("Open(%s): %v", cfg.Dir, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// mkdirFor creates the parent directory of a store-relative path, as the
// engine's makedirs does before it stores a block.
func mkdirFor(t *testing.T, s *Store, rel string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(s.Path(rel)), 0o755); err != nil {
		t.Fatal(err)
	}
}

var tmpSeq atomic.Int64

const engineCreateFlags = syscall.O_CREAT | syscall.O_EXCL | syscall.O_WRONLY | syscall.O_TRUNC | syscall.O_DIRECT

// writeTmp creates a tmp for rel, writes data in one WriteAt at 0 and closes it.
func writeTmp(t *testing.T, s *Store, rel string, data []byte) string {
	t.Helper()
	mkdirFor(t, s, rel)
	tmp := tmpRelFor(rel, int(tmpSeq.Add(1)))
	w, err := s.CreateTmp(tmp, engineCreateFlags)
	if err != nil {
		t.Fatalf("CreateTmp(%s): %v", tmp, err)
	}
	if n, err := w.WriteAt(data, 0); err != nil || n != len(data) {
		t.Fatalf("WriteAt(%s, %d bytes) = %d, %v", tmp, len(data), n, err)
	}
	if err := w.Close(); err != nil {
		t.Fatalf("Close(%s): %v", tmp, err)
	}
	return tmp
}

// putBlock stores a block the way the engine does: create tmp, one write,
// close, rename (the rename returns once the block is proven).
func putBlock(t *testing.T, s *Store, rel string, data []byte) {
	t.Helper()
	tmp := writeTmp(t, s, rel, data)
	if err := s.Publish(tmp, rel); err != nil {
		t.Fatalf("Publish(%s -> %s): %v", tmp, rel, err)
	}
}

// readBlock loads a block through OpenBlock and returns its bytes.
func readBlock(t *testing.T, s *Store, rel string) []byte {
	t.Helper()
	r, err := s.OpenBlock(rel)
	if err != nil {
		t.Fatalf("OpenBlock(%s): %v", rel, err)
	}
	defer r.Close()
	buf := make([]byte, r.Size())
	if _, err := r.File().ReadAt(buf, 0); err != nil {
		t.Fatalf("reading %s: %v", rel, err)
	}
	return buf
}

func wantErrno(t *testing.T, err error, want syscall.Errno, what string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: got nil error, want %v", what, want)
	}
	if !errors.Is(err, want) || Errno(err) != want {
		t.Fatalf("%s: got %v (errno %v), want %v", what, err, Errno(err), want)
	}
}

func exists(t *testing.T, p string) bool {
	t.Helper()
	_, err := os.Lstat(p)
	if err == nil {
		return true
	}
	if errors.Is(err, fs.ErrNotExist) {
		return false
	}
	t.Fatal(err)
	return false
}

// physicalOf is the allocated size of a file, as the store accounts it.
func physicalOf(t *testing.T, p string) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// blockFilesOnDisk lists the store-relative paths of block files on disk.
func blockFilesOnDisk(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		if kind, _ := block.Parse(rel); kind == block.File {
			out = append(out, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}

// fileOnDisk is a regular file's inode and what it allocates.
type fileOnDisk struct {
	id        fileID
	allocated int64
}

// regularFilesOnDisk lists every regular file under root by relative path.
func regularFilesOnDisk(t *testing.T, root string) map[string]fileOnDisk {
	t.Helper()
	files := make(map[string]fileOnDisk)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		files[rel] = fileOnDisk{id: fileID{dev: st.Dev, ino: st.Ino}, allocated: st.Blocks * 512}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// checkAccounting asserts that the index matches the block files on disk and
// that the used byte count is exactly the blocks' physical bytes plus the
// bytes of the tracked tmp files plus what every other file allocates.
func checkAccounting(t *testing.T, s *Store) {
	t.Helper()
	onDisk := blockFilesOnDisk(t, s.Root())
	files := regularFilesOnDisk(t, s.Root())
	s.mu.Lock()
	var indexed []string
	var want int64
	walked := blockTotals{groups: make(map[int]GroupStats)}
	for rel, b := range s.blocks {
		indexed = append(indexed, rel)
		want += b.physical
		walked.add(b, 1)
		if !b.present {
			t.Errorf("indexed block %s is marked not present", rel)
		}
		if b.readers != 0 {
			t.Errorf("block %s has %d readers with no Reader open", rel, b.readers)
		}
	}
	for _, tmp := range s.tmps {
		want += tmp.size
	}
	under := make(map[string]int)
	for _, names := range []iter.Seq[string]{maps.Keys(s.blocks), maps.Keys(s.tmps)} {
		for rel := range names {
			for dir := path.Dir(rel); dir != "."; dir = path.Dir(dir) {
				under[dir]++
			}
		}
	}
	if !maps.Equal(under, s.underDirs) {
		t.Errorf("blocks and tmps under each directory: %v counted, %v in the index", s.underDirs, under)
	}
	counted := make(map[fileID]bool)
	for rel, f := range files {
		if s.blocks[rel] == nil && s.tmps[rel] == nil && !counted[f.id] {
			counted[f.id] = true
			want += f.allocated
		}
	}
	used := s.used
	if !reflect.DeepEqual(walked, s.totals) {
		t.Errorf("running totals %+v, the index sums to %+v", s.totals, walked)
	}
	lruLen := s.lru.Len()
	nBlocks := len(s.blocks)
	s.mu.Unlock()
	sort.Strings(indexed)
	if fmt.Sprint(indexed) != fmt.Sprint(onDisk) {
		t.Errorf("index and disk disagree:\nindex: %v\ndisk:  %v", indexed, onDisk)
	}
	if used != want {
		t.Errorf("used = %d, want %d (block physical bytes + tmp bytes + other files)", used, want)
	}
	if lruLen != nBlocks {
		t.Errorf("LRU list has %d entries, index has %d blocks", lruLen, nBlocks)
	}
	var onDiskPhys int64
	for _, rel := range onDisk {
		onDiskPhys += physicalOf(t, s.Path(rel))
	}
	st := s.Stats()
	if st.PhysicalBytes != onDiskPhys {
		t.Errorf("Stats.PhysicalBytes = %d, files on disk occupy %d", st.PhysicalBytes, onDiskPhys)
	}
	if st.FreeBytes < 0 || st.FreeBytes > st.CapacityBytes {
		t.Errorf("FreeBytes %d outside [0, capacity %d]", st.FreeBytes, st.CapacityBytes)
	}
}

// removals collects the blocks the store tells its listeners it removed by itself.
type removals struct{ ch chan string }

func watchRemovals(s *Store) *removals {
	r := &removals{ch: make(chan string, 1024)}
	s.Listen(func(e Event) {
		if e.Kind == Removed {
			r.ch <- e.Rel
		}
	})
	return r
}

// next waits for the next reported removal (generous deadline: this is a
// liveness check, not a timing assertion).
func (r *removals) next(t *testing.T) string {
	t.Helper()
	select {
	case rel := <-r.ch:
		return rel
	case <-time.After(20 * time.Second):
		t.Fatal("no removal was reported")
		return ""
	}
}

// storeRecord returns the value of the store's xattr on a block file (the
// checksum record under block.ReservedXattrPrefix); ok is false when it has none.
func storeRecord(t *testing.T, p string) ([]byte, bool) {
	t.Helper()
	buf := make([]byte, 4096)
	n, err := unix.Listxattr(p, buf)
	if err != nil {
		t.Fatalf("listxattr %s: %v", p, err)
	}
	var found []byte
	ok := false
	for _, name := range strings.Split(string(buf[:n]), "\x00") {
		if !strings.HasPrefix(name, block.ReservedXattrPrefix) {
			continue
		}
		if ok {
			t.Fatalf("%s has more than one store xattr", p)
		}
		val := make([]byte, 4096)
		m, err := unix.Getxattr(p, name, val)
		if err != nil {
			t.Fatalf("getxattr %s %s: %v", p, name, err)
		}
		found, ok = val[:m], true
	}
	return found, ok
}

// checkRecord asserts that a block file carries a record holding the CRC32C
// and the size of data (big-endian, wherever the record's format puts them).
func checkRecord(t *testing.T, p string, data []byte) {
	t.Helper()
	rec, ok := storeRecord(t, p)
	if !ok {
		t.Fatalf("%s has no checksum record", p)
	}
	crc := binary.BigEndian.AppendUint32(nil, crcOf(data))
	size := binary.BigEndian.AppendUint64(nil, uint64(len(data)))
	if !bytes.Contains(rec, crc) || !bytes.Contains(rec, size) {
		t.Errorf("record of %s = %x: want CRC32C %x and size %x in it", p, rec, crc, size)
	}
}

// page64 is block.PageSize where sizes and offsets are int64.
var page64 = int64(block.PageSize)
