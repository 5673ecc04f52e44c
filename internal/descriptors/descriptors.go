// Package descriptors keeps file descriptors for the daemon's own work
// (DESIGN "Threat model"): every file the engine's uid holds open through the
// mount holds one or two of the daemon's, and without a bound a process
// holding opens took them all, after which the daemon could no longer accept
// a peer, fetch, publish, answer its endpoints or write its notes.
package descriptors

import (
	"fmt"
	"log/slog"
	"math"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Count returns how many descriptors this process holds open and its soft
// RLIMIT_NOFILE. The count is the size the kernel gives /proc/self/fd (Linux
// 6.2 on: one fstat of a descriptor of it kept open, however many are
// open); where that is 0 (an older kernel) the directory is read instead.
func Count() (open, limit int, err error) {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return 0, 0, err
	}
	limit = int(min(rl.Cur, uint64(math.MaxInt32)))
	fd, err := procFD()
	if err != nil {
		return 0, 0, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, 0, err
	}
	if st.Size > 0 {
		return int(st.Size), limit, nil
	}
	open, err = listed()
	return open, limit, err
}

// procDir is the descriptor of /proc/self/fd that Count keeps open, -1
// until an open of it succeeded.
var procDir = struct {
	sync.Mutex
	fd int
}{fd: -1}

// procFD opens /proc/self/fd once, at the first Count that can.
func procFD() (int, error) {
	procDir.Lock()
	defer procDir.Unlock()
	if procDir.fd < 0 {
		fd, err := unix.Open("/proc/self/fd", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return -1, err
		}
		procDir.fd = fd
	}
	return procDir.fd, nil
}

// listed counts this process's descriptors by reading /proc/self/fd.
func listed() (int, error) {
	dir, err := os.Open("/proc/self/fd")
	if err != nil {
		return 0, err
	}
	defer dir.Close()
	names, err := dir.Readdirnames(-1)
	if err != nil {
		return 0, err
	}
	return len(names) - 1, nil // less the directory's own
}

// Levels of free descriptors (the limit less those open) below which the
// engine's opens are refused, for a limit of at least 4×keptMax:
//
//   - below keptMax, opens of a thread that holds threadHolds files open
//     through the mount or more: a process holding opens is refused, while
//     the engine's I/O threads (vLLM's 16 loaders and 16 storers hold one file
//     each at a time, its evictor one listing) go on;
//   - below ownMax, every open: the daemon's own work holds at most about
//     300 at once (64 peer handshakes and 8 lanes to each of the 7 peers of
//     a group of 8, 64 KV-event subscribers, 16 metrics connections, 16
//     staging fetches, 8 shared-level calls, a proof and a directory for
//     each rename in flight, the listeners and the runtime's own).
//
// A smaller limit keeps a quarter of itself, shared the same way.
const (
	keptMax     = 512
	ownMax      = 384
	threadHolds = 4
	// perOpen is the most descriptors one admitted open takes (a tmp and,
	// in a store in memory, the duplicate its lease is set on).
	perOpen = 2
)

// Levels are the free descriptors below which opens are refused, for a limit.
func Levels(limit int) (kept, own int) {
	kept = min(keptMax, limit/4)
	return kept, kept * ownMax / keptMax
}

// Between counts the Reserve decides by its last one while the free
// descriptors it leaves, less perOpen for each open admitted since, released
// or not (and for each pending one), stay at recountNear times the kept
// level or more, and for at most recountAfter: the daemon's own work cannot
// take the difference (about 300 against 2×512 less 384) in that time. Near
// the levels every open counts. On a kernel before 6.2 a count reads
// /proc/self/fd, about 2 ms at 4,096 descriptors and 13 ms at 16,000 on the
// development machine, which every open paid before (DESIGN "Threat model").
const (
	recountNear  = 2
	recountAfter = 50 * time.Millisecond
)

// Reserve admits the engine's opens through the mount (Admit) while they
// leave descriptors for the daemon's own work, and counts those it refuses.
// Its methods are safe for concurrent use.
type Reserve struct {
	count  func() (open, limit int, err error)
	logger *slog.Logger
	// now is the clock of recountAfter.
	now func() time.Time

	// counting runs one count at a time, outside mu, so that a slow one
	// holds up no Opened or Release.
	counting sync.Mutex

	mu sync.Mutex
	// held counts the admitted opens not yet released, by the kernel thread
	// that opened them: one entry per thread that holds one, so at most as
	// many as the descriptors they hold. Thread 0 (unknown) is not counted.
	held map[uint32]int
	// pending counts opens admitted whose descriptors may not be in the
	// count yet (Held.Opened).
	pending int
	// open and limit are the last count, taken at countedAt (zero: none to
	// decide by), and since counts the opens admitted
	// since it, released or not: a released handle's descriptors may
	// outlive it (a block tmp kept until it expires, a load's mapping).
	open, limit int
	countedAt   time.Time
	since       int
	refused     int64
	// lastLog is when a refusal was last logged; unlogged counts those since.
	lastLog  time.Time
	unlogged int64
}

// New makes a Reserve that counts descriptors with count (nil: Count) and
// logs refusals to logger (nil: none), at most one line a second.
func New(count func() (open, limit int, err error), logger *slog.Logger) *Reserve {
	if count == nil {
		count = Count
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Reserve{count: count, logger: logger, now: time.Now, held: map[uint32]int{}}
}

// Held is an admitted open: call Opened once its descriptors are open (or
// its open failed), and Release when they are closed.
type Held struct {
	r       *Reserve
	thread  uint32
	opened  bool
	release sync.Once
}

// Admit admits an open of the engine's kernel thread thread (0: unknown),
// or refuses it with ENFILE: the engine's own process is not out of
// descriptors, the daemon that serves the file keeps them, which ENFILE
// ("too many open files in system") says and EMFILE would not. A count that
// fails admits. An unknown thread (an engine in another PID namespace, whose
// every thread the kernel reports as 0) is refused only below the daemon's
// own share: the rule of a thread would pool all of its threads.
func (r *Reserve) Admit(thread uint32) (*Held, error) {
	r.counting.Lock()
	defer r.counting.Unlock()
	r.mu.Lock()
	far := r.farLocked()
	r.mu.Unlock()
	var err error
	if !far {
		var open, limit int
		open, limit, err = r.count()
		r.mu.Lock()
		r.countedAt = time.Time{}
		if err == nil {
			r.open, r.limit, r.countedAt, r.since = open, limit, r.now(), 0
		}
	} else {
		r.mu.Lock()
	}
	defer r.mu.Unlock()
	kept, own := Levels(r.limit)
	free := r.limit - r.open - perOpen*r.pending
	if !far && err == nil && (free < own || thread != 0 && free < kept && r.held[thread] >= threadHolds) {
		r.refused++
		r.logRefusalLocked(kept, thread)
		return nil, fmt.Errorf("open refused: the daemon holds %d of its %d descriptors and keeps %d for its own work: %w", r.open, r.limit, kept, syscall.ENFILE)
	}
	if thread != 0 {
		r.held[thread]++
	}
	r.pending++
	r.since++
	return &Held{r: r, thread: thread}, nil
}

// farLocked reports whether the last count decides an open: taken less than
// recountAfter ago, and leaving recountNear times the kept level free or
// more once every open admitted since (or pending) took perOpen.
func (r *Reserve) farLocked() bool {
	if r.countedAt.IsZero() || r.now().Sub(r.countedAt) >= recountAfter {
		return false
	}
	kept, _ := Levels(r.limit)
	return r.limit-r.open-perOpen*(r.since+r.pending) >= recountNear*kept
}

// logRefusalLocked logs a refusal, or counts it for the next line when one
// was logged less than a second ago.
func (r *Reserve) logRefusalLocked(kept int, thread uint32) {
	now := time.Now()
	if now.Sub(r.lastLog) < time.Second {
		r.unlogged++
		return
	}
	r.logger.Warn("engine open refused with ENFILE to keep file descriptors for the daemon's own work: files held open through the mount hold the daemon's; find who holds them (lsof +D MOUNTPOINT) or raise the daemon's LimitNOFILE",
		"open", r.open, "limit", r.limit, "kept", kept, "thread", thread, "thread_holds", r.held[thread], "refused_since_last_line", r.unlogged)
	r.lastLog, r.unlogged = now, 0
}

// Opened tells the Reserve that the open's descriptors are in the count now
// (or that it failed).
func (h *Held) Opened() {
	h.r.mu.Lock()
	defer h.r.mu.Unlock()
	if !h.opened {
		h.opened = true
		h.r.pending--
	}
}

// Release gives the open back once its descriptors are closed; later calls
// do nothing.
func (h *Held) Release() {
	h.release.Do(func() {
		h.Opened()
		r := h.r
		r.mu.Lock()
		defer r.mu.Unlock()
		if h.thread == 0 {
			return
		}
		if r.held[h.thread]--; r.held[h.thread] <= 0 {
			delete(r.held, h.thread)
		}
	})
}

// Refused counts the opens refused since the Reserve was made.
func (r *Reserve) Refused() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.refused
}

// Count is the count the Reserve decides by.
func (r *Reserve) Count() (open, limit int, err error) { return r.count() }
