package descriptors

import (
	"errors"
	"math"
	"os"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

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
	// calls counts the counts taken.
	calls int
}

func (c *fakeCount) set(open int) {
	c.mu.Lock()
	c.open = open
	c.mu.Unlock()
}

func (c *fakeCount) count() (int, int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls++
	return c.open, c.limit, c.err
}

func (c *fakeCount) taken() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls
}

// fakeClock is a clock a test moves.
type fakeClock struct{ at time.Time }

func (c *fakeClock) now() time.Time { return c.at }

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

// TestReserveCountsOnlyNearTheLevels: far from the levels the Reserve
// decides by its last count, less perOpen for each open admitted since,
// released or not, and counts again once that comes near the levels or the
// count is recountAfter old; near them every open counts, so the daemon's
// own descriptors opened since the last count still refuse the next open.
func TestReserveCountsOnlyNearTheLevels(t *testing.T) {
	c := &fakeCount{limit: 1 << 20}
	clock := &fakeClock{at: time.Unix(1e9, 0)}
	r := New(c.count, nil)
	r.now = clock.now
	kept, own := Levels(c.limit)
	const room = 100 // opens admitted before the estimate comes near
	c.set(c.limit - recountNear*kept - perOpen*room)
	var held []*Held
	for range room / 2 {
		held = append(held, admitted(t, r, 1))
	}
	for range room / 2 { // released as they come, still counted: their descriptors may outlive them
		admitted(t, r, 2).Release()
	}
	held = append(held, admitted(t, r, 1)) // the last that leaves the kept levels twice over
	if got := c.taken(); got != 1 {
		t.Fatalf("%d counts for %d opens far from the levels, want 1", got, room+1)
	}
	held = append(held, admitted(t, r, 1))
	if got := c.taken(); got != 2 {
		t.Fatalf("%d counts once the opens held came near the levels, want 2", got)
	}
	for _, h := range held {
		h.Release()
	}
	c.set(c.limit - 4*kept)
	clock.at = clock.at.Add(recountAfter)
	admitted(t, r, 1)
	admitted(t, r, 1)
	if got := c.taken(); got != 3 {
		t.Fatalf("%d counts after %v, want 3", got, recountAfter)
	}
	c.set(c.limit - own + 1) // the daemon's own work took them since
	admits := 0
	for ; admits <= c.limit; admits++ {
		h, err := r.Admit(3)
		if err != nil {
			break
		}
		h.Opened()
	}
	if most := (4*kept - recountNear*kept) / perOpen; admits > most || c.taken() != 4 {
		t.Errorf("%d opens admitted by a count since taken over, in %d counts; want at most %d, then one count refusing", admits, c.taken(), most)
	}
}

// TestReserveUnknownThread: an engine in another PID namespace opens as
// thread 0, each of its threads alike: it is held to the daemon's own
// share only, never to the bound of one thread.
func TestReserveUnknownThread(t *testing.T) {
	c := &fakeCount{limit: 1 << 20}
	r := New(c.count, nil)
	kept, own := Levels(c.limit)
	c.set(c.limit - kept + 1)
	for range 2 * threadHolds {
		admitted(t, r, 0)
	}
	if len(r.held) != 0 {
		t.Errorf("holdings %v of the unknown thread, want none", r.held)
	}
	c.set(c.limit - own + 1)
	refused(t, r, 0, "with fewer than the daemon's own share free")
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

// BenchmarkAdmit is the cost the reserve adds to an engine's open far from
// the levels: the bookkeeping, and a count of this process's descriptors
// with its limit every recountAfter, with KVTIERFS_BENCH_FDS descriptors
// open (default none beyond the test's). The kernel's size of /proc/self/fd
// counts (Count), or as before Linux 6.2 its listing (listed), and each
// open counts as it does near the levels.
func BenchmarkAdmit(b *testing.B) {
	extra, _ := strconv.Atoi(os.Getenv("KVTIERFS_BENCH_FDS"))
	for range extra {
		f, err := os.Open(os.DevNull)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
	}
	b.Run("sized", func(b *testing.B) { benchmarkAdmit(b, New(nil, nil)) })
	b.Run("listed", func(b *testing.B) { benchmarkAdmit(b, New(listedCount, nil)) })
	b.Run("listed-near", func(b *testing.B) {
		r := New(listedCount, nil)
		r.now = (&fakeClock{}).now // every count is recountAfter old
		benchmarkAdmit(b, r)
	})
}

// listedCount is Count as before Linux 6.2: by the listing of /proc/self/fd.
func listedCount() (open, limit int, err error) {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return 0, 0, err
	}
	open, err = listed()
	return open, int(min(rl.Cur, math.MaxInt32)), err
}

func benchmarkAdmit(b *testing.B, r *Reserve) {
	for b.Loop() {
		h, err := r.Admit(1)
		if err != nil {
			b.Fatal(err)
		}
		h.Opened()
		h.Release()
	}
}

// TestReserveReleasedOpensMayKeepDescriptors: a handle's release does not
// give its descriptors back to the estimate far from the levels, since
// some outlive it (a block tmp closed without a rename keeps its
// descriptor 30 s, a load its mapping's): opens created and closed as fast
// as they come, each leaving a descriptor, are refused before they take
// the daemon's own share. Before, each release gave its two back, the
// estimate never came near the levels, and within one recountAfter the
// opens took every descriptor.
func TestReserveReleasedOpensMayKeepDescriptors(t *testing.T) {
	c := &fakeCount{limit: 2048}
	clock := &fakeClock{at: time.Unix(1e9, 0)}
	r := New(c.count, nil)
	r.now = clock.now // no recountAfter passes
	_, own := Levels(c.limit)
	open := 32
	c.set(open)
	for range c.limit {
		h, err := r.Admit(0)
		if err != nil {
			break
		}
		h.Opened()
		open++ // the tmp's descriptor, kept after its release
		c.set(open)
		h.Release()
	}
	if free := c.limit - open; free < own-perOpen {
		t.Fatalf("opens released at once but keeping a descriptor each left %d of %d free, want at least %d", free, c.limit, own-perOpen)
	}
}
