package mount_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/integration/engineio"
	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

// TestWriterUnderAKeptMappingFailsTheLoadThroughTheMount loads a block of a
// tmpfs store through the mount, so that its proven mapping is kept, then
// reads it again piece by piece while the engine's uid opens its store file
// for writing and changes it: the open waits for the lease, the read after
// the break fails with EIO (no reply after it carries the mapped pages), the
// writer goes on once the load is closed, and the next load, which must
// check the file again, fails with EIO and drops the block.
func TestWriterUnderAKeptMappingFailsTheLoadThroughTheMount(t *testing.T) {
	dir, err := os.MkdirTemp("/dev/shm", "kvtier-kept-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	d := mounttest.Start(t, mounttest.Options{Store: dir})
	tier := openTier(t, d)
	const size = 8 << 20
	row := alignedRow(t, size)
	engineio.FillPattern(row, 7)
	want := bytes.Clone(row)
	path := tier.BlockPath(tierDir, 0, hashOf(7))
	if _, err := tier.Store(path, row); err != nil {
		t.Fatal(err)
	}
	buf := alignedRow(t, size)
	if err := preadAt(path, unix.O_DIRECT, buf, 0, want); err != nil {
		t.Fatalf("first load: %v", err)
	}
	remapped := d.Stats().Counters.LoadsRemapped

	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	piece := buf[:1<<20]
	if n, err := unix.Pread(fd, piece, 0); err != nil || n != len(piece) || !bytes.Equal(piece, want[:n]) {
		unix.Close(fd)
		t.Fatalf("first MiB of the second load: %d bytes, %v", n, err)
	}
	if got := d.Stats().Counters.LoadsRemapped; got != remapped+1 {
		unix.Close(fd)
		t.Fatalf("loads remapped %d, want %d: the second load did not find the block kept mapped", got, remapped+1)
	}
	onStore := filepath.Join(d.Store, strings.TrimPrefix(path, d.Mountpoint))
	opened := make(chan error, 1)
	go func() {
		w, err := os.OpenFile(onStore, os.O_WRONLY, 0)
		if err == nil {
			_, err = w.WriteAt([]byte("changed"), 0)
			w.Close()
		}
		opened <- err
	}()
	// The writer's open breaks the lease; the next read fails from then on.
	var readErr error
	for off := int64(len(piece)); ; off = (off + int64(len(piece))) % size {
		if _, readErr = unix.Pread(fd, piece, off); readErr != nil {
			break
		}
		select {
		case err := <-opened:
			unix.Close(fd)
			t.Fatalf("the writer's open returned (%v) while the load still holds the file", err)
		default:
		}
		time.Sleep(time.Millisecond)
	}
	unix.Close(fd)
	if !errors.Is(readErr, syscall.EIO) {
		t.Fatalf("read while a writer waits for the file: %v, want EIO", readErr)
	}
	if err := <-opened; err != nil {
		t.Fatalf("the writer after the load's close: %v", err)
	}
	if err := preadAt(path, unix.O_DIRECT, buf, 0, want); !errors.Is(err, syscall.EIO) {
		t.Fatalf("load of the changed block: %v, want EIO", err)
	}
	if _, err := os.Stat(onStore); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the changed block is still in the store (%v)", err)
	}
	if got := d.Stats().Counters.LoadsRemapped; got != remapped+1 {
		t.Fatalf("loads remapped %d, want %d: the changed block was served from its kept mapping", got, remapped+1)
	}
}
