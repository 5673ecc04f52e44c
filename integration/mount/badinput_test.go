package mount_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

// TestBadInputIsRefusedClearly feeds the mount malformed names, sizes, offsets
// and renames: each fails with a clear errno and a log line, nothing is
// published, and the daemon keeps serving.
func TestBadInputIsRefusedClearly(t *testing.T) {
	d := mounttest.Start(t, mounttest.Options{})
	tier := openTier(t, d)
	region := newRegion(t, 1)
	good := storeBlock(t, tier, region.Row(0), 1)
	dir := filepath.Dir(good)

	writeTmp := func(name string, data []byte, off int64) error {
		fd, err := unix.Open(filepath.Join(dir, name), unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if len(data) > 0 {
			_, err = unix.Pwrite(fd, data, off)
		}
		return err
	}
	hash := hashOf(50)
	cases := []struct {
		name string
		do   func() error
		want syscall.Errno
		log  string
	}{
		{"non-hex block name", func() error {
			return os.WriteFile(filepath.Join(dir, "not-a-hash.bin"), []byte("x"), 0o644)
		}, syscall.EINVAL, "malformed block name"},
		{"uppercase hex block name", func() error {
			if err := writeTmp(strings.ToUpper(hash)+".bin_1.tmp", region.Row(0), 0); err != nil {
				return err
			}
			return os.Rename(filepath.Join(dir, strings.ToUpper(hash)+".bin_1.tmp"), filepath.Join(dir, strings.ToUpper(hash)+".bin"))
		}, syscall.EINVAL, "malformed block name"},
		{"direct create of a block", func() error {
			return os.WriteFile(filepath.Join(dir, hash+".bin"), region.Row(0), 0o644)
		}, syscall.EPERM, "publish it by renaming"},
		{"zero-length block", func() error {
			if err := writeTmp(hash+".bin_2.tmp", nil, 0); err != nil {
				return err
			}
			return os.Rename(filepath.Join(dir, hash+".bin_2.tmp"), filepath.Join(dir, hash+".bin"))
		}, syscall.EINVAL, "not a positive multiple of the page size"},
		{"odd-size block", func() error {
			if err := writeTmp(hash+".bin_3.tmp", region.Row(0)[:1000], 0); err != nil {
				return err
			}
			return os.Rename(filepath.Join(dir, hash+".bin_3.tmp"), filepath.Join(dir, hash+".bin"))
		}, syscall.EINVAL, "not a positive multiple of the page size"},
		{"wrong row size", func() error {
			if err := writeTmp(hash+".bin_4.tmp", region.Row(0)[:rowBytes/2], 0); err != nil {
				return err
			}
			return os.Rename(filepath.Join(dir, hash+".bin_4.tmp"), filepath.Join(dir, hash+".bin"))
		}, syscall.EINVAL, "differs from the"},
		{"rename of a tmp whose first page was never written", func() error {
			if err := writeTmp(hash+".bin_5.tmp", region.Row(0)[:rowBytes-4096], 4096); err != nil {
				return err
			}
			return os.Rename(filepath.Join(dir, hash+".bin_5.tmp"), filepath.Join(dir, hash+".bin"))
		}, syscall.EINVAL, "never written"},
		{"rename across groups", func() error {
			if err := writeTmp(hash+".bin_6.tmp", region.Row(0), 0); err != nil {
				return err
			}
			other := tier.BlockPath(tierDir, 1, hash)
			os.MkdirAll(filepath.Dir(other), 0o755)
			return os.Rename(filepath.Join(dir, hash+".bin_6.tmp"), other)
		}, syscall.EXDEV, "in its own directory"},
		{"rename a published block away", func() error {
			return os.Rename(good, filepath.Join(dir, "moved"))
		}, syscall.EPERM, "refused rename of a published block"},
		{"write access to a published block", func() error {
			f, err := os.OpenFile(good, os.O_WRONLY, 0)
			if err == nil {
				f.Close()
			}
			return err
		}, syscall.EPERM, "refused write access"},
		{"truncate a published block", func() error {
			return os.Truncate(good, 0)
		}, syscall.EPERM, "refused truncate"},
		{"create over the control directory", func() error {
			return os.Mkdir(d.Path(".kvtier"), 0o755)
		}, syscall.EEXIST, ""},
	}
	for _, c := range cases {
		err := c.do()
		if !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
			continue
		}
		if c.log != "" && !d.WaitLog(c.log) {
			t.Errorf("%s: no log line containing %q", c.name, c.log)
		}
	}
	if tier.Exists(filepath.Join(dir, hash+".bin")) {
		t.Fatal("a refused block became visible")
	}
	if st := d.Stats(); st.Disk.Blocks != 1 || st.Counters.Writes != 1 {
		t.Fatalf("after bad input: %d blocks, %d writes; want the one good block", st.Disk.Blocks, st.Counters.Writes)
	}
	if !d.Running() {
		t.Fatal("the daemon died on bad input")
	}
	if err := tier.Load(good, region.Row(0)); err != nil {
		t.Fatalf("the good block after bad input: %v", err)
	}
}

// TestMountRefusesBadSetups checks the command line and environment errors:
// each exits non-zero with a message that names the problem.
func TestMountRefusesBadSetups(t *testing.T) {
	running := mounttest.Start(t, mounttest.Options{})
	readOnly := readOnlyDir(t)
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"missing store", []string{"--store", "/nonexistent/kvtier-store"}, "does not exist"},
		{"read-only store", []string{"--store", readOnly}, "not writable"},
		{"store in use", []string{"--store", running.Store}, "in use by another kvtierfs daemon"},
		{"busy mountpoint", []string{"--mountpoint-from", running.Mountpoint}, "is busy"},
		{"unknown flag", []string{"--bogus"}, "unknown flag: --bogus"},
		{"malformed capacity", []string{"--capacity", "12XB"}, "--capacity \"12XB\""},
		{"bad lookup-protect", []string{"--lookup-protect", "-5s"}, "--lookup-protect"},
		{"bad shm glob", []string{"--shm-glob", "/dev/shm/[x"}, "--shm-glob"},
		{"store contains the mountpoint", []string{"--store-of-mountpoint"}, "must not contain each other"},
		{"bad max request", []string{"--max-request", "1KiB"}, "--max-request"},
	}
	for _, c := range cases {
		mnt := filepath.Join(t.TempDir(), "mnt")
		args := c.args
		if args[0] == "--mountpoint-from" {
			mnt, args = args[1], nil
		}
		store := t.TempDir()
		if len(args) == 1 && args[0] == "--store-of-mountpoint" {
			store, args = filepath.Dir(mnt), nil
		}
		full := append([]string{"mount", mnt, "--store", store, "--metrics-addr", ""}, args...)
		out, err := mounttest.Run(full...)
		if err == nil {
			t.Errorf("%s: mount succeeded, want an error", c.name)
			unix.Unmount(mnt, unix.MNT_DETACH)
			continue
		}
		if !strings.Contains(out, c.want) {
			t.Errorf("%s: output %q does not contain %q", c.name, out, c.want)
		}
	}
	if !running.Running() {
		t.Fatal("the running daemon was disturbed")
	}
}

// readOnlyDir returns a directory that is a read-only bind mount, unmounted at cleanup.
func readOnlyDir(t *testing.T) string {
	t.Helper()
	src, dst := t.TempDir(), t.TempDir()
	if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind mount: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dst, unix.MNT_DETACH) })
	if err := unix.Mount("", dst, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
		t.Fatalf("read-only remount: %v", err)
	}
	return dst
}

// TestCommands checks stat and umount against a mount and against a plain directory.
func TestCommands(t *testing.T) {
	d := mounttest.Start(t, mounttest.Options{})
	tier := openTier(t, d)
	region := newRegion(t, 1)
	storeBlock(t, tier, region.Row(0), 1)

	out, err := mounttest.Run("stat", d.Mountpoint)
	if err != nil || !strings.Contains(out, "1 block,") || !strings.Contains(out, "warnings: none") {
		t.Fatalf("stat: %v\n%s", err, out)
	}
	out, err = mounttest.Run("stat", "--json", d.Mountpoint)
	for _, key := range []string{`"logical_bytes"`, `"physical_bytes"`, `"capacity_bytes"`, `"free_bytes"`, `"evictions"`,
		`"groups"`, `"regions"`, `"lookup_hits"`, `"read_bytes"`, `"write_bytes"`, `"checksum_failures"`, `"warnings"`} {
		if err != nil || !strings.Contains(out, key) {
			t.Fatalf("stat --json lacks %s: %v\n%s", key, err, out)
		}
	}
	plain := t.TempDir()
	if out, err := mounttest.Run("stat", plain); err == nil || !strings.Contains(out, "not a kvtierfs mount") {
		t.Fatalf("stat of a plain directory: %v %s", err, out)
	}
	if out, err := mounttest.Run("umount", plain); err == nil || !strings.Contains(out, "is not mounted") {
		t.Fatalf("umount of a plain directory: %v %s", err, out)
	}
	if out, err := mounttest.Run("frobnicate"); err == nil || !strings.Contains(out, "unknown command") {
		t.Fatalf("unknown command: %v %s", err, out)
	}
	if out, err := mounttest.Run("umount", d.Mountpoint); err != nil {
		t.Fatalf("umount: %v %s", err, out)
	}
	if err := d.Stop(); err != nil {
		t.Fatalf("daemon after umount: %v, want a clean exit", err)
	}
}
