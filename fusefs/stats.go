package fusefs

import (
	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
	"github.com/kvtierfs/kvtierfs/tiers/tier"
)

// Stats takes a snapshot of the mount's state for stats.json: tier.Stats
// assembles it and raises every warning; the mount hands it the counters it
// keeps itself (its loads and the tiers it primed).
func (f *FS) Stats() ctlabi.Stats {
	return f.stats.Snapshot(ctlabi.Counters{
		LoadsFromStore:     f.loads.Counters.FromStore.Load(),
		LoadsFromStaging:   f.loads.Counters.FromStaging.Load(),
		LoadsFromRow:       f.loads.Counters.FromRow.Load(),
		LoadsInPlace:       f.loads.Counters.InPlace.Load(),
		LoadsRemapped:      f.loads.Counters.Remapped.Load(),
		LoadsProvenAtStore: f.loads.Counters.ProvenAtStore.Load(),
		LoadsRefused:       f.loads.Counters.Refused.Load(),
		LoadsUnmirrored:    f.loads.Counters.MirrorFailures.Load(),
		TiersPrimed:        f.tiersPrimed.Load(),
	})
}

// statsConfig is what the mount's stats.json is assembled from (tier.NewStats).
func (f *FS) statsConfig(opts Options) tier.StatsConfig {
	cfg := tier.StatsConfig{Mountpoint: f.mountpoint, Store: opts.Store, Tier: f.tier, Diagnostics: f.diagnostics,
		WarningWindow: opts.WarningWindow, Descriptors: f.reserve}
	if opts.LookupBudget != nil {
		cfg.Budget = opts.LookupBudget
	}
	if opts.Stager != nil {
		cfg.Stager = opts.Stager
	}
	if opts.Shared != nil {
		cfg.Shared = opts.Shared
	}
	if opts.Sync != nil {
		cfg.Sync = opts.Sync
	}
	if opts.Regions != nil {
		cfg.Regions = opts.Regions
	}
	if f.primer != nil {
		cfg.Primer = f.primer
	}
	if opts.KVEvents != nil {
		cfg.KVEvents = opts.KVEvents
	}
	return cfg
}
