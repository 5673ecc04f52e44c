package descriptors

import (
	"errors"
	"math"
	"os"
	"strconv"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestCountCountsOpens: a descriptor this process opens is counted, by the
// kernel's size of /proc/self/fd and by its listing alike, and the limit is
// the process's soft RLIMIT_NOFILE.
func TestCountCountsOpens(t *testing.T) {
	before, limit, err := Count()
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	after, _, err := Count()
	if err != nil {
		t.Fatal(err)
	}
	byListing, err := listed()
	if err != nil {
		t.Fatal(err)
	}
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	if after != before+1 || byListing != after || uint64(limit) != min(rl.Cur, math.MaxInt32) {
		t.Errorf("descriptors %d then %d with one more open (%d listed), limit %d (rlimit %d)", before, after, byListing, limit, rl.Cur)
	}
}

// fakeCount is a descriptor count a test sets.
type fakeCount struct {
	mu          sync.Mutex
	open, limit int
	err         error
}

func (c *fakeCount) set(open int) {
	c.mu.Lock()
	c.open = open
	c.mu.Unlock()
}

func (c *fakeCount) count() (int, int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.open, c.limit, c.err
}

// admitted admits an open of thread whose descriptors are in the count.
func admitted(t *testing.T, r *Reserve, thread uint32) *Held {
	t.Helper()
	h, err := r.Admit(thread)
	if err != nil {
		t.Fatalf("open of thread %d refused: %v", thread, err)
	}
	h.Opened()
	return h
}

// refused asserts that an open of thread is refused with ENFILE.
func refused(t *testing.T, r *Reserve, thread uint32, why string) {
	t.Helper()
	if h, err := r.Admit(thread); !errors.Is(err, syscall.ENFILE) {
		if h != nil {
			h.Release()
		}
		t.Fatalf("open of thread %d %s: %v, want ENFILE", thread, why, err)
	}
}

// TestReserveLevels: opens are admitted while the kept descriptors stay
// free; below that a thread holding threadHolds opens is refused while
// other threads go on; below the daemon's own share every open is refused;
// each refusal is counted, and what is released is admitted again.
func TestReserveLevels(t *testing.T) {
	c := &fakeCount{limit: 1 << 20}
	r := New(c.count, nil)
	kept, own := Levels(c.limit)
	if kept != keptMax || own != ownMax {
		t.Fatalf("levels %d and %d for a limit of %d, want %d and %d", kept, own, c.limit, keptMax, ownMax)
	}
	const holder, loader = 7, 8
	var held []*Held
	c.set(c.limit - kept)
	for range threadHolds {
		held = append(held, admitted(t, r, holder))
	}
	c.set(c.limit - kept + 1)
	refused(t, r, holder, "holding many with fewer than the kept descriptors free")
	loaded := admitted(t, r, loader)
	c.set(c.limit - own + 1)
	refused(t, r, loader, "with fewer than the daemon's own share free")
	if got := r.Refused(); got != 2 {
		t.Errorf("%d opens counted refused, want 2", got)
	}
	loaded.Release()
	loaded.Release() // once only
	held[0].Release()
	c.set(c.limit - kept + 1)
	admitted(t, r, holder)
	refused(t, r, holder, "holding many again")
	if len(r.held) != 1 || r.held[holder] != threadHolds {
		t.Errorf("holdings %v after the releases, want %d of thread %d only", r.held, threadHolds, holder)
	}
}

// TestReserveCountsPendingOpens: an admitted open whose descriptors are not
// in the count yet counts as taken, so that opens admitted at once cannot
// take more than the free descriptors.
func TestReserveCountsPendingOpens(t *testing.T) {
	c := &fakeCount{limit: 1 << 20}
	r := New(c.count, nil)
	_, own := Levels(c.limit)
	c.set(c.limit - own - perOpen + 1)
	pending, err := r.Admit(1)
	if err != nil {
		t.Fatal(err)
	}
	refused(t, r, 2, "while another's descriptors are on their way")
	pending.Opened() // the open failed: nothing more is held
	admitted(t, r, 2)
}

// TestReserveSmallLimit: a small limit keeps a quarter of itself, three
// quarters of that for the daemon's own work, and a count that fails admits.
func TestReserveSmallLimit(t *testing.T) {
	if kept, own := Levels(400); kept != 100 || own != 75 {
		t.Errorf("levels %d and %d for a limit of 400, want 100 and 75", kept, own)
	}
	c := &fakeCount{limit: 400, open: 400, err: errors.New("no /proc")}
	admitted(t, New(c.count, nil), 1)
}

// BenchmarkAdmit is the cost the reserve adds to an engine's open: a count
// of this process's descriptors, its limit, and the bookkeeping, with
// KVTIERFS_BENCH_FDS descriptors open (default none beyond the test's).
func BenchmarkAdmit(b *testing.B) {
	extra, _ := strconv.Atoi(os.Getenv("KVTIERFS_BENCH_FDS"))
	for range extra {
		f, err := os.Open(os.DevNull)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
	}
	r := New(nil, nil)
	for b.Loop() {
		h, err := r.Admit(1)
		if err != nil {
			b.Fatal(err)
		}
		h.Opened()
		h.Release()
	}
}
