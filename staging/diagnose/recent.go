package diagnose

import (
	"sync"
	"time"
)

// Recent tells whether cumulative counters grew lately, so that a warning
// raised by one (checksum failures, refused stores, I/O errors) clears once
// its cause has been quiet for a window, while the counter keeps its total
// for rates and alerts. Growth is seen when a counter is shown (each stats
// snapshot or scrape); its methods are safe for concurrent use.
type Recent struct {
	window time.Duration
	now    func() time.Time

	mu       sync.Mutex
	counters map[string]*episode
}

// episode is a counter's last run of growth: its total before the run, its
// total when last shown, and when it last grew.
type episode struct {
	before, last int64
	grewAt       time.Time
}

// NewRecent tracks counters over window (DefaultWindow when not positive)
// with the clock now (time.Now when nil).
func NewRecent(window time.Duration, now func() time.Time) *Recent {
	positiveOr(&window, DefaultWindow)
	if now == nil {
		now = time.Now
	}
	return &Recent{window: window, now: now, counters: make(map[string]*episode)}
}

// Window is how long a counter must stay flat for its warning to clear.
func (r *Recent) Window() time.Duration { return r.window }

// Grew records counter name at total and reports whether it grew within
// the window, with how much it grew in its current run (growths less than
// a window apart count as one run).
func (r *Recent) Grew(name string, total int64) (grown int64, recent bool) {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.counters[name]
	if e == nil {
		e = &episode{}
		r.counters[name] = e
	}
	if total > e.last {
		if e.grewAt.IsZero() || now.Sub(e.grewAt) > r.window {
			e.before = e.last
		}
		e.grewAt = now
	}
	e.last = total
	if e.grewAt.IsZero() || now.Sub(e.grewAt) > r.window {
		return 0, false
	}
	return total - e.before, true
}
