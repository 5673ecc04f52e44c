package mount_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

// copyWithXattrs copies a store file and every xattr it has, as `cp -a`
// does.
func copyWithXattrs(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, data, 0o600); err != nil {
		t.Fatal(err)
	}
	names := make([]byte, 4096)
	n, err := unix.Listxattr(from, names)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range strings.Split(strings.TrimRight(string(names[:n]), "\x00"), "\x00") {
		value := make([]byte, 8192)
		m, err := unix.Getxattr(from, name, value)
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.Setxattr(to, name, value[:m], 0); err != nil {
			t.Fatal(err)
		}
	}
}

// TestBlockCopiedBetweenRanksRefused: a block copied in the store with its
// xattrs from rank 1's tier into rank 0's is not served to rank 0 after a
// restart (its record is bound to the tier it was stored in), while rank 1
// still loads its own.
func TestBlockCopiedBetweenRanksRefused(t *testing.T) {
	const rank0, rank1 = "TestModel_0123456789ab_r0", "TestModel_0123456789ab_r1"
	store := t.TempDir()
	d := mounttest.Start(t, mounttest.Options{Store: store})
	tier := openTier(t, d)
	row := alignedRow(t, rowBytes)
	fillRow(row, 1)
	own := tier.BlockPath(rank1, 0, hashOf(1))
	if _, err := tier.Store(own, row); err != nil {
		t.Fatal(err)
	}
	if err := d.Stop(); err != nil {
		t.Fatal(err)
	}
	copyWithXattrs(t, filepath.Join(store, strings.TrimPrefix(own, d.Mountpoint)),
		filepath.Join(store, rank0, strings.TrimPrefix(own, filepath.Join(d.Mountpoint, rank1))))

	d = mounttest.Start(t, mounttest.Options{Store: store})
	tier = openTier(t, d)
	if copied := tier.BlockPath(rank0, 0, hashOf(1)); tier.Exists(copied) {
		t.Fatal("rank 1's block copied into rank 0's tier is served to rank 0")
	}
	if err := tier.LoadIgnoringClose(tier.BlockPath(rank1, 0, hashOf(1)), row); err != nil || !bytes.Equal(row, expectedRow(1)) {
		t.Fatalf("rank 1's own block: %v", err)
	}
	if c := d.Stats().Counters; c.UnprovenBlocks != 1 {
		t.Errorf("unproven blocks %d, want 1 (the copy)", c.UnprovenBlocks)
	}
}
