package mount_test

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

// smallFilesystem mounts a filesystem of mib MiB at a new directory, removed
// at cleanup: ext4 on a loop device when the kernel offers one (kind "ext4"),
// else tmpfs (kind "tmpfs"). Device-mapper is not used: its driver is often
// missing (containers, this project's CI machine).
func smallFilesystem(t *testing.T, mib int) (dir, kind string) {
	t.Helper()
	base := t.TempDir()
	dir = filepath.Join(base, "fs")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(base, "fs.img")
	kind = "ext4"
	err := os.WriteFile(img, nil, 0o600)
	if err == nil {
		err = os.Truncate(img, int64(mib)<<20)
	}
	if err == nil {
		err = run("mkfs.ext4", "-q", "-F", "-m", "0", img)
	}
	if err == nil {
		err = run("mount", "-o", "loop", img, dir)
	}
	if err != nil {
		t.Logf("no loop-device ext4 (%v): using tmpfs", err)
		kind = "tmpfs"
		if err := run("mount", "-t", "tmpfs", "-o", "size="+strconv.Itoa(mib)+"m", "tmpfs", dir); err != nil {
			t.Skipf("SKIP: cannot mount a small filesystem: %v", err)
		}
	}
	t.Cleanup(func() {
		for range 50 {
			if unix.Unmount(dir, 0) == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		unix.Unmount(dir, unix.MNT_DETACH)
	})
	return dir, kind
}

func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return errors.New(name + " " + strings.Join(args, " ") + ": " + err.Error() + ": " + string(out))
	}
	return nil
}

// TestStoreFilesystemFills stores blocks while another writer fills the store
// filesystem (a 12 MiB ext4 on a loop device, or tmpfs), with --capacity far
// above what the filesystem holds: every store succeeds or fails with
// ENOSPC, no tmp is left behind, blocks protected by a lookup survive and
// load byte-exact, every other block stored loads byte-exact or is absent
// (evicted to make room), stat names the fault, and once the space is back
// the daemon stores and serves again.
func TestStoreFilesystemFills(t *testing.T) {
	fsDir, kind := smallFilesystem(t, 12)
	store := filepath.Join(fsDir, "store")
	if err := os.Mkdir(store, 0o755); err != nil {
		t.Fatal(err)
	}
	d := mounttest.Start(t, mounttest.Options{Store: store, Args: []string{"--capacity", "1GiB", "--staging-bytes", "0"}})
	tier := openTier(t, d)
	region := newRegion(t, 2)

	const before = 8 // stored while the filesystem has room
	var stored []int
	for i := range before {
		// Looked up after the store, as the engine's next request does: these
		// are protected from eviction and must survive the filling intact.
		if !tier.Exists(storeBlock(t, tier, region.Row(0), i)) {
			t.Fatalf("block %d absent right after its store", i)
		}
		stored = append(stored, i)
	}
	filler := filepath.Join(fsDir, "filler")
	var stop atomic.Bool
	var fillerFull atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		f, err := os.OpenFile(filler, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			t.Error(err)
			return
		}
		defer f.Close()
		chunk := make([]byte, 64<<10)
		for !stop.Load() {
			_, err := f.Write(chunk)
			if errors.Is(err, syscall.ENOSPC) {
				fillerFull.Add(1)
			} else if err != nil {
				t.Error(err)
				return
			}
			time.Sleep(time.Millisecond) // fill at about 64 MB/s, so stores interleave
		}
	}()

	refused := 0
	for i := before; i < 200 && refused < 20; i++ {
		fillRow(region.Row(0), i)
		_, err := tier.Store(tier.BlockPath(tierDir, 0, hashOf(i)), region.Row(0))
		switch {
		case err == nil:
			stored = append(stored, i)
		case errors.Is(err, syscall.ENOSPC):
			refused++
		default:
			t.Fatalf("store %d into a filling filesystem: %v, want success or ENOSPC", i, err)
		}
	}
	stop.Store(true)
	wg.Wait()
	if refused == 0 {
		t.Fatalf("%s never filled: %d stores succeeded, the filler hit ENOSPC %d times", kind, len(stored), fillerFull.Load())
	}
	if tmps := findTmps(t, store); len(tmps) != 0 {
		t.Fatalf("tmp files left after refused stores: %v", tmps)
	}
	present := 0
	for _, i := range stored {
		path := tier.BlockPath(tierDir, 0, hashOf(i))
		if !tier.Exists(path) {
			if i < before {
				t.Fatalf("protected block %d was lost while the filesystem filled", i)
			}
			continue
		}
		present++
		copy(region.Row(1), bytes.Repeat([]byte{0xAA}, rowBytes))
		if err := tier.LoadIgnoringClose(path, region.Row(1)); err != nil {
			t.Fatalf("stored block %d answers present but fails to load: %v", i, err)
		}
		if !bytes.Equal(region.Row(1), expectedRow(i)) {
			t.Fatalf("block %d loaded with wrong bytes after the filesystem filled", i)
		}
	}
	st := d.Stats()
	if st.Counters.NoSpace+st.Counters.StoreIOErrors == 0 || !hasWarning(st.Warnings, "no_space", "store_io_errors") {
		t.Fatalf("ENOSPC not named: counters %+v, warnings %+v", st.Counters, st.Warnings)
	}
	t.Logf("%s: %d stores succeeded (%d still present, byte-exact), %d refused with ENOSPC; no_space=%d store_io_errors=%d evictions=%d",
		kind, len(stored), present, refused, st.Counters.NoSpace, st.Counters.StoreIOErrors, st.Disk.Evictions)

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	path := storeBlock(t, tier, region.Row(0), 1000)
	if err := tier.LoadIgnoringClose(path, region.Row(1)); err != nil || !bytes.Equal(region.Row(1), expectedRow(1000)) {
		t.Fatalf("after the space came back: load %v, bytes equal %v", err, bytes.Equal(region.Row(1), expectedRow(1000)))
	}
}

// ext4Shutdown is EXT4_IOC_SHUTDOWN (XFS_IOC_GOINGDOWN): from then on the
// filesystem fails every read and write with EIO, as a dead disk does.
const (
	ext4Shutdown           = 0x8004587D
	ext4ShutdownNoLogFlush = 2
)

// TestStoreDiskFails stores blocks on an ext4 loop device, then shuts the
// filesystem down so that every read and write fails with EIO: loads fail
// (EIO) or miss, never with wrong bytes; stores fail; the daemon stays up,
// answers stat and names the fault.
func TestStoreDiskFails(t *testing.T) {
	fsDir, kind := smallFilesystem(t, 16)
	if kind != "ext4" {
		t.Skip("SKIP: needs ext4 on a loop device to fail the disk (EXT4_IOC_SHUTDOWN)")
	}
	store := filepath.Join(fsDir, "store")
	if err := os.Mkdir(store, 0o755); err != nil {
		t.Fatal(err)
	}
	d := mounttest.Start(t, mounttest.Options{Store: store, Args: []string{"--staging-bytes", "0"}})
	tier := openTier(t, d)
	region := newRegion(t, 2)
	const blocks = 8
	for i := range blocks {
		storeBlock(t, tier, region.Row(0), i)
	}

	dirFd, err := unix.Open(fsDir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	err = unix.IoctlSetPointerInt(dirFd, ext4Shutdown, ext4ShutdownNoLogFlush)
	unix.Close(dirFd)
	if err != nil {
		t.Skipf("SKIP: EXT4_IOC_SHUTDOWN: %v", err)
	}

	var failedEIO, missed int
	for i := range blocks {
		path := tier.BlockPath(tierDir, 0, hashOf(i))
		copy(region.Row(1), bytes.Repeat([]byte{0xAA}, rowBytes))
		err := tier.LoadIgnoringClose(path, region.Row(1))
		switch {
		case err == nil:
			if !bytes.Equal(region.Row(1), expectedRow(i)) {
				t.Fatalf("block %d loaded with wrong bytes from a failed disk", i)
			}
		case errors.Is(err, syscall.EIO):
			failedEIO++
		case errors.Is(err, syscall.ENOENT):
			missed++
		default:
			t.Fatalf("load of block %d from a failed disk: %v, want EIO or ENOENT", i, err)
		}
	}
	if failedEIO == 0 {
		t.Fatalf("no load failed with EIO after the disk failed (%d missed)", missed)
	}
	fillRow(region.Row(0), 100)
	if _, err := tier.Store(tier.BlockPath(tierDir, 0, hashOf(100)), region.Row(0)); err == nil {
		t.Fatal("a store succeeded on a failed disk")
	}
	st := d.Stats()
	if !d.Running() || st.Counters.StoreIOErrors == 0 || !hasWarning(st.Warnings, "store_io_errors") {
		t.Fatalf("after the disk failed: running %v, counters %+v, warnings %+v", d.Running(), st.Counters, st.Warnings)
	}
	t.Logf("disk failed: %d loads EIO, %d missed, store_io_errors=%d", failedEIO, missed, st.Counters.StoreIOErrors)
}

func hasWarning(ws []ctlabi.Warning, codes ...string) bool {
	for _, w := range ws {
		for _, c := range codes {
			if w.Code == c {
				return true
			}
		}
	}
	return false
}

// findTmps lists the *.tmp files under dir.
func findTmps(t *testing.T, dir string) []string {
	t.Helper()
	var tmps []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, ".tmp") {
			tmps = append(tmps, p)
		}
		return err
	})
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	return tmps
}

// TestStoreShortWrites runs the daemon with a file size limit of half a row
// (RLIMIT_FSIZE, `prlimit --fsize`): every block write lands its first half
// in a short write and then fails with EFBIG, as a write into a filesystem
// that fills mid-row does with ENOSPC. Stores fail and leave nothing behind,
// blocks stored before load byte-exact, and stat names the fault.
func TestStoreShortWrites(t *testing.T) {
	prlimit, err := exec.LookPath("prlimit")
	if err != nil {
		t.Skip("SKIP: prlimit is not installed (util-linux); make deps installs it")
	}
	store := t.TempDir()
	region := newRegion(t, 2)
	d := mounttest.Start(t, mounttest.Options{Store: store})
	tier := openTier(t, d)
	const before = 4
	for i := range before {
		storeBlock(t, tier, region.Row(0), i)
	}
	d.Stop()

	d = mounttest.Start(t, mounttest.Options{Store: store, Wrapper: []string{prlimit, "--fsize=" + strconv.Itoa(rowBytes/2), "--"}})
	tier = openTier(t, d)
	for i := before; i < before+4; i++ {
		fillRow(region.Row(0), i)
		path := tier.BlockPath(tierDir, 0, hashOf(i))
		if _, err := tier.Store(path, region.Row(0)); !errors.Is(err, syscall.EFBIG) {
			t.Fatalf("store %d past the file size limit: %v, want EFBIG", i, err)
		}
		if tier.Exists(path) {
			t.Fatalf("block %d answers present after its write failed", i)
		}
	}
	if tmps := findTmps(t, store); len(tmps) != 0 {
		t.Fatalf("tmp files left after short writes: %v", tmps)
	}
	for i := range before {
		copy(region.Row(1), bytes.Repeat([]byte{0xAA}, rowBytes))
		if err := tier.LoadIgnoringClose(tier.BlockPath(tierDir, 0, hashOf(i)), region.Row(1)); err != nil || !bytes.Equal(region.Row(1), expectedRow(i)) {
			t.Fatalf("block %d stored before: load %v, bytes equal %v", i, err, bytes.Equal(region.Row(1), expectedRow(i)))
		}
	}
	st := d.Stats()
	if st.Counters.StoreIOErrors == 0 || !hasWarning(st.Warnings, "store_io_errors") || st.Disk.Blocks != before {
		t.Fatalf("after short writes: counters %+v, warnings %+v, %d blocks", st.Counters, st.Warnings, st.Disk.Blocks)
	}
	if !strings.Contains(d.Log(), "store write failed after") {
		t.Fatal("the short write was not logged")
	}
}

// TestEngineWritePastTheLargestFileIsNoDiskFault: the engine's uid writes a
// block tmp at an offset past the largest file the store filesystem holds
// (ext4's is at most 256 TiB; FUSE passes offsets up to 8 EiB), which the
// store filesystem refuses with EFBIG. That is the engine's request, not a
// failing disk: stat counts it in rejected_writes, and store_io_errors (and
// its "check df, dmesg and smartctl" warning) stays clear.
func TestEngineWritePastTheLargestFileIsNoDiskFault(t *testing.T) {
	store, kind := smallFilesystem(t, 64)
	if kind != "ext4" {
		t.Skip("SKIP: no loop-device ext4 here, and tmpfs holds files as large as FUSE passes")
	}
	d := mounttest.Start(t, mounttest.Options{Store: store})
	tier := openTier(t, d)
	region := newRegion(t, 1)
	path := tier.BlockPath(tierDir, 0, hashOf(1))
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := path + "_17.tmp"
	fd, err := unix.Open(tmp, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	fillRow(region.Row(0), 1)
	const writes = 3
	for i := range writes {
		if _, err := unix.Pwrite(fd, region.Row(0)[:4096], 1<<50+int64(i)<<20); !errors.Is(err, syscall.EFBIG) {
			t.Fatalf("write at 1 PiB: %v, want EFBIG", err)
		}
	}
	unix.Close(fd)
	if err := os.Remove(tmp); err != nil {
		t.Fatal(err)
	}
	storeBlock(t, tier, region.Row(0), 2) // the store goes on
	st := d.Stats()
	if st.Counters.StoreIOErrors != 0 || hasWarning(st.Warnings, "store_io_errors") || st.Counters.RejectedWrites != writes {
		t.Fatalf("after %d writes past the largest file: store_io_errors %d, rejected_writes %d, warnings %+v",
			writes, st.Counters.StoreIOErrors, st.Counters.RejectedWrites, st.Warnings)
	}
	if !strings.Contains(d.Log(), "past the largest file the store filesystem holds") {
		t.Error("the log does not say why the write was refused")
	}
}
