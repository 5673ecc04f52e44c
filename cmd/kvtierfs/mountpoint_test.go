package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
		f, err := openMountpoint(filepath.Join(dir, link, link+"-a", "mnt"))
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
	if f, err := openMountpoint(filepath.Join(other, "b", "mnt")); err == nil || !strings.Contains(err.Error(), "a link of uid 4242") {
		if f != nil {
			f.Close()
		}
		t.Errorf("through uid 4242's link: %v; want it refused, naming the link's owner", err)
	}
	if _, err := os.Lstat(filepath.Join(real, "b")); !os.IsNotExist(err) {
		t.Errorf("behind uid 4242's link: %v; want nothing made there", err)
	}
	if f, err := openMountpoint(filepath.Join(dir, "abs")); err == nil {
		f.Close()
		t.Error("a mountpoint that is a link was opened")
	}
}
