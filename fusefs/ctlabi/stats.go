package ctlabi

import (
	"strconv"
	"unicode"
	"unicode/utf8"
)

// FSName is the name a mount gives FUSE; FSType is the filesystem type the
// mount table (/proc/self/mountinfo) shows for it.
const (
	FSName = "kvtierfs"
	FSType = "fuse." + FSName
)

// Names in the control directory.
const (
	// Dir is the control directory at the mount root.
	Dir = ".kvtier"
	// StatsFile is the JSON stats file inside Dir.
	StatsFile = "stats.json"
	// MatchFile is the batched-match file inside Dir: write a request, then
	// read the answer on the same descriptor.
	MatchFile = "match"
)

// Stats is the content of stats.json, what `kvtierfs stat` shows. Every
// section's type is defined here: the implementation packages return plain
// stats of their own, and tiers/tier's Stats.Snapshot copies them in.
type Stats struct {
	Mountpoint string           `json:"mountpoint"`
	Disk       Disk             `json:"disk"`
	Groups     map[string]Group `json:"groups"`
	// Descriptors are the daemon's file descriptors now.
	Descriptors Descriptors `json:"descriptors"`
	Primary     Primary     `json:"primary"`
	Counters    Counters    `json:"counters"`
	// Staging describes wave staging; absent when it is disabled.
	Staging *Staging `json:"staging,omitempty"`
	// Shared describes the shared second level; absent without --shared.
	Shared *Shared `json:"shared,omitempty"`
	// Peers and Replication describe row mirroring; empty on a single node.
	Peers       []Peer       `json:"peers"`
	Replication *Replication `json:"replication,omitempty"`
	Warnings    []Warning    `json:"warnings"`
}

// Disk is the "disk" object of stats.json: the local store's occupancy now.
type Disk struct {
	// Store is the store directory.
	Store         string `json:"store"`
	Blocks        int64  `json:"blocks"`
	LogicalBytes  int64  `json:"logical_bytes"`
	PhysicalBytes int64  `json:"physical_bytes"`
	CapacityBytes int64  `json:"capacity_bytes"`
	FreeBytes     int64  `json:"free_bytes"`
	Evictions     int64  `json:"evictions"`
	InFlightTmp   int    `json:"inflight_tmp_files"`
	// TmpBytes is what the tmp files count against the capacity.
	TmpBytes int64 `json:"tmp_bytes"`
	// NeverLookedUp counts the blocks no lookup has found since the mount.
	NeverLookedUp int64 `json:"never_looked_up"`
	// RowBytes is the block size of each tier directory, by its name.
	RowBytes map[string]int64 `json:"row_bytes"`
	// StorePhases times the steps of stores' creates and renames, by step.
	StorePhases map[string]Phase `json:"store_phases"`
	// OtherFiles is the number of files outside the block layout the store
	// tracks, OtherFilesMax its bound, and OtherFilesUntracked those found
	// past it at mount, counted until the next start.
	OtherFiles          int64 `json:"other_files"`
	OtherFilesMax       int64 `json:"other_files_max"`
	OtherFilesUntracked int64 `json:"other_files_untracked"`
}

// Descriptors is the "descriptors" object of stats.json: the daemon's file
// descriptors now (internal/descriptors). Open is how many it holds, Limit
// its RLIMIT_NOFILE, Kept how many the engine's opens leave free for the
// daemon's own work: an open of a thread holding several files open through
// the mount is refused below Kept free, every open below three quarters of
// it (all 0 where they cannot be counted).
type Descriptors struct {
	Open  int64 `json:"open"`
	Limit int64 `json:"limit"`
	Kept  int64 `json:"kept"`
}

// Phase summarises the durations of one step of stores (tiers/disk.Phase).
type Phase struct {
	Count int64 `json:"count"`
	// MeanMicros, P50Micros and P99Micros are in microseconds; a percentile
	// is its bucket's upper bound.
	MeanMicros float64 `json:"mean_us"`
	P50Micros  float64 `json:"p50_us"`
	P99Micros  float64 `json:"p99_us"`
	// Buckets and SumSeconds are the histogram behind them, for metrics
	// only: Buckets[i] counts the durations up to tiers/disk.PhaseBucketBound(i)
	// and longer than the bound before (the last takes everything longer).
	Buckets    []int64 `json:"-"`
	SumSeconds float64 `json:"-"`
}

// Group is one KV cache group's entry in the "groups" object: its blocks
// in the store and their bytes.
type Group struct {
	Blocks int64 `json:"blocks"`
	Bytes  int64 `json:"bytes"`
}

// Primary describes the engine's primary (shm) tier as seen from this node.
type Primary struct {
	Regions []Region `json:"regions"`
	// Ignored lists files matching --shm-glob that are not mapped (links,
	// other users' files), and why: the first few by name (tiers/shm.MaxIgnoredListed).
	Ignored []IgnoredFile `json:"ignored"`
	// IgnoredCount counts them all.
	IgnoredCount int `json:"ignored_count"`
}

// Region is one engine region: its geometry as inferred from the store's
// block size, and a warning when the two disagree.
type Region struct {
	Path     string `json:"path"`
	Size     int64  `json:"size_bytes"`
	Rows     int64  `json:"rows"`
	RowBytes int64  `json:"row_bytes"`
	Warning  string `json:"warning,omitempty"`
}

// IgnoredFile is a file matching --shm-glob that is not mapped, and why.
type IgnoredFile struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
}

// Counters are the event counts since the mount.
type Counters struct {
	Lookups    int64 `json:"lookups"`
	LookupHits int64 `json:"lookup_hits"`
	Reads      int64 `json:"reads"`
	ReadBytes  int64 `json:"read_bytes"`
	Writes     int64 `json:"writes"`
	WriteBytes int64 `json:"write_bytes"`
	// ChecksumFailures counts blocks that failed verification, and were
	// removed, whose file shows no change since the daemon last saw it (the
	// disk changed its bytes); BlocksChangedOutside those whose file did
	// change (a write into the store tree, not counted in ChecksumFailures).
	ChecksumFailures     int64 `json:"checksum_failures"`
	BlocksChangedOutside int64 `json:"blocks_changed_outside"`
	NoSpace              int64 `json:"no_space"`
	// RejectedWrites counts block writes refused for the caller's request
	// (disk.Counters.RejectedWrites), not counted in StoreIOErrors.
	RejectedWrites int64 `json:"rejected_writes"`
	// LoadsFromStore, LoadsFromStaging and LoadsFromRow count loads by
	// where their bytes came from: read from the store while the load's
	// reads are served, staged ahead, or copied from a row of the engine's
	// region that still held the block (no disk read). LoadsRefused counts
	// opens that failed (vanished block, too many bytes open) and loads of a
	// block that failed verification (corrupt), LoadsUnmirrored loads
	// whose read failed because a peer did not acknowledge their row.
	LoadsFromStore   int64 `json:"loads_from_store"`
	LoadsFromStaging int64 `json:"loads_from_staging"`
	LoadsFromRow     int64 `json:"loads_from_row"`
	// LoadsInPlace counts the loads from the store served from its mapped
	// file under a read lease (a store in memory), with no copy;
	// LoadsRemapped those of them that found the block mapped and proven by
	// an earlier load or by its store, so neither mapped nor checked it
	// again; LoadsProvenAtStore those of them proven by its store (written
	// through the daemon under a write lease held since), so that not even
	// the block's first load checked it.
	LoadsInPlace       int64 `json:"loads_in_place"`
	LoadsRemapped      int64 `json:"loads_remapped"`
	LoadsProvenAtStore int64 `json:"loads_proven_at_store"`
	LoadsRefused       int64 `json:"loads_refused"`
	LoadsUnmirrored    int64 `json:"loads_unmirrored"`
	// RowsMirrored counts loaded rows every peer acknowledged; LookupsWithheld
	// present blocks answered absent while mirroring was impossible.
	RowsMirrored    int64 `json:"rows_mirrored"`
	LookupsWithheld int64 `json:"lookups_withheld"`
	// BudgetChainsCapped counts lookup batches the lookup budget cut short
	// (more present keys than the primary tier could promote at once),
	// BudgetKeysWithheld the present blocks it answered absent.
	BudgetChainsCapped int64 `json:"budget_chains_capped"`
	BudgetKeysWithheld int64 `json:"budget_keys_withheld"`
	// Matches counts batched match requests answered through .kvtier/match.
	Matches      int64 `json:"matches"`
	AuthFailures int64 `json:"auth_failures"`
	// HandshakesEvicted counts peer handshakes closed before they finished
	// to make room at a flooded listener: this node's listener's, and this
	// node's handshakes its peers' listeners closed.
	HandshakesEvicted int64 `json:"handshakes_evicted"`
	// RowsLate counts rows from peers that arrived after their deadline
	// (RowWrite.CommitBy) and were not written: the sender had failed or
	// was about to fail the load.
	RowsLate int64 `json:"rows_late"`
	// UnprovenBlocks, TmpsExpired and PublishRefused are the store's
	// (disk.Counters); ShmIgnored counts files under --shm-glob refused and
	// ShmFaults regions dropped because they shrank under their mapping.
	UnprovenBlocks int64 `json:"unproven_blocks"`
	TmpsExpired    int64 `json:"tmps_expired"`
	PublishRefused int64 `json:"publish_refused"`
	// StoreIOErrors counts reads and writes the store filesystem failed.
	StoreIOErrors int64 `json:"store_io_errors"`
	// StoresFromRow and StoresReadBack count passthrough stores whose digest
	// came from the engine's row, and those whose tmp file was read back.
	StoresFromRow  int64 `json:"stores_from_row"`
	StoresReadBack int64 `json:"stores_read_back"`
	// OtherFilesRefused counts writes outside the block layout refused with
	// EDQUOT: the store tracked disk.Stats.OtherFilesMax such files.
	OtherFilesRefused int64 `json:"other_files_refused"`
	// OpensRefused counts opens through the mount refused with ENFILE to
	// keep descriptors for the daemon's own work (Descriptors.Kept).
	OpensRefused int64 `json:"opens_refused"`
	ShmIgnored   int64 `json:"shm_ignored"`
	ShmFaults    int64 `json:"shm_faults"`
	// KVEventsPublished counts removed blocks published as BlockRemoved KV
	// events, KVEventsDropped those dropped because the publisher's queue was
	// full (both 0 without --kv-events-endpoint).
	KVEventsPublished int64 `json:"kv_events_published"`
	KVEventsDropped   int64 `json:"kv_events_dropped"`
	// TiersPrimed counts the times the lookup helper was asked to look a
	// tier's prefix names up ahead of the engine, NamesPrimed the names it
	// looked up (both 0 without --prime-lookups or with --shared).
	TiersPrimed int64 `json:"tiers_primed"`
	NamesPrimed int64 `json:"names_primed"`
}

// Staging is the "staging" object of stats.json: wave staging's RAM cache.
type Staging struct {
	// BudgetBytes is the staging budget.
	BudgetBytes int64 `json:"budget_bytes"`
	// Bytes is the size of the verified blocks staged now, ready to serve.
	Bytes int64 `json:"bytes"`
	// Chains is the number of chains streaming now: holding staged blocks or
	// fetches in flight.
	Chains int `json:"chains"`
	// Waves counts the times a chain holding nothing started staging.
	Waves int64 `json:"waves"`
	// Hits counts loads (Take) served from staging.
	Hits int64 `json:"hits"`
	// Misses counts loads (Take) of blocks that were not staged.
	Misses int64 `json:"misses"`
	// Late counts the misses of blocks queued for staging whose fetch had not
	// started: staging foresaw the load but ran behind the engine.
	Late int64 `json:"late"`
	// WastedBytes counts bytes fetched for staging that never served a load:
	// evicted, invalidated, discarded on arrival or left at Close.
	WastedBytes int64 `json:"wasted_bytes"`
}

// Shared is the "shared" object of stats.json, the shared second level's
// state (DESIGN.md "The shared level").
type Shared struct {
	// Dir is the shared store; Reachable is false while it does not answer
	// within --shared-timeout.
	Dir       string `json:"dir"`
	Reachable bool   `json:"reachable"`
	// QueueBlocks and QueueBytes wait to be written behind; BytesBehind
	// counts them and the write in progress.
	QueueBlocks   int64 `json:"queue_blocks"`
	QueueBytes    int64 `json:"queue_bytes"`
	BytesBehind   int64 `json:"bytes_behind"`
	WrittenBlocks int64 `json:"written_blocks"`
	WrittenBytes  int64 `json:"written_bytes"`
	// DroppedBlocks left the full queue unwritten.
	DroppedBlocks   int64   `json:"dropped_blocks"`
	FetchedBlocks   int64   `json:"fetched_blocks"`
	FetchedBytes    int64   `json:"fetched_bytes"`
	FetchSecondsAvg float64 `json:"fetch_seconds_avg"`
	Lookups         int64   `json:"lookups"`
	LookupHits      int64   `json:"lookup_hits"`
	NegativeHits    int64   `json:"negative_hits"`
	CorruptDropped  int64   `json:"corrupt_dropped"`
	Timeouts        int64   `json:"timeouts"`
	// LeaseHolder holds the lease of the shared store's eviction; LeaseHeld
	// is true when that is this node.
	LeaseHolder   string `json:"lease_holder"`
	LeaseHeld     bool   `json:"lease_held"`
	CapacityBytes int64  `json:"capacity_bytes"`
	UsedBytes     int64  `json:"used_bytes"`
	EvictedBlocks int64  `json:"evicted_blocks"`
	// JournalNames are the names the journal holds; JournalFallbacks the
	// lookups it could not answer, which went to the listings.
	JournalNames     int64 `json:"journal_names"`
	JournalFallbacks int64 `json:"journal_fallbacks"`
}

// Peer is one entry of the "peers" array: a peer of row mirroring. RowsSent
// and Bytes count rows (and their non-zero bytes) written to the peer,
// Verified the rows it acknowledged with the right CRC32C, RowsReceived
// the rows received from the peer's address.
type Peer struct {
	Addr         string `json:"addr"`
	State        string `json:"state"`
	RowsSent     uint64 `json:"rows_sent"`
	RowsReceived uint64 `json:"rows_received"`
	Bytes        uint64 `json:"bytes"`
	LastError    string `json:"last_error"`
	Verified     uint64 `json:"verified"`
}

// The State of a Peer.
const (
	// PeerConnecting: not connected yet since the mount.
	PeerConnecting = "connecting"
	// PeerUp: an authenticated connection, no failure since.
	PeerUp = "up"
	// PeerDown: the last connection or attempt failed; retrying.
	PeerDown = "down"
	// PeerInbound: an address that sent rows but is not a configured peer.
	PeerInbound = "inbound"
	// PeerSelf: the entry of the peer list that is this node itself, skipped.
	PeerSelf = "self"
)

// Serving reports whether the entry keeps nothing from being mirrored: a
// peer that is up, one that only sends rows here, or this node itself.
func (p Peer) Serving() bool {
	return p.State == PeerUp || p.State == PeerInbound || p.State == PeerSelf
}

// Replication is the "replication" object of stats.json: whether rows are
// mirrored (--replicated-kv) and on what evidence. Samples counts identical
// store samples, Mismatches differing ones, and FirstMismatch describes the
// first of those (in auto it is also DecidedBy).
type Replication struct {
	Mode          string `json:"mode"`
	Allowed       bool   `json:"allowed"`
	DecidedBy     string `json:"decided_by"`
	Samples       uint64 `json:"samples"`
	Mismatches    uint64 `json:"mismatches"`
	FirstMismatch string `json:"first_mismatch,omitempty"`
}

// Warning codes: the Code of each warning stats.json can list. Each is
// exported as kvtierfs_warning{code}, 0 while it is not raised, so alerts
// and dashboards can name them before they ever fire.
const (
	// WarnChecksumFailures: blocks failed their checksum and were removed,
	// their file unchanged since the daemon last saw it.
	WarnChecksumFailures = "checksum_failures"
	// WarnChangedOutside: blocks whose file was changed in the store tree
	// failed their checksum and were removed.
	WarnChangedOutside = "changed_outside"
	// WarnNoSpace: stores were refused with ENOSPC.
	WarnNoSpace = "no_space"
	// WarnStoreIOErrors: the store filesystem failed reads or writes.
	WarnStoreIOErrors = "store_io_errors"
	// WarnUnprovenBlocks: block files found at mount had no digest record.
	WarnUnprovenBlocks = "unproven_blocks"
	// WarnOtherFilesFull: writes outside the block layout were refused
	// because the store tracks as many such files as it may.
	WarnOtherFilesFull = "other_files_full"
	// WarnShmUnmappable: the engine's regions could not be listed or mapped.
	WarnShmUnmappable = "shm_unmappable"
	// WarnShmIgnored: a file matching --shm-glob is not mapped.
	WarnShmIgnored = "shm_ignored"
	// WarnShmGeometry: a region's rows do not match the store's block size.
	WarnShmGeometry = "shm_geometry"
	// WarnPeerDown: a peer's link is down, so rows cannot be mirrored.
	WarnPeerDown = "peer_down"
	// WarnMirroringOff: --replicated-kv turned row mirroring off.
	WarnMirroringOff = "mirroring_off"
	// WarnSharedUnreachable: the shared level does not answer.
	WarnSharedUnreachable = "shared_unreachable"
	// WarnSharedBehind: write-behind to the shared level does not keep up.
	WarnSharedBehind = "shared_behind"
	// WarnWriteOnlyGroup: a KV group is stored but never read while other
	// groups of the same tier are read (EAGLE store filter, DESIGN §3.1).
	WarnWriteOnlyGroup = "write_only_group"
	// WarnHashSeedDrift: lookups find almost nothing, the store holds many
	// blocks never looked up and new ones keep arriving: the engines' block
	// hashes differ (hash algorithm, or PYTHONHASHSEED with xxhash).
	WarnHashSeedDrift = "hash_seed_drift"
	// WarnPrimaryTierExhausted: keys answer present but are not read, as
	// many as the primary region has rows (DESIGN §3.3).
	WarnPrimaryTierExhausted = "primary_tier_exhausted"
	// WarnWriteOnlyTier: many bytes written to the tier, none read.
	WarnWriteOnlyTier = "write_only_tier"
	// WarnLookupBudgetCapped: the lookup budget cut prefixes longer than
	// the primary tier can promote at once (issue 23).
	WarnLookupBudgetCapped = "lookup_budget_capped"
	// WarnDescriptorsLow: the daemon holds nearly all the file descriptors
	// its limit allows, or refused opens to keep those its own work needs.
	WarnDescriptorsLow = "descriptors_low"
)

// WarningCodes lists every Warn* code, in the order metrics export them.
var WarningCodes = []string{
	WarnChecksumFailures, WarnNoSpace, WarnStoreIOErrors, WarnUnprovenBlocks, WarnOtherFilesFull,
	WarnShmUnmappable, WarnShmIgnored, WarnShmGeometry, WarnPeerDown, WarnMirroringOff,
	WarnSharedUnreachable, WarnSharedBehind,
	WarnWriteOnlyGroup, WarnWriteOnlyTier, WarnHashSeedDrift, WarnPrimaryTierExhausted, WarnLookupBudgetCapped,
	WarnDescriptorsLow, WarnChangedOutside,
}

// Warning is a known failure the operator should act on: its code and a
// message with the evidence and what to do.
type Warning struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Printable is text someone else may have chosen (a file name in /dev/shm,
// a process name, a message quoting them) as human output shows it: as it
// is when it is valid UTF-8 of printable runes, otherwise quoted with
// escapes (strconv.Quote), so that it carries no terminal escape sequence
// or other control byte to the reader.
func Printable(text string) string {
	if !utf8.ValidString(text) {
		return strconv.Quote(text)
	}
	for _, r := range text {
		if !unicode.IsPrint(r) {
			return strconv.Quote(text)
		}
	}
	return text
}
