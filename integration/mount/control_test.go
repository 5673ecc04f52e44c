package mount_test

import (
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

// TestControlFilesCannotBeRemoved tries, as root, every way of taking the
// control files away through the mount: each is refused with EPERM, and
// `kvtierfs stat` still finds the mount afterwards.
func TestControlFilesCannotBeRemoved(t *testing.T) {
	d := mounttest.Start(t, mounttest.Options{})
	control := d.Path(ctlabi.Dir)
	stats := d.Path(ctlabi.Dir, ctlabi.StatsFile)
	match := d.Path(ctlabi.Dir, ctlabi.MatchFile)
	other := d.Path("other")
	if err := os.WriteFile(other, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	attempts := []struct {
		what string
		do   func() error
	}{
		{"unlink stats.json", func() error { return os.Remove(stats) }},
		{"unlink match", func() error { return os.Remove(match) }},
		{"rename stats.json within .kvtier", func() error { return os.Rename(stats, d.Path(ctlabi.Dir, "old.json")) }},
		{"rename stats.json out of .kvtier", func() error { return os.Rename(stats, d.Path("stats.json")) }},
		{"rename a file over stats.json", func() error { return os.Rename(other, stats) }},
		{"rename match over stats.json", func() error { return os.Rename(match, stats) }},
		{"create a file in .kvtier", func() error {
			f, err := os.OpenFile(d.Path(ctlabi.Dir, "new"), os.O_CREATE|os.O_WRONLY, 0o644)
			if err == nil {
				f.Close()
			}
			return err
		}},
		{"rmdir .kvtier", func() error { return syscall.Rmdir(control) }},
		{"rename .kvtier", func() error { return os.Rename(control, d.Path("moved")) }},
		{"rename a directory over .kvtier", func() error {
			if err := os.Mkdir(d.Path("dir"), 0o755); err != nil {
				return err
			}
			return os.Rename(d.Path("dir"), control)
		}},
	}
	for _, a := range attempts {
		err := a.do()
		// The kernel itself may refuse replacing a directory (EEXIST, ENOTEMPTY).
		if !errors.Is(err, syscall.EPERM) && !(a.what == "rename a directory over .kvtier" && err != nil) {
			t.Errorf("%s: %v, want EPERM", a.what, err)
		}
	}
	for _, p := range []string{stats, match} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("after the attempts: %v", err)
		}
	}
	if out, err := mounttest.Run("stat", d.Mountpoint); err != nil || strings.Contains(out, "not a kvtierfs mount") {
		t.Fatalf("kvtierfs stat after the attempts: %v\n%s", err, out)
	}
	d.Stats()
}
