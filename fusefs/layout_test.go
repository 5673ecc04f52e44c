package fusefs

import (
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/tiers/disk"
)

// layoutNames lists the index's layout names and block names, sorted.
func layoutNames(x *lookupIndex) (layout, blocks []string) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	for rel := range x.layout {
		layout = append(layout, rel)
	}
	for rel := range x.blocks {
		blocks = append(blocks, rel)
	}
	sort.Strings(layout)
	sort.Strings(blocks)
	return layout, blocks
}

func mustMkdir(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
}

func mustWrite(t *testing.T, file string) {
	t.Helper()
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
}

func equalNames(t *testing.T, what string, got, want []string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %q, want %q", what, got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("%s: %q, want %q", what, got, want)
		}
	}
}

// The index built from a store holds every name of the two directory levels
// and the blocks' attributes, answers absent for everything else, and follows
// the changes the mount reports.
func TestLookupIndexFollowsTheStore(t *testing.T) {
	root := t.TempDir()
	block := "T/abc/de_g0/abcde0123456789abcdef0123456789a.bin"
	mustMkdir(t, filepath.Join(root, "T/abc/de_g0"))
	mustMkdir(t, filepath.Join(root, "T/abc/notlayout"))
	mustMkdir(t, filepath.Join(root, "T/fff"))
	mustWrite(t, filepath.Join(root, block))
	mustWrite(t, filepath.Join(root, "T/config.json"))
	mustWrite(t, filepath.Join(root, "T/0aa")) // a file at a directory level
	if err := os.Symlink("/etc", filepath.Join(root, "Link")); err != nil {
		t.Fatal(err)
	}
	x := newLookupIndex(openStoreAt(t, root), &fs.LoopbackRoot{Path: root})
	x.scan("")
	layout, blocks := layoutNames(x)
	equalNames(t, "layout", layout, []string{"T/0aa", "T/abc", "T/abc/de_g0", "T/fff"})
	equalNames(t, "blocks", blocks, []string{block})
	if e, exists, known := x.layoutAnswer("T/abc"); !known || !exists || e.attr.Mode&0o170000 != 0o040000 {
		t.Fatalf("T/abc: exists %v, known %v, mode %o", exists, known, e.attr.Mode)
	}
	if _, exists, known := x.layoutAnswer("T/abd"); !known || exists {
		t.Fatalf("T/abd: exists %v, known %v; want known absent", exists, known)
	}
	for _, rel := range []string{"V/abc", "T/abd/de_g0", "T/0aa/de_g0"} {
		if _, exists, known := x.layoutAnswer(rel); known || exists {
			t.Fatalf("%s, below no indexed directory: exists %v, known %v; want a question for the store", rel, exists, known)
		}
	}

	// mkdir, then a rename of a whole tier, then removals.
	mustMkdir(t, filepath.Join(root, "T/123/45_g1"))
	x.changed("T/123")
	x.changed("T/123/45_g1")
	if _, exists, _ := x.layoutAnswer("T/123/45_g1"); !exists {
		t.Fatal("a new group directory is not indexed")
	}
	if err := os.Rename(filepath.Join(root, "T"), filepath.Join(root, "U")); err != nil {
		t.Fatal(err)
	}
	x.moved("T")
	x.moved("U")
	layout, blocks = layoutNames(x)
	equalNames(t, "layout after the tier moved", layout, []string{"U/0aa", "U/123", "U/123/45_g1", "U/abc", "U/abc/de_g0", "U/fff"})
	equalNames(t, "blocks after the tier moved", blocks, []string{"U" + block[1:]})
	if err := os.Remove(filepath.Join(root, "U/fff")); err != nil {
		t.Fatal(err)
	}
	x.changed("U/fff")
	x.forgetBlock("U" + block[1:])
	layout, blocks = layoutNames(x)
	equalNames(t, "layout after rmdir", layout, []string{"U/0aa", "U/123", "U/123/45_g1", "U/abc", "U/abc/de_g0"})
	equalNames(t, "blocks after removal", blocks, nil)

	// A new tier directory: its prefix names are known absent; once it is
	// removed, a question for the store again.
	mustMkdir(t, filepath.Join(root, "W"))
	x.changed("W")
	if _, exists, known := x.layoutAnswer("W/abc"); !known || exists {
		t.Fatalf("W/abc in a new tier: exists %v, known %v; want known absent", exists, known)
	}
	if err := os.Remove(filepath.Join(root, "W")); err != nil {
		t.Fatal(err)
	}
	x.changed("W")
	if _, _, known := x.layoutAnswer("W/abc"); known {
		t.Fatal("a name under a removed tier was answered from the index")
	}
}

// A tier directory the index cannot read leaves its names to the store.
func TestLookupIndexUnreadableTier(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root reads any directory")
	}
	root := t.TempDir()
	mustMkdir(t, filepath.Join(root, "T/abc"))
	if err := os.Chmod(filepath.Join(root, "T"), 0); err != nil {
		t.Fatal(err)
	}
	defer os.Chmod(filepath.Join(root, "T"), 0o700)
	x := newLookupIndex(openStoreAt(t, root), &fs.LoopbackRoot{Path: root})
	x.scan("")
	if _, _, known := x.layoutAnswer("T/abc"); known {
		t.Fatal("a name under an unreadable tier was answered from the index")
	}
}

// absentLookup is a raw filesystem whose lookups fail with ENOENT, with the
// entry timeout given.
type absentLookup struct {
	fuse.RawFileSystem
	timeout time.Duration
}

func (a absentLookup) Lookup(cancel <-chan struct{}, header *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	out.SetEntryTimeout(a.timeout)
	return fuse.ENOENT
}

// An absent answer with a lifetime reaches the kernel as a cacheable entry
// without an inode; one without stays an uncached ENOENT.
func TestAbsentEntries(t *testing.T) {
	for _, timeout := range []time.Duration{0, time.Hour} {
		raw := absentEntries{absentLookup{RawFileSystem: fuse.NewDefaultRawFileSystem(), timeout: timeout}}
		out := fuse.EntryOut{NodeId: 7}
		status := raw.Lookup(nil, &fuse.InHeader{}, "abc", &out)
		switch {
		case timeout == 0 && status != fuse.ENOENT:
			t.Errorf("absent without a lifetime: status %v, want ENOENT", status)
		case timeout > 0 && (status != fuse.OK || out.NodeId != 0 || out.EntryTimeout() != timeout):
			t.Errorf("absent for %v: status %v, node %d, timeout %v; want OK, node 0, %v", timeout, status, out.NodeId, out.EntryTimeout(), timeout)
		}
	}
}

// openStoreAt opens a block store at root for the test's length.
func openStoreAt(t *testing.T, root string) *disk.Store {
	t.Helper()
	store, err := disk.Open(disk.Config{Dir: root})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	return store
}

// statFromStatx keeps every field, whatever width stat's fields have on this
// architecture (Nlink and Blksize are 32 bits on arm64, 64 on amd64).
func TestStatFromStatxMatchesStat(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, make([]byte, 12345), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(path, path+".2"); err != nil {
		t.Fatal(err)
	}
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, 0, unix.STATX_BASIC_STATS, &stx); err != nil {
		t.Fatal(err)
	}
	var want syscall.Stat_t
	if err := syscall.Stat(path, &want); err != nil {
		t.Fatal(err)
	}
	got := statFromStatx(&stx)
	if got.Dev != want.Dev || got.Ino != want.Ino || got.Nlink != want.Nlink || got.Nlink != 2 || got.Mode != want.Mode ||
		got.Size != want.Size || got.Blksize != want.Blksize || got.Blocks != want.Blocks || got.Mtim != want.Mtim {
		t.Errorf("statFromStatx = %+v, stat says %+v", got, want)
	}
}
