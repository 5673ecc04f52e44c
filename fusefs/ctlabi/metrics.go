package ctlabi

// MetricKind is how Prometheus treats a metric.
type MetricKind int

const (
	// Counter only grows while the mount is up.
	Counter MetricKind = iota + 1
	// Gauge goes up and down.
	Gauge
)

// Metric is one number of stats.json exported to Prometheus.
type Metric struct {
	// Field is the number's path in stats.json, e.g. "counters.lookups".
	Field string
	// Name and Help are the metric's.
	Name, Help string
	Kind       MetricKind
	// Value reads the number from a snapshot; false when its section is
	// absent (staging off), and the metric is then not exported.
	Value func(*Stats) (float64, bool)
	// Label, when not empty, is the name of the metric's one label, and
	// LabelValue reads its value from the snapshot.
	Label      string
	LabelValue func(*Stats) string
}

// counter and gauge build the Metrics entries of the always-present sections.
func counter(field, name, help string, value func(*Stats) int64) Metric {
	return Metric{Field: field, Name: name, Help: help, Kind: Counter,
		Value: func(s *Stats) (float64, bool) { return float64(value(s)), true }}
}

func gauge(field, name, help string, value func(*Stats) int64) Metric {
	return Metric{Field: field, Name: name, Help: help, Kind: Gauge,
		Value: func(s *Stats) (float64, bool) { return float64(value(s)), true }}
}

// staged builds a Metrics entry of the "staging" section.
func staged(field, name, help string, kind MetricKind, value func(*Staging) int64) Metric {
	return Metric{Field: field, Name: name, Help: help, Kind: kind, Value: func(s *Stats) (float64, bool) {
		if s.Staging == nil {
			return 0, false
		}
		return float64(value(s.Staging)), true
	}}
}

// sharedGauge builds the Metrics entry of a number of the "shared" section:
// the gauge kvtierfs_shared_<field>.
func sharedGauge(field string, value func(*Shared) float64) Metric {
	return Metric{Field: "shared." + field, Name: "kvtierfs_shared_" + field, Kind: Gauge,
		Help: "The shared level's " + field + ` (stat's "shared" section).`,
		Value: func(s *Stats) (float64, bool) {
			if s.Shared == nil {
				return 0, false
			}
			return value(s.Shared), true
		}}
}

// sharedCount is sharedGauge of an integer.
func sharedCount(field string, value func(*Shared) int64) Metric {
	return sharedGauge(field, func(s *Shared) float64 { return float64(value(s)) })
}

// sharedFlag is sharedGauge of a boolean, 1 for true.
func sharedFlag(field string, value func(*Shared) bool) Metric {
	return sharedGauge(field, func(s *Shared) float64 {
		if value(s) {
			return 1
		}
		return 0
	})
}

// leaseHeld is lease_held's entry: the holder's name is its label.
func leaseHeld() Metric {
	m := sharedFlag("lease_held", func(s *Shared) bool { return s.LeaseHeld })
	m.Label, m.LabelValue = "holder", func(s *Stats) string { return s.Shared.LeaseHolder }
	return m
}

// Metrics lists the numbers of stats.json that the mount exports, each under
// its metric name; the numbers of the "shared" section are the gauges
// kvtierfs_shared_<field>. The per-peer numbers and the primary regions are
// exported with labels or as sums (fusefs), and the KV events counts by the
// publisher (fusefs/kvevents); TestEveryStatHasAMetric holds the list complete.
var Metrics = []Metric{
	counter("counters.lookups", "kvtierfs_lookups_total", "Block lookups that reached the daemon.",
		func(s *Stats) int64 { return s.Counters.Lookups }),
	counter("counters.lookup_hits", "kvtierfs_lookup_hits_total", "Block lookups that found the block.",
		func(s *Stats) int64 { return s.Counters.LookupHits }),
	counter("counters.reads", "kvtierfs_reads_total", "Block loads.",
		func(s *Stats) int64 { return s.Counters.Reads }),
	counter("counters.read_bytes", "kvtierfs_read_bytes_total", "Bytes of block loads.",
		func(s *Stats) int64 { return s.Counters.ReadBytes }),
	counter("counters.writes", "kvtierfs_writes_total", "Blocks published.",
		func(s *Stats) int64 { return s.Counters.Writes }),
	counter("counters.write_bytes", "kvtierfs_write_bytes_total", "Bytes written to block tmp files.",
		func(s *Stats) int64 { return s.Counters.WriteBytes }),
	counter("counters.checksum_failures", "kvtierfs_checksum_failures_total", "Blocks that failed verification and were removed, their file unchanged since the daemon last saw it (the disk).",
		func(s *Stats) int64 { return s.Counters.ChecksumFailures }),
	counter("counters.blocks_changed_outside", "kvtierfs_blocks_changed_outside_total", "Blocks that failed verification and were removed after their file was changed in the store tree, outside the daemon.",
		func(s *Stats) int64 { return s.Counters.BlocksChangedOutside }),
	counter("counters.no_space", "kvtierfs_no_space_total", "Writes refused with ENOSPC.",
		func(s *Stats) int64 { return s.Counters.NoSpace }),
	counter("counters.rejected_writes", "kvtierfs_rejected_writes_total", "Block writes refused for the caller's request: past the largest file the store holds (EFBIG), invalid (EINVAL), or past a tmp's bound (EDQUOT).",
		func(s *Stats) int64 { return s.Counters.RejectedWrites }),
	counter("counters.loads_from_store", "kvtierfs_loads_from_store_total", "Loads whose bytes were read from the store and verified before their last read returned.",
		func(s *Stats) int64 { return s.Counters.LoadsFromStore }),
	counter("counters.loads_from_staging", "kvtierfs_loads_from_staging_total", "Loads served from verified staged bytes.",
		func(s *Stats) int64 { return s.Counters.LoadsFromStaging }),
	counter("counters.loads_from_row", "kvtierfs_loads_from_row_total", "Loads served from a row of the engine's region that still held the block.",
		func(s *Stats) int64 { return s.Counters.LoadsFromRow }),
	counter("counters.loads_in_place", "kvtierfs_loads_in_place_total", "Loads from the store served from its mapped file under a read lease (a store in memory), with no copy.",
		func(s *Stats) int64 { return s.Counters.LoadsInPlace }),
	counter("counters.loads_remapped", "kvtierfs_loads_remapped_total", "Loads in place that found the block mapped and proven by an earlier load or by its store, under a lease held since.",
		func(s *Stats) int64 { return s.Counters.LoadsRemapped }),
	counter("counters.loads_proven_at_store", "kvtierfs_loads_proven_at_store_total", "Loads in place of a block proven by its store (written through the daemon under a write lease held since), which not even its first load checked.",
		func(s *Stats) int64 { return s.Counters.LoadsProvenAtStore }),
	counter("counters.loads_refused", "kvtierfs_loads_refused_total", "Loads refused: opens that failed (vanished block, too many bytes open) and blocks that failed verification.",
		func(s *Stats) int64 { return s.Counters.LoadsRefused }),
	counter("counters.loads_unmirrored", "kvtierfs_loads_unmirrored_total", "Loads whose read failed because a peer did not acknowledge their row.",
		func(s *Stats) int64 { return s.Counters.LoadsUnmirrored }),
	counter("counters.rows_mirrored", "kvtierfs_rows_mirrored_total", "Loaded rows every peer acknowledged.",
		func(s *Stats) int64 { return s.Counters.RowsMirrored }),
	counter("counters.lookups_withheld", "kvtierfs_lookups_withheld_total", "Present blocks answered absent while mirroring was impossible.",
		func(s *Stats) int64 { return s.Counters.LookupsWithheld }),
	counter("counters.budget_chains_capped", "kvtierfs_budget_chains_capped_total", "Lookup batches the lookup budget cut at the rows the primary tier can promote.",
		func(s *Stats) int64 { return s.Counters.BudgetChainsCapped }),
	counter("counters.budget_keys_withheld", "kvtierfs_budget_keys_withheld_total", "Present blocks the lookup budget answered absent.",
		func(s *Stats) int64 { return s.Counters.BudgetKeysWithheld }),
	counter("counters.matches", "kvtierfs_matches_total", "Batched match requests answered.",
		func(s *Stats) int64 { return s.Counters.Matches }),
	counter("counters.auth_failures", "kvtierfs_auth_failures_total", "Peer connections refused for failing authentication.",
		func(s *Stats) int64 { return s.Counters.AuthFailures }),
	counter("counters.handshakes_evicted", "kvtierfs_handshakes_evicted_total", "Peer handshakes closed to make room at a flooded listener (here or at a peer).",
		func(s *Stats) int64 { return s.Counters.HandshakesEvicted }),
	counter("counters.rows_late", "kvtierfs_rows_late_total", "Rows from peers that arrived after their deadline, not written.",
		func(s *Stats) int64 { return s.Counters.RowsLate }),
	counter("counters.unproven_blocks", "kvtierfs_unproven_blocks_total", "Block files found at mount without a digest bound to their name, not indexed.",
		func(s *Stats) int64 { return s.Counters.UnprovenBlocks }),
	counter("counters.tmps_expired", "kvtierfs_tmps_expired_total", "Tmp files removed because their closed writer never renamed them.",
		func(s *Stats) int64 { return s.Counters.TmpsExpired }),
	counter("counters.publish_refused", "kvtierfs_publish_refused_total", "Renames refused because the tmp name no longer named the file written.",
		func(s *Stats) int64 { return s.Counters.PublishRefused }),
	counter("counters.store_io_errors", "kvtierfs_store_io_errors_total", "Reads and writes the store filesystem failed (EIO, ENOSPC), not those refused for the caller's request.",
		func(s *Stats) int64 { return s.Counters.StoreIOErrors }),
	counter("counters.stores_from_row", "kvtierfs_stores_from_row_total", "Passthrough stores whose digest and zero pages came from the engine's row.",
		func(s *Stats) int64 { return s.Counters.StoresFromRow }),
	counter("counters.stores_read_back", "kvtierfs_stores_read_back_total", "Passthrough stores whose tmp file was read back (no row held its bytes).",
		func(s *Stats) int64 { return s.Counters.StoresReadBack }),
	counter("counters.other_files_refused", "kvtierfs_other_files_refused_total", "Writes outside the block layout refused with EDQUOT: the table of such files was full.",
		func(s *Stats) int64 { return s.Counters.OtherFilesRefused }),
	counter("counters.opens_refused", "kvtierfs_opens_refused_total", "Opens through the mount refused with ENFILE to keep file descriptors for the daemon's own work.",
		func(s *Stats) int64 { return s.Counters.OpensRefused }),
	counter("counters.shm_ignored", "kvtierfs_shm_ignored_total", "Files matching --shm-glob refused (links, other users' files).",
		func(s *Stats) int64 { return s.Counters.ShmIgnored }),
	counter("counters.shm_faults", "kvtierfs_shm_faults_total", "Engine regions dropped because they shrank under their mapping.",
		func(s *Stats) int64 { return s.Counters.ShmFaults }),
	counter("counters.tiers_primed", "kvtierfs_tiers_primed_total", "Times a tier's prefix names were looked up ahead of the engine.",
		func(s *Stats) int64 { return s.Counters.TiersPrimed }),
	counter("counters.names_primed", "kvtierfs_names_primed_total", "Names the lookup helper looked up ahead of the engine.",
		func(s *Stats) int64 { return s.Counters.NamesPrimed }),

	gauge("disk.blocks", "kvtierfs_disk_blocks", "Blocks in the store.",
		func(s *Stats) int64 { return s.Disk.Blocks }),
	gauge("disk.logical_bytes", "kvtierfs_disk_logical_bytes", "Bytes of the blocks in the store.",
		func(s *Stats) int64 { return s.Disk.LogicalBytes }),
	gauge("disk.physical_bytes", "kvtierfs_disk_physical_bytes", "Bytes the blocks occupy on disk.",
		func(s *Stats) int64 { return s.Disk.PhysicalBytes }),
	gauge("disk.capacity_bytes", "kvtierfs_disk_capacity_bytes", "Capacity of the store.",
		func(s *Stats) int64 { return s.Disk.CapacityBytes }),
	gauge("disk.free_bytes", "kvtierfs_disk_free_bytes", "Bytes the store may still use.",
		func(s *Stats) int64 { return s.Disk.FreeBytes }),
	counter("disk.evictions", "kvtierfs_evictions_total", "Blocks evicted to stay within capacity.",
		func(s *Stats) int64 { return s.Disk.Evictions }),
	gauge("disk.inflight_tmp_files", "kvtierfs_disk_tmp_files", "Block tmp files not yet renamed.",
		func(s *Stats) int64 { return int64(s.Disk.InFlightTmp) }),
	gauge("disk.tmp_bytes", "kvtierfs_disk_tmp_bytes", "Bytes the tmp files count against the capacity.",
		func(s *Stats) int64 { return s.Disk.TmpBytes }),
	gauge("disk.never_looked_up", "kvtierfs_disk_never_looked_up_blocks", "Blocks no lookup has found since the mount.",
		func(s *Stats) int64 { return s.Disk.NeverLookedUp }),
	gauge("disk.other_files", "kvtierfs_disk_other_files", "Files outside the block layout the store tracks.",
		func(s *Stats) int64 { return s.Disk.OtherFiles }),
	gauge("disk.other_files_max", "kvtierfs_disk_other_files_max", "Bound on the files outside the block layout the store tracks.",
		func(s *Stats) int64 { return s.Disk.OtherFilesMax }),
	gauge("disk.other_files_untracked", "kvtierfs_disk_other_files_untracked", "Files outside the block layout found past the bound, counted until the next start.",
		func(s *Stats) int64 { return s.Disk.OtherFilesUntracked }),

	gauge("descriptors.open", "kvtierfs_descriptors_open", "File descriptors the daemon holds.",
		func(s *Stats) int64 { return s.Descriptors.Open }),
	gauge("descriptors.limit", "kvtierfs_descriptors_limit", "The daemon's file descriptor limit (RLIMIT_NOFILE).",
		func(s *Stats) int64 { return s.Descriptors.Limit }),
	gauge("descriptors.kept", "kvtierfs_descriptors_kept", "File descriptors the engine's opens leave free for the daemon's own work.",
		func(s *Stats) int64 { return s.Descriptors.Kept }),

	staged("staging.budget_bytes", "kvtierfs_staging_budget_bytes", "RAM budget of wave staging.", Gauge,
		func(s *Staging) int64 { return s.BudgetBytes }),
	staged("staging.bytes", "kvtierfs_staging_bytes", "Verified block bytes staged now.", Gauge,
		func(s *Staging) int64 { return s.Bytes }),
	staged("staging.chains", "kvtierfs_staging_chains", "Chains streaming now.", Gauge,
		func(s *Staging) int64 { return int64(s.Chains) }),
	staged("staging.waves", "kvtierfs_staging_waves_total", "Waves started.", Counter,
		func(s *Staging) int64 { return s.Waves }),
	staged("staging.hits", "kvtierfs_staging_hits_total", "Loads served from staging.", Counter,
		func(s *Staging) int64 { return s.Hits }),
	staged("staging.misses", "kvtierfs_staging_misses_total", "Loads of blocks that were not staged.", Counter,
		func(s *Staging) int64 { return s.Misses }),
	staged("staging.late", "kvtierfs_staging_late_total", "Loads of blocks queued for staging, not fetched yet.", Counter,
		func(s *Staging) int64 { return s.Late }),
	staged("staging.wasted_bytes", "kvtierfs_staging_wasted_bytes_total", "Bytes staged that never served a load.", Counter,
		func(s *Staging) int64 { return s.WastedBytes }),

	sharedFlag("reachable", func(s *Shared) bool { return s.Reachable }),
	sharedCount("queue_blocks", func(s *Shared) int64 { return s.QueueBlocks }),
	sharedCount("queue_bytes", func(s *Shared) int64 { return s.QueueBytes }),
	sharedCount("bytes_behind", func(s *Shared) int64 { return s.BytesBehind }),
	sharedCount("written_blocks", func(s *Shared) int64 { return s.WrittenBlocks }),
	sharedCount("written_bytes", func(s *Shared) int64 { return s.WrittenBytes }),
	sharedCount("dropped_blocks", func(s *Shared) int64 { return s.DroppedBlocks }),
	sharedCount("fetched_blocks", func(s *Shared) int64 { return s.FetchedBlocks }),
	sharedCount("fetched_bytes", func(s *Shared) int64 { return s.FetchedBytes }),
	sharedGauge("fetch_seconds_avg", func(s *Shared) float64 { return s.FetchSecondsAvg }),
	sharedCount("lookups", func(s *Shared) int64 { return s.Lookups }),
	sharedCount("lookup_hits", func(s *Shared) int64 { return s.LookupHits }),
	sharedCount("negative_hits", func(s *Shared) int64 { return s.NegativeHits }),
	sharedCount("corrupt_dropped", func(s *Shared) int64 { return s.CorruptDropped }),
	sharedCount("timeouts", func(s *Shared) int64 { return s.Timeouts }),
	leaseHeld(),
	sharedCount("capacity_bytes", func(s *Shared) int64 { return s.CapacityBytes }),
	sharedCount("used_bytes", func(s *Shared) int64 { return s.UsedBytes }),
	sharedCount("evicted_blocks", func(s *Shared) int64 { return s.EvictedBlocks }),
	sharedCount("journal_names", func(s *Shared) int64 { return s.JournalNames }),
	sharedCount("journal_fallbacks", func(s *Shared) int64 { return s.JournalFallbacks }),
}
