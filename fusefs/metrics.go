package fusefs

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the Prometheus view of the mount: a stats snapshot taken at
// scrape time (metrics_stats.go) plus latency histograms observed here.
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
	collectors := []prometheus.Collector{m.lookupSeconds, m.readSeconds, m.writeSeconds, newStatsCollector(f.Stats)}
	for _, col := range collectors {
		if err := reg.Register(col); err != nil {
			return nil, err
		}
	}
	return m, nil
}
