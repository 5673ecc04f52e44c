package fusefs

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvtierfs/kvtierfs/staging"
	"github.com/kvtierfs/kvtierfs/tiers/disk"
)

// metrics are the Prometheus view of the mount: the store's counters read at
// scrape time plus latency histograms observed here.
type metrics struct {
	lookupSeconds prometheus.Histogram
	readSeconds   prometheus.Histogram
	writeSeconds  prometheus.Histogram
}

// latencyBuckets span a cached lookup (microseconds) to a slow row load (seconds).
var latencyBuckets = prometheus.ExponentialBuckets(5e-6, 4, 12)

// newMetrics registers the mount's metrics on reg (nil registers nothing).
func newMetrics(reg prometheus.Registerer, f *FS) (*metrics, error) {
	m := &metrics{
		lookupSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvtierfs_lookup_seconds",
			Help: "Latency of block lookups that reached the daemon.", Buckets: latencyBuckets}),
		readSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvtierfs_read_seconds",
			Help: "Duration of block loads, from open to the end of the close (proof and mirroring included).", Buckets: latencyBuckets}),
		writeSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvtierfs_write_seconds",
			Help: "Duration of block stores, from create of the tmp file to its release.", Buckets: latencyBuckets}),
	}
	if reg == nil {
		return m, nil
	}
	c := f.store.Counters()
	counters := []struct {
		name, help string
		value      func() int64
	}{
		{"kvtierfs_lookups_total", "Block lookups that reached the daemon.", c.Lookups.Load},
		{"kvtierfs_lookup_hits_total", "Block lookups that found the block.", c.LookupHits.Load},
		{"kvtierfs_reads_total", "Block loads.", c.Reads.Load},
		{"kvtierfs_read_bytes_total", "Bytes of block loads.", c.ReadBytes.Load},
		{"kvtierfs_writes_total", "Blocks published.", c.Writes.Load},
		{"kvtierfs_write_bytes_total", "Bytes written to block tmp files.", c.WriteBytes.Load},
		{"kvtierfs_checksum_failures_total", "Blocks that failed verification and were removed.", c.ChecksumFailures.Load},
		{"kvtierfs_evictions_total", "Blocks evicted to stay within capacity.", c.Evictions.Load},
		{"kvtierfs_no_space_total", "Writes refused with ENOSPC.", c.NoSpace.Load},
		{"kvtierfs_rejected_writes_total", "Block writes refused as malformed.", c.RejectedWrites.Load},
		{"kvtierfs_unproven_blocks_total", "Block files found at mount without a digest bound to their name, not indexed.", c.UnprovenBlocks.Load},
		{"kvtierfs_tmps_expired_total", "Tmp files removed because their closed writer never renamed them.", c.TmpsExpired.Load},
		{"kvtierfs_publish_refused_total", "Renames refused because the tmp name no longer named the file written.", c.PublishRefused.Load},
		{"kvtierfs_store_io_errors_total", "Reads and writes the store filesystem failed (EIO, ENOSPC).", c.IOErrors.Load},
	}
	collectors := []prometheus.Collector{m.lookupSeconds, m.readSeconds, m.writeSeconds, statsCollector{f.Stats}}
	for _, k := range counters {
		value := k.value
		collectors = append(collectors, prometheus.NewCounterFunc(prometheus.CounterOpts{Name: k.name, Help: k.help},
			func() float64 { return float64(value()) }))
	}
	gauges := []struct {
		name, help string
		value      func(d disk.Stats) int64
	}{
		{"kvtierfs_disk_blocks", "Blocks in the store.", func(d disk.Stats) int64 { return d.Blocks }},
		{"kvtierfs_disk_logical_bytes", "Bytes of the blocks in the store.", func(d disk.Stats) int64 { return d.LogicalBytes }},
		{"kvtierfs_disk_physical_bytes", "Bytes the blocks occupy on disk.", func(d disk.Stats) int64 { return d.PhysicalBytes }},
	}
	for _, g := range gauges {
		value := g.value
		collectors = append(collectors, prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: g.name, Help: g.help},
			func() float64 { return float64(value(f.store.Stats())) }))
	}
	collectors = append(collectors,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvtierfs_disk_capacity_bytes", Help: "Capacity of the store."},
			func() float64 { capacity, _ := f.store.Space(); return float64(capacity) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvtierfs_disk_free_bytes", Help: "Bytes the store may still use."},
			func() float64 { _, free := f.store.Space(); return float64(free) }))
	if st := f.stager; st != nil {
		staged := []struct {
			name, help string
			counter    bool
			value      func(s staging.Stats) int64
		}{
			{"kvtierfs_staging_budget_bytes", "RAM budget of wave staging.", false, func(s staging.Stats) int64 { return s.BudgetBytes }},
			{"kvtierfs_staging_bytes", "Verified block bytes staged now.", false, func(s staging.Stats) int64 { return s.Bytes }},
			{"kvtierfs_staging_chains", "Chains streaming now.", false, func(s staging.Stats) int64 { return int64(s.Chains) }},
			{"kvtierfs_staging_waves_total", "Waves started.", true, func(s staging.Stats) int64 { return s.Waves }},
			{"kvtierfs_staging_hits_total", "Loads served from staging.", true, func(s staging.Stats) int64 { return s.Hits }},
			{"kvtierfs_staging_misses_total", "Loads of blocks that were not staged.", true, func(s staging.Stats) int64 { return s.Misses }},
			{"kvtierfs_staging_wasted_bytes_total", "Bytes staged that never served a load.", true, func(s staging.Stats) int64 { return s.WastedBytes }},
		}
		for _, m := range staged {
			value := func() float64 { return float64(m.value(st.Stats())) }
			if m.counter {
				collectors = append(collectors, prometheus.NewCounterFunc(prometheus.CounterOpts{Name: m.name, Help: m.help}, value))
			} else {
				collectors = append(collectors, prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: m.name, Help: m.help}, value))
			}
		}
	}
	for _, col := range collectors {
		if err := reg.Register(col); err != nil {
			return nil, err
		}
	}
	return m, nil
}
