package fusefs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConnectionOfAResolvedPathFollowsNoLink: the kernel's name of the
// mountpoint is looked up in the mount table as it is, while a path as given
// has its links resolved first. An ancestor swapped for a link after the
// mount (to another FUSE mount, say) must not redirect the first.
func TestConnectionOfAResolvedPathFollowsNoLink(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "target")
	if err := os.Mkdir(target, 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	at := filepath.Join(link, "mnt")
	if _, err := connectionOf(at, true); err == nil || !strings.Contains(err.Error(), at) {
		t.Errorf("resolved path: %v, want no mount at %s", err, at)
	}
	if _, err := connectionOf(at, false); err == nil || !strings.Contains(err.Error(), filepath.Join(target, "mnt")) {
		t.Errorf("path as given: %v, want no mount at %s", err, filepath.Join(target, "mnt"))
	}
}
