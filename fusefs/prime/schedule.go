package prime

import (
	"sync"
	"sync/atomic"
	"time"
)

// Interval is the least time between two primings of one tier. The kernel
// looks a tier up again only after dropping its entry, so each lookup is
// news; the interval only bounds the cost (4,096 lookups from sixteen
// threads) when caches are dropped in a loop.
const Interval = 100 * time.Millisecond

// maxTiers bounds the tiers whose last priming is remembered.
const maxTiers = 1 << 12

// maxPrimings bounds the primings being prepared at once (each lists a
// tier's names), whatever the lookups that ask for them.
const maxPrimings = 2

// MaxGroupDirs bounds the group directories primed in one tier.
const MaxGroupDirs = 1 << 16

// PrefixNames is how many names the prefix level has in a tier: 16³.
const PrefixNames = 16 * 16 * 16

// Schedule decides when a tier is primed: at most once per Interval, and
// while at most maxPrimings primings are being prepared (DESIGN.md "Lookups
// and the kernel's caches"). Its zero value is ready; it is safe for
// concurrent use.
type Schedule struct {
	mu        sync.Mutex
	last      map[string]time.Time
	preparing atomic.Int32
}

// Begin reports whether tier is primed now: not when it was primed less
// than Interval ago nor when maxPrimings are being prepared. A tier it turns
// down for the second reason waits the interval too. After true, the caller
// calls Done once the priming was handed on.
func (s *Schedule) Begin(tier string, now time.Time) bool {
	s.mu.Lock()
	if last, ok := s.last[tier]; ok && now.Sub(last) < Interval {
		s.mu.Unlock()
		return false
	}
	if s.last == nil {
		s.last = make(map[string]time.Time)
	}
	s.last[tier] = now
	if len(s.last) > maxTiers {
		// Only the recent entries limit anything.
		for t, at := range s.last {
			if now.Sub(at) >= Interval {
				delete(s.last, t)
			}
		}
	}
	s.mu.Unlock()
	if s.preparing.Add(1) > maxPrimings {
		s.preparing.Add(-1)
		return false
	}
	return true
}

// Done ends a priming Begin allowed.
func (s *Schedule) Done() { s.preparing.Add(-1) }

// TierNames is what priming tier looks up, relative to the mountpoint: its
// PrefixNames prefix names, present or absent, and groupDirs, the group
// directories it holds. Blocks are never primed: their lookups must reach
// the daemon, which protects and chains what it tells the engine is present.
func TierNames(tier string, groupDirs []string) []string {
	const hex = "0123456789abcdef"
	names := make([]string, 0, PrefixNames+len(groupDirs))
	for i := range PrefixNames {
		names = append(names, tier+"/"+string([]byte{hex[i>>8&15], hex[i>>4&15], hex[i&15]}))
	}
	return append(names, groupDirs...)
}
