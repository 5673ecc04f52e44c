package mount_test

import (
	"bytes"
	"fmt"
	"github.com/kvtierfs/kvtierfs/integration/engineio"
	"github.com/kvtierfs/kvtierfs/integration/mounttest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Renames crossing each other (a→b beside b→a, in one directory and across
// two), renames of a name onto itself, RENAME_EXCHANGE, directory renames
// and unlinks, all beside lookups (stat) of every name involved (nameOrder): none of it
// hangs the mount.
func TestNameOrderAttackNoHang(t *testing.T) {
	m := newPassthroughMount(t, 4)
	root := filepath.Join(m.d.Mountpoint, "scratch")
	d1, d2 := filepath.Join(root, "d1"), filepath.Join(root, "d2")
	for _, d := range []string{d1, d2} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	names := []string{filepath.Join(d1, "a"), filepath.Join(d1, "b"), filepath.Join(d2, "a"), filepath.Join(d2, "b")}
	for _, n := range names {
		if err := os.WriteFile(n, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	stop, stopped := stopSignal()
	var wg sync.WaitGroup
	var ops atomic.Int64
	for i := range names {
		for j := range names {
			wg.Go(func() {
				for !stopped() {
					os.Rename(names[i], names[j])
					unix.Renameat2(unix.AT_FDCWD, names[j], unix.AT_FDCWD, names[i], unix.RENAME_EXCHANGE)
					ops.Add(1)
				}
			})
		}
	}
	for _, n := range names {
		wg.Go(func() {
			var st unix.Stat_t
			for !stopped() {
				unix.Stat(n, &st)
				unix.Stat(filepath.Dir(n), &st)
			}
		})
	}
	wg.Go(func() {
		for k := 0; !stopped(); k++ {
			sub := filepath.Join(root, fmt.Sprintf("sub%d", k%2))
			os.MkdirAll(sub, 0o755)
			os.WriteFile(filepath.Join(sub, "x"), []byte("y"), 0o644)
			os.Rename(sub, filepath.Join(root, fmt.Sprintf("sub%d", (k+1)%2)))
			os.Remove(filepath.Join(sub, "x"))
		}
	})
	wg.Go(func() {
		var st unix.Stat_t
		for k := 0; !stopped(); k++ {
			unix.Stat(filepath.Join(root, fmt.Sprintf("sub%d", k%2), "x"), &st)
		}
	})
	for _, n := range names {
		wg.Go(func() {
			for !stopped() {
				os.WriteFile(n+".u", []byte("z"), 0o644)
				os.Remove(n + ".u")
			}
		})
		wg.Go(func() {
			var st unix.Stat_t
			for !stopped() {
				unix.Stat(n+".u", &st)
			}
		})
	}
	time.Sleep(3 * time.Second)
	close(stop)
	wg.Wait() // a deadlock hangs here until go test's timeout
	t.Logf("%d rename rounds", ops.Load())
}

// Passthrough stores of rows of 1, 2, 3 and 9 pages: a row whose pages are
// all zero but one (first, middle or last) is stored and loads back whole;
// a row changed after the kernel wrote it but before the rename (at the one
// page the run of 8 cannot cover at 9 pages, or anywhere at 1–3 pages) never
// loads back with success bytes other than the file's.
func TestPassthroughTinyRows(t *testing.T) {
	for _, pages := range []int{1, 2, 3, 9} {
		t.Run(fmt.Sprint(pages), func(t *testing.T) {
			size := pages * 4096
			path := fmt.Sprintf("/dev/shm/kvtier-test-tiny%d-%d.mmap", pages, os.Getpid())
			region, err := engineio.CreateRegion(path, 8, size)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { region.Close() })
			d := mounttest.Start(t, mounttest.Options{Store: t.TempDir(), ShmGlob: path})
			tier := openTier(t, d)
			engineio.FillPattern(region.Row(0), 1)
			if _, err := tier.Store(tier.BlockPath(tierDir, 0, hashOf(0)), region.Row(0)); err != nil {
				t.Fatal(err)
			}
			scratch := region.Row(7)
			n := 1
			for _, at := range []int{0, pages / 2, pages - 1} {
				row := region.Row(1)
				clear(row)
				row[at*4096+5] = byte(at + 1)
				want := append([]byte(nil), row...)
				p := tier.BlockPath(tierDir, 0, hashOf(n))
				n++
				if _, err := tier.Store(p, row); err != nil {
					t.Fatalf("store with page %d set: %v", at, err)
				}
				clear(row)
				clear(scratch)
				if err := tier.Load(p, scratch); err != nil {
					t.Fatalf("load with page %d set: %v", at, err)
				}
				if !bytes.Equal(scratch, want) {
					t.Fatalf("load with page %d set returned other bytes", at)
				}
			}
			for _, at := range []int{pages - 1, 0} {
				row := region.Row(2)
				engineio.FillPattern(row, uint64(100+at))
				p := tier.BlockPath(tierDir, 0, hashOf(n))
				n++
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				tmp := p + "_9.tmp"
				fd, err := unix.Open(tmp, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0o644)
				if err != nil {
					t.Fatal(err)
				}
				pwrite(t, fd, row, 0)
				unix.Close(fd)
				written := append([]byte(nil), row...)
				row[at*4096+7] ^= 0xff
				if err := os.Rename(tmp, p); err != nil {
					t.Fatal(err)
				}
				clear(scratch)
				err = tier.Load(p, scratch)
				if err == nil && !bytes.Equal(scratch, written) {
					t.Fatalf("a load of a row changed at page %d before its rename returned with success bytes other than the file's", at)
				}
				t.Logf("changed at page %d: load %v", at, err)
			}
			c := d.Stats().Counters
			t.Logf("from row %d, read back %d, checksum failures %d", c.StoresFromRow, c.StoresReadBack, c.ChecksumFailures)
		})
	}
}

// A rename refused after waiting for its tmp's release (the tmp still open
// for writing) while lookups of the block and tmp names pile up: the lookups
// end with the rename, and the block stores once the tmp is closed.
func TestLookupsPileUpBehindAWaitingRename(t *testing.T) {
	m := newPassthroughMount(t, 4)
	row := m.region.Row(1)
	fillRow(row, 1)
	block, tmp := m.paths(1)
	fd := m.openTmp(t, 1)
	pwrite(t, fd, row, 0)
	var wg sync.WaitGroup
	var renameErr error
	wg.Go(func() { renameErr = os.Rename(tmp, block) })
	for range 64 {
		wg.Go(func() {
			var st unix.Stat_t
			for range 20 {
				unix.Stat(block, &st)
				unix.Stat(tmp, &st)
			}
		})
	}
	wg.Wait()
	unix.Close(fd)
	if renameErr == nil {
		t.Log("the rename went through (the kernel released the tmp first)")
	} else if err := os.Rename(tmp, block); err != nil {
		t.Fatalf("rename once the tmp is closed: %v (first: %v)", err, renameErr)
	}
	m.loadsBack(t, 1, m.region.Row(3), expectedRow(1))
}
