package mount_test

import (
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/hanwen/go-fuse/v2/posixtest"

	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

// notPOSIX names the cases of go-fuse's suite that ask for what POSIX
// rules out, and why.
var notPOSIX = map[string]string{
	// Record locks belong to the process (fcntl(2)): its second lock
	// replaces its first, through another descriptor too. The case wants
	// EAGAIN, which go-fuse's loopback gave by taking each open's lock as
	// an OFD lock of its own descriptor; locks are the kernel's here
	// (TestLockWaitersHoldNoDaemonThread), and go-fuse skips the case in
	// its own run of the suite.
	"FcntlFlockLocksFile": "a process's second record lock conflicts with its first",
}

// TestPosix runs go-fuse's POSIX conformance suite against the mount, every
// case but notPOSIX's, each in a fresh directory of one daemon.
func TestPosix(t *testing.T) {
	d := mounttest.Start(t, mounttest.Options{})
	names := make([]string, 0, len(posixtest.All))
	for name := range posixtest.All {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			if why, ok := notPOSIX[name]; ok {
				t.Skip("not POSIX: " + why)
			}
			dir := filepath.Join(d.Mountpoint, "posix-"+name)
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			posixtest.All[name](t, dir)
		})
	}
}
