package fusefs

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
	"github.com/kvtierfs/kvtierfs/tiers/disk"
)

// statsCollector exports at scrape time one stats snapshot: its numbers
// listed in ctlabi.Metrics (the only table of metrics of stats.json), the
// warnings stat prints, each peer's link, the primary tier, mirroring and
// the store phases' histograms.
type statsCollector struct {
	snapshot func() ctlabi.Stats
	// numbers[i] is the descriptor of ctlabi.Metrics[i].
	numbers []*prometheus.Desc
}

func newStatsCollector(snapshot func() ctlabi.Stats) statsCollector {
	c := statsCollector{snapshot: snapshot}
	for _, m := range ctlabi.Metrics {
		var labels []string
		if m.Label != "" {
			labels = []string{m.Label}
		}
		c.numbers = append(c.numbers, prometheus.NewDesc(m.Name, m.Help, labels, nil))
	}
	return c
}

var (
	warningDesc = prometheus.NewDesc("kvtierfs_warning",
		"1 while kvtierfs stat prints the warning with this code, else 0.", []string{"code"}, nil)
	peerUpDesc = prometheus.NewDesc("kvtierfs_peer_up",
		"1 while the link to the peer is up (or the peer is connected inbound), else 0.", []string{"peer"}, nil)
	peerRowsSentDesc = prometheus.NewDesc("kvtierfs_peer_rows_sent_total",
		"Rows mirrored to the peer.", []string{"peer"}, nil)
	peerRowsVerifiedDesc = prometheus.NewDesc("kvtierfs_peer_rows_verified_total",
		"Rows the peer acknowledged with the same checksum.", []string{"peer"}, nil)
	peerRowsReceivedDesc = prometheus.NewDesc("kvtierfs_peer_rows_received_total",
		"Rows received from the peer.", []string{"peer"}, nil)
	peerBytesDesc = prometheus.NewDesc("kvtierfs_peer_bytes_total",
		"Row bytes exchanged with the peer.", []string{"peer"}, nil)
	mirroringAllowedDesc = prometheus.NewDesc("kvtierfs_mirroring_allowed",
		"1 while row mirroring is allowed by --replicated-kv, else 0; absent on a single node.", nil, nil)
	primaryRowsDesc = prometheus.NewDesc("kvtierfs_primary_rows",
		"Rows of the engine's primary (shm) regions whose geometry is known.", nil, nil)
	primaryRegionsDesc = prometheus.NewDesc("kvtierfs_primary_regions",
		"Engine shm regions found.", nil, nil)
	storePhaseDesc = prometheus.NewDesc("kvtierfs_store_phase_seconds",
		"Duration of each step of stores' tmp creates and renames, as the daemon times them (disk.Phase).", []string{"phase"}, nil)
)

// Describe sends the fixed descriptors.
func (s statsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{warningDesc, peerUpDesc, peerRowsSentDesc, peerRowsVerifiedDesc, peerRowsReceivedDesc,
		peerBytesDesc, mirroringAllowedDesc, primaryRowsDesc, primaryRegionsDesc, storePhaseDesc} {
		ch <- d
	}
	for _, d := range s.numbers {
		ch <- d
	}
}

// Collect takes one snapshot and sends its metrics.
func (s statsCollector) Collect(ch chan<- prometheus.Metric) {
	st := s.snapshot()
	raised := map[string]bool{}
	for _, w := range st.Warnings {
		raised[w.Code] = true
	}
	for _, code := range ctlabi.WarningCodes {
		ch <- prometheus.MustNewConstMetric(warningDesc, prometheus.GaugeValue, boolValue(raised[code]), code)
		delete(raised, code)
	}
	for code := range raised { // a code missing from WarningCodes is still exported
		ch <- prometheus.MustNewConstMetric(warningDesc, prometheus.GaugeValue, 1, code)
	}
	for _, p := range st.Peers {
		ch <- prometheus.MustNewConstMetric(peerUpDesc, prometheus.GaugeValue, boolValue(p.Serving()), p.Addr)
		ch <- prometheus.MustNewConstMetric(peerRowsSentDesc, prometheus.CounterValue, float64(p.RowsSent), p.Addr)
		ch <- prometheus.MustNewConstMetric(peerRowsVerifiedDesc, prometheus.CounterValue, float64(p.Verified), p.Addr)
		ch <- prometheus.MustNewConstMetric(peerRowsReceivedDesc, prometheus.CounterValue, float64(p.RowsReceived), p.Addr)
		ch <- prometheus.MustNewConstMetric(peerBytesDesc, prometheus.CounterValue, float64(p.Bytes), p.Addr)
	}
	if r := st.Replication; r != nil {
		ch <- prometheus.MustNewConstMetric(mirroringAllowedDesc, prometheus.GaugeValue, boolValue(r.Allowed))
	}
	rows := int64(0)
	for _, r := range st.Primary.Regions {
		rows += r.Rows
	}
	ch <- prometheus.MustNewConstMetric(primaryRowsDesc, prometheus.GaugeValue, float64(rows))
	ch <- prometheus.MustNewConstMetric(primaryRegionsDesc, prometheus.GaugeValue, float64(len(st.Primary.Regions)))
	for name, ph := range st.Disk.StorePhases {
		ch <- storePhaseHistogram(name, ph)
	}
	for i, m := range ctlabi.Metrics {
		value, ok := m.Value(&st)
		if !ok {
			continue
		}
		kind := prometheus.GaugeValue
		if m.Kind == ctlabi.Counter {
			kind = prometheus.CounterValue
		}
		var labelValues []string
		if m.Label != "" {
			labelValues = []string{m.LabelValue(&st)}
		}
		ch <- prometheus.MustNewConstMetric(s.numbers[i], kind, value, labelValues...)
	}
}

// storePhaseHistogram is a phase's histogram in seconds, its buckets merged
// by octave (one per doubling of the duration).
func storePhaseHistogram(name string, ph ctlabi.Phase) prometheus.Metric {
	cumulative := map[float64]uint64{}
	var seen uint64
	for i, n := range ph.Buckets {
		seen += uint64(n)
		if i%disk.PhaseBucketsPerOctave == 0 && i < len(ph.Buckets)-1 { // the last counts everything longer: +Inf
			cumulative[disk.PhaseBucketBound(i).Seconds()] = seen
		}
	}
	return prometheus.MustNewConstHistogram(storePhaseDesc, uint64(ph.Count), ph.SumSeconds, cumulative, name)
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
