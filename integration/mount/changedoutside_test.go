package mount_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/integration/mounttest"
	"github.com/kvtierfs/kvtierfs/internal/testsys"
)

// TestDiskRotIsToldFromAChangeOutside: the engine's uid owns the store tree
// and can rewrite a block there, which is no disk fault. A block written in
// the store tree fails its load with EIO and counts as changed outside the
// daemon, with its own warning and no disk warning; on an ext4 store on a
// loop device, a block whose bytes change under the filesystem (in the
// device's image, as a failing disk changes them) fails its load alike and
// counts as a checksum failure, with the disk warning, although the daemon
// changed its file itself before (a load moved its access time, utimensat
// and an xattr through the mount). Both are removed. Without a loop device
// the store is a tmpfs and the second half is skipped.
func TestDiskRotIsToldFromAChangeOutside(t *testing.T) {
	fsDir, kind := smallFilesystem(t, 64)
	image := filepath.Join(filepath.Dir(fsDir), "fs.img") // smallFilesystem's
	store := filepath.Join(fsDir, "store")
	if err := os.Mkdir(store, 0o755); err != nil {
		t.Fatal(err)
	}
	d := mounttest.Start(t, mounttest.Options{Store: store, Args: []string{"--staging-bytes", "0"}})
	tier := openTier(t, d)
	region := newRegion(t, 2)
	rotten := storeBlock(t, tier, region.Row(0), 1)
	written := storeBlock(t, tier, region.Row(0), 2)
	onStore := func(path string) string { return filepath.Join(store, strings.TrimPrefix(path, d.Mountpoint)) }

	if err := tier.Load(rotten, region.Row(1)); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(rotten, time.Unix(1e9, 0), time.Unix(1e9, 0)); err != nil {
		t.Fatal(err)
	}
	testsys.UntilChangeTimeMoves(t, onStore(rotten), func() { // or there is nothing to tell apart
		if err := unix.Setxattr(rotten, "user.note", []byte("x"), 0); err != nil {
			t.Fatal(err)
		}
	})

	flipByte(t, onStore(written), 12345)
	if err := tier.Load(written, region.Row(1)); !errors.Is(err, syscall.EIO) {
		t.Fatalf("load of a block written in the store tree: %v, want EIO", err)
	}
	st := d.Stats()
	if c := st.Counters; c.BlocksChangedOutside != 1 || c.ChecksumFailures != 0 || !hasWarning(st.Warnings, "changed_outside") || hasWarning(st.Warnings, "checksum_failures") {
		t.Fatalf("after a block written in the store tree: %d changed outside, %d checksum failures, warnings %+v; want 1, 0, changed_outside only",
			c.BlocksChangedOutside, c.ChecksumFailures, st.Warnings)
	}

	if kind != "ext4" {
		t.Skip("SKIP: the rot half needs ext4 on a loop device to change a block's bytes under its filesystem")
	}
	rot(t, fsDir, image, onStore(rotten), expectedRow(1), 12345)
	if err := tier.Load(rotten, region.Row(1)); !errors.Is(err, syscall.EIO) {
		t.Fatalf("load of a block whose bytes changed under its filesystem: %v, want EIO", err)
	}
	st = d.Stats()
	if c := st.Counters; c.BlocksChangedOutside != 1 || c.ChecksumFailures != 1 || !hasWarning(st.Warnings, "checksum_failures") {
		t.Fatalf("after a block's bytes changed under its filesystem: %d changed outside, %d checksum failures, warnings %+v; want 1, 1, checksum_failures",
			c.BlocksChangedOutside, c.ChecksumFailures, st.Warnings)
	}
	for _, path := range []string{rotten, written} {
		if _, err := os.Stat(onStore(path)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is still in the store: %v", path, err)
		}
	}
}

// rot changes the byte at off of a file of the ext4 mounted at fsDir from
// the loop device's image, as a failing disk would: the filesystem is
// synced, the file's bytes (data, whose first KiB is found once in the image)
// changed there, and the file's cached pages dropped, so that a read goes to
// the device. The file's inode is left as it was.
func rot(t *testing.T, fsDir, image, file string, data []byte, off int64) {
	t.Helper()
	fs, err := os.Open(fsDir)
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	if err := unix.Syncfs(int(fs.Fd())); err != nil {
		t.Fatal(err)
	}
	img, err := os.OpenFile(image, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer img.Close()
	raw, err := os.ReadFile(image)
	if err != nil {
		t.Fatal(err)
	}
	at := bytes.Index(raw, data[:1024])
	if at < 0 || bytes.Contains(raw[at+1:], data[:1024]) || !bytes.Equal(raw[at:at+int(off)+1], data[:off+1]) {
		t.Fatalf("the file's first bytes are not found once, contiguous, in the image (at %d)", at)
	}
	if _, err := img.WriteAt([]byte{data[off] ^ 0x40}, int64(at)+off); err != nil {
		t.Fatal(err)
	}
	if err := img.Sync(); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
}
