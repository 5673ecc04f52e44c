package mount_test

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// A passthrough tmp mapped MAP_SHARED through the mount can still be written
// after its descriptor closed (the kernel sends the release at the close, the
// mapping holds the store file): its rename is refused while the mapping
// lives, so the block published is never changed behind its digest, and
// succeeds once it is gone.
func TestPassthroughSharedMappingRefusesRename(t *testing.T) {
	m := newPassthroughMount(t, 4)
	row := m.region.Row(1)
	fillRow(row, 1)
	block, tmp := m.paths(1)
	if err := os.MkdirAll(filepath.Dir(tmp), 0o755); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(tmp, unix.O_CREAT|unix.O_EXCL|unix.O_RDWR|unix.O_CLOEXEC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	pwrite(t, fd, row, 0)
	mapping, err := unix.Mmap(fd, 0, rowBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.publish(t, fd, 1); !errors.Is(err, syscall.EBUSY) {
		unix.Munmap(mapping)
		t.Fatalf("rename of a tmp still mapped for writing: %v, want EBUSY", err)
	}
	if m.tier.Exists(block) {
		t.Fatal("the block was published while a mapping could still write to it")
	}
	if err := unix.Munmap(mapping); err != nil {
		t.Fatal(err)
	}
	if err := m.publish(t, -1, 1); err != nil {
		t.Fatalf("rename once the mapping is gone: %v", err)
	}
	m.loadsBack(t, 1, m.region.Row(3), expectedRow(1))
}
