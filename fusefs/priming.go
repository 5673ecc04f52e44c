package fusefs

import (
	"context"
	"time"
)

// Primer looks names of the mount up from another process, so that the
// kernel caches them before the engine asks (*prime.Helper; DESIGN.md
// "Lookups and the kernel's caches").
type Primer interface {
	// Prime queues names relative to the mountpoint; false when dropped.
	Prime(names []string) bool
	// Owns reports whether a request's caller thread is the primer's.
	Owns(thread uint32) bool
	// Looked is how many names the primer looked up.
	Looked() int64
}

// primeInterval is the least time between two primings of one tier. The
// kernel looks a tier up again only after dropping its entry, so each lookup
// is news; the interval only bounds the cost (4,096 lookups from sixteen
// threads) when caches are dropped in a loop.
const primeInterval = 100 * time.Millisecond

// maxPrimedTiers bounds the tiers whose last priming is remembered.
const maxPrimedTiers = 1 << 12

// maxPrimings bounds the primings being prepared at once (each lists a
// tier's names), whatever the lookups that ask for them.
const maxPrimings = 2

// maxPrimedGroupDirs bounds the group directories primed in one tier.
const maxPrimedGroupDirs = 1 << 16

// primeTier primes a directory at the mount's root after the kernel asked
// the daemon for it or for one of its prefix names, which it does only when
// it holds no entry for that name: at first, and after dropping its caches,
// when it has forgotten other names of the tier too (memory pressure drops
// the leaves, the prefix names, before the tier). The prefix names (4,096,
// present or absent) and the group directories that exist are looked up by
// the primer, so that the engine's first lookups of new keys end in the
// kernel's cache instead of a round trip to the daemon per missing
// directory. Blocks are not primed: their lookups must reach the daemon,
// which protects and chains what it tells the engine is present. A primed
// tier's prefix names reach the daemon again only once the kernel dropped
// them.
func (f *FS) primeTier(ctx context.Context, tier string) {
	if f.primer == nil || f.primer.Owns(callerThread(ctx)) || !f.index.isTier(tier) {
		return
	}
	now := time.Now()
	f.primedMu.Lock()
	if last, ok := f.primed[tier]; ok && now.Sub(last) < primeInterval {
		f.primedMu.Unlock()
		return
	}
	f.primed[tier] = now
	if len(f.primed) > maxPrimedTiers {
		// Only the recent entries limit anything.
		for t, at := range f.primed {
			if now.Sub(at) >= primeInterval {
				delete(f.primed, t)
			}
		}
	}
	f.primedMu.Unlock()
	if f.primings.Add(1) > maxPrimings {
		f.primings.Add(-1)
		return
	}
	go func() {
		defer f.primings.Add(-1)
		names := make([]string, 0, prefixNames)
		for i := range prefixNames {
			names = append(names, tier+"/"+prefixName(i))
		}
		names = append(names, f.index.groupDirs(tier, maxPrimedGroupDirs)...)
		if !f.primer.Prime(names) {
			f.logger.Debug("priming a tier's lookups skipped: the lookup helper is behind or gone", "tier", tier)
			return
		}
		f.tiersPrimed.Add(1)
		f.logger.Debug("priming a tier's lookups", "tier", tier, "names", len(names))
	}()
}
