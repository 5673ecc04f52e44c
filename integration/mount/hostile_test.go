package mount_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

// rootOnlyFile creates a 17-byte file only root may read, outside everything
// the daemon serves, as the target of planted links.
func rootOnlyFile(t *testing.T) (string, []byte) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "shadow")
	content := []byte("root:x:0:0::/:/x\n")
	if err := os.WriteFile(p, content, 0o600); err != nil {
		t.Fatal(err)
	}
	return p, content
}

// checkUntouched fails if a planted link's target changed or got an xattr.
func checkUntouched(t *testing.T, p string, content []byte) {
	t.Helper()
	if got, err := os.ReadFile(p); err != nil || !bytes.Equal(got, content) {
		t.Fatalf("link target %s changed: %d bytes, %v", p, len(got), err)
	}
	buf := make([]byte, 1024)
	if n, err := unix.Listxattr(p, buf); err != nil || n != 0 {
		t.Fatalf("link target %s got xattrs %q (%v)", p, buf[:max(n, 0)], err)
	}
}

// A link to a root-only file and another user's file matching --shm-glob
// are not mapped: listed and counted as ignored in stats, and the engine's
// own region still works.
func TestShmGlobIgnoresLinksAndStrangers(t *testing.T) {
	region := newRegion(t, 2)
	base := strings.TrimSuffix(region.Path, ".mmap")
	link, foreign := base+"-link.mmap", base+"-foreign.mmap"
	target, content := rootOnlyFile(t)
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(link) })
	if err := os.WriteFile(foreign, make([]byte, 2*rowBytes), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(foreign) })
	if err := os.Chown(foreign, 64321, 64321); err != nil {
		t.Fatal(err)
	}
	d := mounttest.Start(t, mounttest.Options{ShmGlob: base + "*.mmap"})
	tier := openTier(t, d)
	path := storeBlock(t, tier, region.Row(0), 1)
	if err := tier.Load(path, region.Row(1)); err != nil || !bytes.Equal(region.Row(1), expectedRow(1)) {
		t.Fatalf("load into the engine's region: %v", err)
	}
	st := d.Stats()
	ignored := onlyRegion(t, st, region.Path)
	if len(ignored) != 2 || !strings.Contains(ignored[link], "symbolic link") || !strings.Contains(ignored[foreign], "64321") {
		t.Fatalf("ignored %+v, want the link and the foreign file", st.Primary.Ignored)
	}
	if st.Counters.ShmIgnored != 2 || st.Counters.LoadsFromRow != 1 {
		t.Fatalf("counters: %d ignored (want 2), %d loads from a region row (want 1)", st.Counters.ShmIgnored, st.Counters.LoadsFromRow)
	}
	warned := 0
	for _, w := range st.Warnings {
		if w.Code == "shm_ignored" && strings.HasPrefix(w.Message, "2 files match") {
			warned++
		}
	}
	if warned != 1 {
		t.Fatalf("%d shm_ignored warnings counting 2 files in %+v, want one", warned, st.Warnings)
	}
	checkUntouched(t, target, content)
}

// A region truncated by another user while the daemon has it mapped does
// not kill the daemon: loads go on (proven another way or failing cleanly)
// and the mount keeps answering.
func TestRegionTruncatedUnderLoad(t *testing.T) {
	const rows = 8
	region := newRegion(t, rows)
	d := mounttest.Start(t, mounttest.Options{ShmGlob: region.Path})
	tier := openTier(t, d)
	var paths []string
	for i := 0; i < 4; i++ {
		paths = append(paths, storeBlock(t, tier, region.Row(0), i))
	}
	if err := tier.Load(paths[0], region.Row(1)); err != nil {
		t.Fatal(err)
	}
	// Keep rows 0 and 1; the daemon's mapping still spans all 8.
	if err := os.Truncate(region.Path, 2*rowBytes); err != nil {
		t.Fatal(err)
	}
	for i, p := range paths {
		err := tier.Load(p, region.Row(1))
		if errors.Is(err, syscall.ENOTCONN) || !d.Running() {
			t.Fatalf("load %d after truncation: %v; daemon running %v\n%s", i, err, d.Running(), d.Log())
		}
		if err == nil && !bytes.Equal(region.Row(1), expectedRow(i)) {
			t.Fatalf("load %d after truncation succeeded with wrong bytes", i)
		}
	}
	st := d.Stats()
	if !d.Running() {
		t.Fatal("daemon died")
	}
	t.Logf("after truncation: %d regions faulted, %d loads from the store, %d from a row", st.Counters.ShmFaults, st.Counters.LoadsFromStore, st.Counters.LoadsFromRow)
	if len(st.Primary.Regions) != 1 || st.Primary.Regions[0].Size != 2*rowBytes {
		t.Fatalf("regions after truncation %+v, want the 2-row region remapped", st.Primary.Regions)
	}
}

// A tmp file swapped for a symlink through the mount (rename of a link over
// the tmp's name) and then renamed to its block is refused: the link target
// is not opened, extended nor given an xattr, and no block appears.
func TestTmpSwappedForSymlinkRefused(t *testing.T) {
	region := newRegion(t, 1)
	d := mounttest.Start(t, mounttest.Options{ShmGlob: region.Path})
	openTier(t, d)
	target, content := rootOnlyFile(t)
	dir := d.Path(tierDir, "abc", "de_g0")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	hash := hashOf(7)
	block := filepath.Join(dir, hash+".bin")
	tmp := block + "_1.tmp"
	fillRow(region.Row(0), 7)
	fd, err := unix.Open(tmp, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := unix.Write(fd, region.Row(0)); err != nil || n != rowBytes {
		t.Fatalf("write: %d, %v", n, err)
	}
	unix.Close(fd)
	planted := filepath.Join(dir, "planted")
	if err := os.Symlink(target, planted); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(planted, tmp); err != nil {
		t.Fatalf("renaming a link over the tmp: %v", err)
	}
	err = os.Rename(tmp, block)
	if !errors.Is(err, syscall.EPERM) {
		t.Fatalf("rename of the swapped tmp to its block: %v, want EPERM", err)
	}
	checkUntouched(t, target, content)
	if _, err := os.Lstat(block); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("block after a refused publish: %v", err)
	}
	if st := d.Stats(); st.Disk.Blocks != 0 || st.Counters.PublishRefused != 1 {
		t.Fatalf("stats: %d blocks, %d publishes refused; want 0, 1", st.Disk.Blocks, st.Counters.PublishRefused)
	}
}

// A directory holding a tmp file not yet renamed cannot be renamed: the
// store would lose track of the tmp and of the bytes it holds.
func TestRenameOfDirectoryHoldingTmpRefused(t *testing.T) {
	d := mounttest.Start(t, mounttest.Options{})
	openTier(t, d)
	dir := d.Path(tierDir, "abc", "de_g0")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, hashOf(3)+".bin_1.tmp")
	row := expectedRow(3)
	if err := os.WriteFile(tmp, row, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(d.Path(tierDir, "abc"), d.Path(tierDir, "moved")); !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("rename of a directory holding a tmp: %v, want EBUSY", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, hashOf(3)+".bin")); err != nil {
		t.Fatalf("publishing the tmp after the refused rename: %v", err)
	}
	if st := d.Stats(); st.Disk.Blocks != 1 || st.Disk.InFlightTmp != 0 {
		t.Fatalf("stats: %d blocks, %d tmps; want 1, 0", st.Disk.Blocks, st.Disk.InFlightTmp)
	}
}

// A local user with user_allow_other in /etc/fuse.conf mounts a FUSE server
// that never answers on names under --shm-glob: a directory, and a file (a
// file of the server bind-mounted there). A stat of either waits in the
// kernel for good, SIGKILL or not. The daemon starts, serves loads and
// stats.json, and `kvtierfs stat` and `gc-regions` finish, none of them
// asking the server anything; both names are listed as ignored mount points.
// A watchdog answers the server's requests after a minute, so that a
// regression fails here instead of hanging the suite.
func TestShmGlobNeverWaitsOnAMountedServer(t *testing.T) {
	region := newRegion(t, 2)
	base := strings.TrimSuffix(region.Path, ".mmap")
	dirMount, fileMount := base+"-dir.mmap", base+"-file.mmap"
	if err := os.Mkdir(dirMount, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(dirMount) })
	if err := os.WriteFile(fileMount, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(fileMount) })
	h := mountHangFS(t, dirMount)
	if err := os.WriteFile(filepath.Join(dirMount, "f"), make([]byte, 2*rowBytes), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(filepath.Join(dirMount, "f"), fileMount, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(fileMount, unix.MNT_DETACH) })
	h.hang()
	var waited atomic.Bool
	watchdog := time.AfterFunc(time.Minute, func() { waited.Store(true); h.resume() })
	defer watchdog.Stop()
	glob := base + "*.mmap"

	d := mounttest.Start(t, mounttest.Options{ShmGlob: glob})
	tier := openTier(t, d)
	path := storeBlock(t, tier, region.Row(0), 1)
	if err := tier.Load(path, region.Row(1)); err != nil || !bytes.Equal(region.Row(1), expectedRow(1)) {
		t.Fatalf("load into the engine's region: %v", err)
	}
	st := d.Stats()
	statOut, statErr := mounttest.Run("stat", d.Mountpoint, "--shm-glob", glob)
	// The mount points alone: with a region to prove orphaned, gc-regions
	// would also read every process's mappings, which a sandbox may deny.
	gcOut, gcErr := mounttest.Run("gc-regions", "--shm-glob", base+"-*.mmap", "--dry-run")
	if waited.Load() {
		t.Fatal("the daemon or a command waited on the FUSE server mounted under the glob until the watchdog answered it")
	}
	ignored := onlyRegion(t, st, region.Path)
	if len(ignored) != 2 || !strings.Contains(ignored[dirMount], "not a regular file") || !strings.Contains(ignored[fileMount], "mount point") {
		t.Fatalf("ignored %+v, want the directory (not a regular file) and the file mount point", st.Primary.Ignored)
	}
	if statErr != nil || gcErr != nil {
		t.Fatalf("stat: %v\n%s\ngc-regions --dry-run: %v\n%s", statErr, statOut, gcErr, gcOut)
	}
	if strings.Contains(gcOut, fileMount) || strings.Contains(gcOut, dirMount) {
		t.Fatalf("gc-regions lists a mount point as a region:\n%s", gcOut)
	}
}

// onlyRegion fails t unless the daemon's stats list region as its one primary
// region, and returns the reason of each name it ignored, by path.
func onlyRegion(t *testing.T, st ctlabi.Stats, region string) map[string]string {
	t.Helper()
	if len(st.Primary.Regions) != 1 || st.Primary.Regions[0].Path != region {
		t.Fatalf("regions %+v, want only %s", st.Primary.Regions, region)
	}
	ignored := map[string]string{}
	for _, ig := range st.Primary.Ignored {
		ignored[ig.Path] = ig.Reason
	}
	return ignored
}
