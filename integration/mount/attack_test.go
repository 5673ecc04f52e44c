package mount_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/integration/engineio"
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

// Loads racing stores that replace the same block with other bytes, and
// unlinks of it: every load that succeeds returns one of the rows stored
// whole, and a load that fails does so with ENOENT (the block went away
// between its lookup and its open), never EIO (no stored block is taken
// for a corrupt one).
func TestLoadsRacingRepublishAndRemove(t *testing.T) {
	m := newPassthroughMount(t, 8, "--capacity", "64MiB")
	block, _ := m.paths(1)
	versions := [][]byte{expectedRow(11), expectedRow(12)}
	copy(m.region.Row(1), versions[0])
	copy(m.region.Row(2), versions[1])
	if err := os.MkdirAll(filepath.Dir(block), 0o755); err != nil {
		t.Fatal(err)
	}
	stop, stopped := stopSignal()
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Go(func() {
			for n := 0; !stopped(); n++ {
				tmp := fmt.Sprintf("%s_%d_%d.tmp", block, w, n)
				fd, err := unix.Open(tmp, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0o644)
				if err != nil {
					t.Errorf("create: %v", err)
					return
				}
				_, err = unix.Write(fd, m.region.Row(1+n%2))
				unix.Close(fd)
				if err == nil {
					err = os.Rename(tmp, block)
				}
				if err != nil {
					os.Remove(tmp)
					t.Errorf("store: %v", err)
					return
				}
				if n%5 == 4 {
					os.Remove(block)
				}
			}
		})
	}
	var loads, absent atomic.Int64
	for r := range 4 {
		wg.Go(func() {
			scratch := m.region.Row(3 + r)
			for !stopped() {
				switch err := loadRacing(t, m, block, scratch, versions); {
				case errors.Is(err, syscall.ENOENT):
					absent.Add(1)
				case err != nil:
					t.Errorf("load: %v", err)
				default:
					loads.Add(1)
				}
			}
		})
	}
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
	c := m.d.Stats().Counters
	t.Logf("%d loads, %d absent, %d checksum failures, %d stores from a row", loads.Load(), absent.Load(), c.ChecksumFailures, c.StoresFromRow)
	if c.ChecksumFailures != 0 {
		t.Errorf("%d checksum failures", c.ChecksumFailures)
	}
	m.checkNothingLeftCounted(t, 1)
}

// checkNothingLeftCounted removes block i and every tmp beside it through
// the mount, then checks that what the store counts against its capacity is
// the blocks left (no reservation leaked by the stores raced).
func (m *passthroughMount) checkNothingLeftCounted(t *testing.T, i int) {
	t.Helper()
	block, _ := m.paths(i)
	os.Remove(block)
	tmps, _ := filepath.Glob(block + "_*.tmp")
	for _, tmp := range tmps {
		if err := os.Remove(tmp); err != nil {
			t.Error(err)
		}
	}
	st := m.d.Stats().Disk
	if used := st.CapacityBytes - st.FreeBytes; used != st.PhysicalBytes || st.InFlightTmp != 0 {
		t.Errorf("%d bytes counted, %d tmp files, with %d bytes of blocks left and no tmp file", used, st.InFlightTmp, st.PhysicalBytes)
	}
}

// Two writers storing the same block through the same tmp name (O_CREAT|
// O_TRUNC without O_EXCL, as no engine does) while the tmp name is looked up
// (stat) and the block loaded. A lookup that revalidates the kernel's entry
// of the tmp name runs beside the publish's rename: it must not leave the
// published block's node filed under the tmp name, where the block's next
// OPEN would open whatever the other writer is creating there (DESIGN.md
// "Lookups and the kernel's caches"). A load either fails or returns a whole
// row some writer stored, never a short read or other bytes with success;
// afterwards the block's name is a whole row and nothing is left counted.
func TestLoadsRacingWritersSharingATmpName(t *testing.T) {
	m := newPassthroughMount(t, 8, "--capacity", "64MiB")
	block, tmp := m.paths(1)
	versions := [][]byte{expectedRow(21), expectedRow(22)}
	copy(m.region.Row(1), versions[0])
	copy(m.region.Row(2), versions[1])
	if err := os.MkdirAll(filepath.Dir(block), 0o755); err != nil {
		t.Fatal(err)
	}
	stop, stopped := stopSignal()
	var wg sync.WaitGroup
	var stores, refused atomic.Int64
	for w := range 2 {
		wg.Go(func() {
			for !stopped() {
				fd, err := unix.Open(tmp, unix.O_CREAT|unix.O_TRUNC|unix.O_WRONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0o644)
				if err != nil {
					refused.Add(1)
					continue
				}
				_, err = unix.Write(fd, m.region.Row(1+w))
				unix.Close(fd)
				if err == nil {
					err = os.Rename(tmp, block)
				}
				if err != nil {
					refused.Add(1)
					continue
				}
				stores.Add(1)
			}
		})
	}
	for range 2 {
		wg.Go(func() {
			var st unix.Stat_t
			for !stopped() {
				unix.Stat(tmp, &st)
			}
		})
	}
	var loads, failed atomic.Int64
	wg.Go(func() {
		scratch := m.region.Row(3)
		for !stopped() {
			switch err := loadRacing(t, m, block, scratch, versions); {
			case errors.Is(err, engineio.ErrShortRead):
				t.Errorf("a load returned with success fewer bytes than a row: %v", err)
			case err != nil:
				failed.Add(1)
			default:
				loads.Add(1)
			}
		}
	})
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
	t.Logf("%d stores, %d refused, %d loads, %d failed", stores.Load(), refused.Load(), loads.Load(), failed.Load())
	if stores.Load() == 0 || loads.Load() == 0 {
		t.Fatal("nothing stored or loaded: the race was not run")
	}
	var st unix.Stat_t
	if err := unix.Stat(block, &st); err != nil {
		t.Fatalf("stat of the block after the race: %v", err)
	}
	if st.Size != rowBytes {
		t.Errorf("the block's size after the race is %d, want %d", st.Size, rowBytes)
	}
	scratch := m.region.Row(3)
	if err := m.tier.LoadIgnoringClose(block, scratch); err != nil {
		t.Errorf("load after the race: %v", err)
	} else if !bytes.Equal(scratch, versions[0]) && !bytes.Equal(scratch, versions[1]) {
		t.Error("load after the race returned bytes no store wrote")
	}
	m.checkNothingLeftCounted(t, 1)
}

// stopSignal returns a channel to close and a check of whether it was closed,
// for loops that run until a test stops them.
func stopSignal() (chan struct{}, func() bool) {
	stop := make(chan struct{})
	return stop, func() bool {
		select {
		case <-stop:
			return true
		default:
			return false
		}
	}
}

// loadRacing loads block into scratch as vLLM's loader does (close errors
// ignored) and returns the load's error; a load that succeeds with bytes none
// of versions holds fails the test.
func loadRacing(t *testing.T, m *passthroughMount, block string, scratch []byte, versions [][]byte) error {
	clear(scratch)
	if err := m.tier.LoadIgnoringClose(block, scratch); err != nil {
		return err
	}
	for _, v := range versions {
		if bytes.Equal(scratch, v) {
			return nil
		}
	}
	t.Errorf("a load returned with success bytes no store wrote")
	return nil
}
