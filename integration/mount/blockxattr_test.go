package mount_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/integration/engineio"
	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

// TestBlockXattrsNeverFollowSwappedDirectories: the engine's uid owns the
// store tree and can swap a tier directory for a link to a directory of its
// choice. An xattr set through the mount on a block (or read from it) then
// acts on the store's own file or fails; the root daemon never sets it on the
// file the link leads to.
func TestBlockXattrsNeverFollowSwappedDirectories(t *testing.T) {
	d := mounttest.Start(t, mounttest.Options{})
	tier := openTier(t, d)
	row := alignedRow(t, rowBytes)
	fillRow(row, 1)
	path := tier.BlockPath(tierDir, 0, hashOf(1))
	if _, err := tier.Store(path, row); err != nil {
		t.Fatal(err)
	}
	rel := strings.TrimPrefix(path, d.Mountpoint+"/")

	// A directory elsewhere, laid out like the tier, holding a file where
	// the block would be.
	victim := t.TempDir()
	target := filepath.Join(victim, strings.TrimPrefix(rel, tierDir+"/"))
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(target, []byte("not the store's"), 0o644); err != nil {
		t.Fatal(err)
	}
	real := filepath.Join(d.Store, tierDir)
	if err := os.Rename(real, real+".moved"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, real); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		os.Remove(real)
		os.Rename(real+".moved", real)
	})

	unix.Setxattr(path, engineio.ChecksumXattr, []byte{1, 2, 3, 4}, 0)
	if _, err := unix.Getxattr(target, engineio.ChecksumXattr, make([]byte, 8)); !errors.Is(err, unix.ENODATA) {
		t.Fatalf("the file behind the swapped directory got the xattr set through the mount (getxattr: %v)", err)
	}
	if err := unix.Setxattr(target, "user.victim", []byte("secret"), 0); err != nil {
		t.Fatal(err)
	}
	if n, err := unix.Getxattr(path, "user.victim", make([]byte, 16)); err == nil {
		t.Fatalf("getxattr through the mount read %d bytes of the file behind the swapped directory", n)
	}
}
