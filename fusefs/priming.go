package fusefs

import (
	"context"
	"time"

	"github.com/kvtierfs/kvtierfs/fusefs/prime"
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
	if !f.priming.Begin(tier, time.Now()) {
		return
	}
	go func() {
		defer f.priming.Done()
		names := prime.TierNames(tier, f.index.groupDirs(tier, prime.MaxGroupDirs))
		if !f.primer.Prime(names) {
			f.logger.Debug("priming a tier's lookups skipped: the lookup helper is behind or gone", "tier", tier)
			return
		}
		f.tiersPrimed.Add(1)
		f.logger.Debug("priming a tier's lookups", "tier", tier, "names", len(names))
	}()
}
