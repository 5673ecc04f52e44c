package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvtierfs/kvtierfs/fusefs"
	"github.com/kvtierfs/kvtierfs/fusefs/mountinfo"
	"github.com/kvtierfs/kvtierfs/tiers/disk"
)

// TestMissingMountpointMadeThroughTrustedLinks: the directories missing of
// a mountpoint's path are made where the daemon's own links lead (absolute
// and relative), and the descriptor returned is of the last one made. A
// link of another user is refused before anything is made behind it.
func TestMissingMountpointMadeThroughTrustedLinks(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "real")
	if err := os.Mkdir(real, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(real, filepath.Join(dir, "abs")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("real", filepath.Join(dir, "rel")); err != nil {
		t.Fatal(err)
	}
	for _, link := range []string{"abs", "rel"} {
		f, _, err := openMountpoint(filepath.Join(dir, link, link+"-a", "mnt"))
		if err != nil {
			t.Fatalf("through the daemon's link %s: %v", link, err)
		}
		reached, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", f.Fd()))
		f.Close()
		if want := filepath.Join(real, link+"-a", "mnt"); err != nil || reached != want {
			t.Errorf("through the daemon's link %s the mountpoint opened is %q (%v), want %s", link, reached, err, want)
		}
	}

	other := filepath.Join(dir, "other")
	if err := os.Symlink(real, other); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(other, 4242, 4242); err != nil {
		t.Fatal(err)
	}
	if f, _, err := openMountpoint(filepath.Join(other, "b", "mnt")); err == nil || !strings.Contains(err.Error(), "a link of uid 4242") {
		if f != nil {
			f.Close()
		}
		t.Errorf("through uid 4242's link: %v; want it refused, naming the link's owner", err)
	}
	if _, err := os.Lstat(filepath.Join(real, "b")); !os.IsNotExist(err) {
		t.Errorf("behind uid 4242's link: %v; want nothing made there", err)
	}
	if f, _, err := openMountpoint(filepath.Join(dir, "abs")); err == nil {
		f.Close()
		t.Error("a mountpoint that is a link was opened")
	}
}

// TestMountpointSwappedAfterTheCheckIsNotMountedOver: a directory above
// the mountpoint is swapped for a link to another directory holding one of
// the mountpoint's name right after the daemon's last check of the path.
// Mounted by path, as main did, the store landed over that other directory
// until it was detached; mounted onto the directory opened, it lands there
// (moved), nowhere else, and is detached. Unswapped, the mount is made and
// unmounted through the directory.
func TestMountpointSwappedAfterTheCheckIsNotMountedOver(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipped: mounting onto the opened directory is a root daemon's")
	}
	dir := t.TempDir()
	above, victims := filepath.Join(dir, "above"), filepath.Join(dir, "victims")
	for _, d := range []string{filepath.Join(above, "mnt"), filepath.Join(victims, "mnt")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	store, err := disk.Open(disk.Config{Dir: t.TempDir(), Capacity: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	source := "kvtierfs:" + store.Root()
	mountsOfStore := func() []string {
		mounts, err := mountinfo.Read("self")
		if err != nil {
			t.Fatal(err)
		}
		var at []string
		for _, m := range mounts {
			if m.Source == source {
				at = append(at, m.Mountpoint)
			}
		}
		return at
	}

	m, err := prepareMountpoint(filepath.Join(above, "mnt"), false)
	if err != nil {
		t.Fatal(err)
	}
	defer m.close()
	mountpointChecked = func() {
		if err := os.Rename(above, above+".old"); err != nil {
			t.Error(err)
		}
		if err := os.Symlink(victims, above); err != nil {
			t.Error(err)
		}
	}
	defer func() { mountpointChecked = nil }()
	fsys, err := m.mount(fusefs.Options{Store: store}, source)
	if err == nil {
		fsys.Unmount()
		t.Fatal("mounted though the mountpoint's path was swapped after the check")
	}
	if want := fmt.Sprintf("landed at [%q]", filepath.Join(above+".old", "mnt")); !strings.Contains(err.Error(), want) {
		t.Errorf("the failed mount says %q; want it to say it %s, the directory opened, moved", err, want)
	}
	if at := mountsOfStore(); len(at) > 0 {
		t.Errorf("the store is still mounted at %v", at)
	}

	mountpointChecked = nil
	if err := os.Remove(above); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(above+".old", above); err != nil {
		t.Fatal(err)
	}
	m2, err := prepareMountpoint(filepath.Join(above, "mnt"), false)
	if err != nil {
		t.Fatal(err)
	}
	defer m2.close()
	fsys, err = m2.mount(fusefs.Options{Store: store}, source)
	if err != nil {
		t.Fatal(err)
	}
	if at := mountsOfStore(); len(at) != 1 || at[0] != filepath.Join(above, "mnt") {
		t.Errorf("mounted at %v, want %s", at, filepath.Join(above, "mnt"))
	}
	if err := fsys.Unmount(); err != nil {
		t.Fatalf("unmounting through the directory: %v", err)
	}
	if at := mountsOfStore(); len(at) > 0 {
		t.Errorf("still mounted at %v after the unmount", at)
	}
}
