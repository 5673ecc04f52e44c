package disk

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestStoreRootLinkIsNotGivenAway: the engine's uid owns the directory
// holding the store (its data disk, say /nvme with --store /nvme/kvtier) and
// replaces the store by a link to a directory of root's (`mv /nvme/kvtier
// /nvme/kvtier.o && ln -s /etc /nvme/kvtier`). At its next start the root
// daemon opened the link's target, gave it to the engine's uid with mode
// 0700, and the engine then renamed and replaced root's files in it. The
// target of a link must keep its owner and mode.
func TestStoreRootLinkIsNotGivenAway(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("giving files to another uid needs root")
	}
	base := t.TempDir()
	rootsDir := filepath.Join(base, "etc")
	if err := os.Mkdir(rootsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootsDir, "passwd"), []byte("root:x:0:0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	engineDisk := filepath.Join(base, "nvme")
	if err := os.Mkdir(engineDisk, 0o755); err != nil {
		t.Fatal(err)
	}
	store := filepath.Join(engineDisk, "kvtier")
	if err := os.Symlink(rootsDir, store); err != nil {
		t.Fatal(err)
	}
	owner := Owner{UID: 4242, GID: 4343}
	s, err := Open(Config{Dir: store, Owner: &owner})
	if err == nil {
		defer s.Close()
	}
	var st syscall.Stat_t
	if err := syscall.Stat(rootsDir, &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != 0 || st.Mode&0o777 != 0o755 {
		t.Fatalf("a store path that is a link to root's directory: Open %v, and the directory is now uid %d, mode %o (was root, 755)", err, st.Uid, st.Mode&0o777)
	}
}
