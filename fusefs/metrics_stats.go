package fusefs

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvtierfs/kvtierfs/staging"
	"github.com/kvtierfs/kvtierfs/sync/rowsync"
)

// warningCodes are the codes of the warnings stat can print; each is
// exported as kvtierfs_warning{code}, 0 while it is not raised, so alerts
// and dashboards can name them before they ever fire.
var warningCodes = []string{
	"checksum_failures", "no_space", "shm_unmappable", "shm_geometry", "peer_down", "mirroring_off", "shared_unreachable", "shared_behind",
	staging.WarnWriteOnlyGroup, staging.WarnWriteOnlyTier, staging.WarnHashSeedDrift, staging.WarnPrimaryTierExhausted,
}

// statsCollector exports at scrape time what a stats snapshot knows beyond
// the store's counters: the warnings stat prints, each peer's link, the
// primary tier, mirroring and where loads came from.
type statsCollector struct {
	snapshot func() Stats
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
	snapshotCounters = []struct {
		desc  *prometheus.Desc
		value func(c Counters) int64
	}{
		{prometheus.NewDesc("kvtierfs_rows_mirrored_total", "Loaded rows every peer acknowledged.", nil, nil),
			func(c Counters) int64 { return c.RowsMirrored }},
		{prometheus.NewDesc("kvtierfs_lookups_withheld_total", "Present blocks answered absent while mirroring was impossible.", nil, nil),
			func(c Counters) int64 { return c.LookupsWithheld }},
		{prometheus.NewDesc("kvtierfs_auth_failures_total", "Peer connections refused for failing authentication.", nil, nil),
			func(c Counters) int64 { return c.AuthFailures }},
		{prometheus.NewDesc("kvtierfs_loads_from_store_total", "Loads whose bytes were read from the store and verified before their last read returned.", nil, nil),
			func(c Counters) int64 { return c.LoadsFromStore }},
		{prometheus.NewDesc("kvtierfs_loads_from_staging_total", "Loads served from verified staged bytes.", nil, nil),
			func(c Counters) int64 { return c.LoadsFromStaging }},
		{prometheus.NewDesc("kvtierfs_loads_from_row_total", "Loads served from a row of the engine's region that still held the block.", nil, nil),
			func(c Counters) int64 { return c.LoadsFromRow }},
		{prometheus.NewDesc("kvtierfs_loads_refused_total", "Loads refused: opens that failed (vanished block, too many bytes open) and blocks that failed verification.", nil, nil),
			func(c Counters) int64 { return c.LoadsRefused }},
		{prometheus.NewDesc("kvtierfs_loads_unmirrored_total", "Loads whose read failed because a peer did not acknowledge their row.", nil, nil),
			func(c Counters) int64 { return c.LoadsUnmirrored }},
		{prometheus.NewDesc("kvtierfs_matches_total", "Batched match requests answered.", nil, nil),
			func(c Counters) int64 { return c.Matches }},
	}
)

// Describe sends the fixed descriptors.
func (statsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{warningDesc, peerUpDesc, peerRowsSentDesc, peerRowsVerifiedDesc, peerRowsReceivedDesc,
		peerBytesDesc, mirroringAllowedDesc, primaryRowsDesc, primaryRegionsDesc} {
		ch <- d
	}
	for _, c := range snapshotCounters {
		ch <- c.desc
	}
}

// Collect takes one snapshot and sends its metrics.
func (s statsCollector) Collect(ch chan<- prometheus.Metric) {
	st := s.snapshot()
	raised := map[string]bool{}
	for _, w := range st.Warnings {
		raised[w.Code] = true
	}
	for _, code := range warningCodes {
		ch <- prometheus.MustNewConstMetric(warningDesc, prometheus.GaugeValue, boolValue(raised[code]), code)
		delete(raised, code)
	}
	for code := range raised { // a code missing from warningCodes is still exported
		ch <- prometheus.MustNewConstMetric(warningDesc, prometheus.GaugeValue, 1, code)
	}
	for _, p := range st.Peers {
		up := p.State == rowsync.StateUp || p.State == rowsync.StateInbound
		ch <- prometheus.MustNewConstMetric(peerUpDesc, prometheus.GaugeValue, boolValue(up), p.Addr)
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
	for _, c := range snapshotCounters {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(c.value(st.Counters)))
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
