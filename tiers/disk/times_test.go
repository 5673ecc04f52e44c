package disk

import (
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// statTimes are the times of a store file, read by path.
func statTimes(t *testing.T, p string) Times {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return timesOf(&st)
}

// TestSetTimesPersist: times set on a block are its file's, kept across a
// restart of the store.
func TestSetTimesPersist(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Config{Dir: dir, Capacity: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	rel := blockRel(testTier, 0, hashHex(1, 64))
	putBlock(t, s, rel, pageData(1, 2))
	if got, ok := s.Times(rel); !ok || got != statTimes(t, filepath.Join(dir, rel)) {
		t.Fatalf("Times after publish = %+v, %v; the file has %+v", got, ok, statTimes(t, filepath.Join(dir, rel)))
	}
	atime := unix.NsecToTimespec(time.Date(2020, 1, 2, 3, 4, 5, 6, time.UTC).UnixNano())
	mtime := unix.NsecToTimespec(time.Date(2019, 1, 2, 3, 4, 5, 7, time.UTC).UnixNano())
	got, err := s.SetTimes(rel, atime, mtime)
	if err != nil || got.Atime != atime || got.Mtime != mtime {
		t.Fatalf("SetTimes = %+v, %v; want atime %v, mtime %v", got, err, atime, mtime)
	}
	if onDisk := statTimes(t, filepath.Join(dir, rel)); onDisk != got {
		t.Fatalf("file times %+v, store says %+v", onDisk, got)
	}
	// UTIME_OMIT keeps a time, UTIME_NOW takes the clock's.
	before := time.Now().Add(-time.Second).UnixNano()
	got, err = s.SetTimes(rel, unix.Timespec{Nsec: unix.UTIME_OMIT}, unix.Timespec{Nsec: unix.UTIME_NOW})
	if err != nil || got.Atime != atime || got.Mtime.Nano() < before {
		t.Fatalf("SetTimes(omit, now) = %+v, %v", got, err)
	}
	s.Close()
	s = openStore(t, Config{Dir: dir, Capacity: 1 << 30})
	if again, ok := s.Times(rel); !ok || again.Atime != atime || again.Mtime != got.Mtime {
		t.Fatalf("Times after a restart = %+v, %v; want atime %v, mtime %v", again, ok, atime, got.Mtime)
	}
	if _, err := s.SetTimes(blockRel(testTier, 0, hashHex(2, 64)), atime, mtime); err == nil {
		t.Fatal("SetTimes of an absent block succeeded")
	}
}

// TestAccessedIsRelatime: a load moves the access time when it is not later
// than the modification time or a day old, and leaves a recent one.
func TestAccessedIsRelatime(t *testing.T) {
	s := openStore(t, Config{Capacity: 1 << 30})
	rel := blockRel(testTier, 0, hashHex(1, 64))
	putBlock(t, s, rel, pageData(1, 2))
	access := func() Times {
		t.Helper()
		r, err := s.PinBlock(rel)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		if err := r.Accessed(); err != nil {
			t.Fatal(err)
		}
		got, _ := s.Times(rel)
		if onDisk := statTimes(t, s.Path(rel)); onDisk != got {
			t.Fatalf("file times %+v, store says %+v", onDisk, got)
		}
		return got
	}
	hour := func(h int) unix.Timespec {
		return unix.NsecToTimespec(time.Now().Add(time.Duration(h) * time.Hour).UnixNano())
	}
	anHourAgo := time.Now().Add(-time.Hour).UnixNano()

	// Never read since written (atime = mtime): the load moves it.
	if _, err := s.SetTimes(rel, hour(-2), hour(-2)); err != nil {
		t.Fatal(err)
	}
	first := access()
	if first.Atime.Nano() <= anHourAgo {
		t.Fatalf("a load of a block unread since written left atime at %v", time.Unix(0, first.Atime.Nano()))
	}
	// Read within the day, after its write: left as it is.
	if second := access(); second.Atime != first.Atime {
		t.Fatalf("a second load within the day moved atime from %v to %v", first.Atime, second.Atime)
	}
	// Read more than a day ago: moved again.
	if _, err := s.SetTimes(rel, hour(-25), hour(-48)); err != nil {
		t.Fatal(err)
	}
	if third := access(); third.Atime.Nano() <= anHourAgo {
		t.Fatalf("a load of a block read a day ago left atime at %v", time.Unix(0, third.Atime.Nano()))
	}
}
