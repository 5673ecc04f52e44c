package mount_test

import (
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

// fsIocGetVersion is FS_IOC_GETVERSION of linux/fs.h, _IOR('v', 1, long)
// on a 64-bit machine: it answers the inode's generation, in a long.
const fsIocGetVersion = 0x80087601

// TestIoctlsNeverReachTheStore: the kernel forwards ioctls it does not
// handle itself to the daemon, which must answer ENOTTY for every file and
// directory. Main's directory handles (go-fuse's loopback listing) ran them
// on the store directory as root: FS_IOC_GETVERSION through the mount
// answered the store directory's generation, and an ioctl that needs the
// daemon's capabilities (FITRIM, EXT4_IOC_SHUTDOWN on the store
// filesystem) would have run as well.
func TestIoctlsNeverReachTheStore(t *testing.T) {
	d := mounttest.Start(t, mounttest.Options{})
	if err := os.Mkdir(d.Path("dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(d.Path("config.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"", "dir", "config.json"} {
		fd, err := unix.Open(d.Path(name), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		generation, err := unix.IoctlGetInt(fd, fsIocGetVersion)
		unix.Close(fd)
		if !errors.Is(err, unix.ENOTTY) {
			t.Errorf("FS_IOC_GETVERSION on %q through the mount: generation %d, %v; want ENOTTY", name, generation, err)
		}
	}
}
