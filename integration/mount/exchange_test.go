package mount_test

import (
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

// TestRenameExchangeKeepsBlocksInPlace: a directory holding blocks cannot
// be renamed, and neither can it be exchanged (renameat2 RENAME_EXCHANGE)
// with another one, which moves it all the same. Main checked only the
// source: exchanging an empty directory with the tier's moved the tier's
// blocks to the other name behind the store's index (their loads then
// failed, their bytes on disk no longer counted). A block tmp file cannot
// be exchanged either; two other files can.
func TestRenameExchangeKeepsBlocksInPlace(t *testing.T) {
	region := newRegion(t, 1)
	d := mounttest.Start(t, mounttest.Options{ShmGlob: region.Path})
	tier := openTier(t, d)
	blockPath := storeBlock(t, tier, region.Row(0), 1)
	if err := os.Mkdir(d.Path("empty"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Renameat2(unix.AT_FDCWD, d.Path("empty"), unix.AT_FDCWD, d.Path(tierDir), unix.RENAME_EXCHANGE); !errors.Is(err, unix.EPERM) {
		t.Errorf("exchanging an empty directory with the tier's: %v, want EPERM", err)
	}
	if err := tier.LoadIgnoringClose(blockPath, region.Row(0)); err != nil {
		t.Errorf("loading the block after the exchange was tried: %v", err)
	}
	tmp := blockPath + "_7.tmp"
	if err := os.WriteFile(tmp, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(d.Path("a"), []byte("a"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(d.Path("b"), []byte("b"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := unix.Renameat2(unix.AT_FDCWD, d.Path("a"), unix.AT_FDCWD, tmp, unix.RENAME_EXCHANGE); !errors.Is(err, unix.EPERM) {
		t.Errorf("exchanging another file with a block tmp file: %v, want EPERM", err)
	}
	if err := unix.Renameat2(unix.AT_FDCWD, d.Path("a"), unix.AT_FDCWD, d.Path("b"), unix.RENAME_EXCHANGE); err != nil {
		t.Errorf("exchanging two other files: %v", err)
	}
	if got, err := os.ReadFile(d.Path("a")); err != nil || string(got) != "b" {
		t.Errorf("after the exchange a holds %q (%v), want b's", got, err)
	}
}
