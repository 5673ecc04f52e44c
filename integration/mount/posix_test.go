package mount_test

import (
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/hanwen/go-fuse/v2/posixtest"

	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

// TestPosix runs go-fuse's POSIX conformance suite against the mount, every
// case, none skipped, each in a fresh directory of one daemon.
func TestPosix(t *testing.T) {
	d := mounttest.Start(t, mounttest.Options{})
	names := make([]string, 0, len(posixtest.All))
	for name := range posixtest.All {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(d.Mountpoint, "posix-"+name)
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			posixtest.All[name](t, dir)
		})
	}
}
