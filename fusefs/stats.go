package fusefs

import (
	"fmt"
	"sort"

	"github.com/kvtierfs/kvtierfs/staging"
	"github.com/kvtierfs/kvtierfs/sync/rowsync"
	"github.com/kvtierfs/kvtierfs/tiers/disk"
	"github.com/kvtierfs/kvtierfs/tiers/shared"
	"github.com/kvtierfs/kvtierfs/tiers/shm"
)

// Stats is what `kvtierfs stat` shows, served as MOUNTPOINT/.kvtier/stats.json.
type Stats struct {
	Mountpoint string                     `json:"mountpoint"`
	Disk       disk.Stats                 `json:"disk"`
	Groups     map[string]disk.GroupStats `json:"groups"`
	Primary    Primary                    `json:"primary"`
	Counters   Counters                   `json:"counters"`
	// Staging describes wave staging; absent when it is disabled.
	Staging *staging.Stats `json:"staging,omitempty"`
	// Shared describes the shared second level; absent without --shared.
	Shared *shared.Stats `json:"shared,omitempty"`
	// Peers and Replication describe row mirroring; empty on a single node.
	Peers       []rowsync.PeerStats   `json:"peers"`
	Replication *rowsync.GateSnapshot `json:"replication,omitempty"`
	Warnings    []Warning             `json:"warnings"`
}

// Primary describes the engine's primary (shm) tier as seen from this node.
type Primary struct {
	Regions []shm.Info `json:"regions"`
	// Ignored lists files matching --shm-glob that are not mapped (links,
	// other users' files), and why.
	Ignored []shm.Ignored `json:"ignored"`
}

// Counters are the event counts since the mount.
type Counters struct {
	Lookups          int64 `json:"lookups"`
	LookupHits       int64 `json:"lookup_hits"`
	Reads            int64 `json:"reads"`
	ReadBytes        int64 `json:"read_bytes"`
	Writes           int64 `json:"writes"`
	WriteBytes       int64 `json:"write_bytes"`
	ChecksumFailures int64 `json:"checksum_failures"`
	NoSpace          int64 `json:"no_space"`
	RejectedWrites   int64 `json:"rejected_writes"`
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
	LoadsRefused     int64 `json:"loads_refused"`
	LoadsUnmirrored  int64 `json:"loads_unmirrored"`
	// RowsMirrored counts loaded rows every peer acknowledged; LookupsWithheld
	// present blocks answered absent while mirroring was impossible.
	RowsMirrored    int64 `json:"rows_mirrored"`
	LookupsWithheld int64 `json:"lookups_withheld"`
	// Matches counts batched match requests answered through .kvtier/match.
	Matches      int64 `json:"matches"`
	AuthFailures int64 `json:"auth_failures"`
	// UnprovenBlocks, TmpsExpired and PublishRefused are the store's
	// (disk.Counters); ShmIgnored counts files under --shm-glob refused and
	// ShmFaults regions dropped because they shrank under their mapping.
	UnprovenBlocks int64 `json:"unproven_blocks"`
	TmpsExpired    int64 `json:"tmps_expired"`
	PublishRefused int64 `json:"publish_refused"`
	// StoreIOErrors counts reads and writes the store filesystem failed.
	// StoresFromRow and StoresReadBack count passthrough stores whose digest
	// came from the engine's row, and those whose tmp file was read back.
	StoresFromRow  int64 `json:"stores_from_row"`
	StoresReadBack int64 `json:"stores_read_back"`
	StoreIOErrors  int64 `json:"store_io_errors"`
	ShmIgnored     int64 `json:"shm_ignored"`
	ShmFaults      int64 `json:"shm_faults"`
	// KVEventsPublished counts removed blocks published as BlockRemoved KV
	// events, KVEventsDropped those dropped because the publisher's queue was
	// full (both 0 without --kv-events-endpoint).
	KVEventsPublished int64 `json:"kv_events_published"`
	KVEventsDropped   int64 `json:"kv_events_dropped"`
}

// Warning is a known failure the operator should act on: the mount's own and
// the field diagnostics' (staging.Warning) are one type.
type Warning = staging.Warning

// Stats takes a snapshot of the mount's state.
func (f *FS) Stats() Stats {
	d := f.store.Stats()
	c := f.store.Counters()
	st := Stats{
		Mountpoint: f.mountpoint,
		Disk:       d,
		Groups:     d.Groups,
		Counters: Counters{
			Lookups:          c.Lookups.Load(),
			LookupHits:       c.LookupHits.Load(),
			Reads:            c.Reads.Load(),
			ReadBytes:        c.ReadBytes.Load(),
			Writes:           c.Writes.Load(),
			WriteBytes:       c.WriteBytes.Load(),
			ChecksumFailures: c.ChecksumFailures.Load(),
			NoSpace:          c.NoSpace.Load(),
			RejectedWrites:   c.RejectedWrites.Load(),
			LoadsFromStore:   f.loads.Counters.FromStore.Load(),
			LoadsFromStaging: f.loads.Counters.FromStaging.Load(),
			LoadsFromRow:     f.loads.Counters.FromRow.Load(),
			LoadsRefused:     f.loads.Counters.Refused.Load(),
			LoadsUnmirrored:  f.loads.Counters.MirrorFailures.Load(),
			UnprovenBlocks:   c.UnprovenBlocks.Load(),
			TmpsExpired:      c.TmpsExpired.Load(),
			PublishRefused:   c.PublishRefused.Load(),
			StoreIOErrors:    c.IOErrors.Load(),
			StoresFromRow:    c.StoresFromRow.Load(),
			StoresReadBack:   c.StoresReadBack.Load(),
		},
		Peers:    []rowsync.PeerStats{},
		Warnings: []Warning{},
	}
	st.Counters.LookupsWithheld = f.lookupsWithheld.Load()
	st.Counters.Matches = f.matches.Load()
	st.Counters.KVEventsPublished, st.Counters.KVEventsDropped = f.kvEvents.Counts()
	if f.stager != nil {
		ss := f.stager.Stats()
		st.Staging = &ss
	}
	if f.shared != nil {
		ss := f.shared.Stats()
		st.Shared = &ss
		st.Warnings = append(st.Warnings, sharedWarnings(ss)...)
	}
	if f.sync != nil {
		snap := f.sync.Snapshot()
		st.Peers = snap.Peers
		st.Replication = &snap.Replication
		st.Counters.RowsMirrored = int64(snap.RowsMirrored)
		st.Counters.AuthFailures = int64(snap.AuthFailures)
		st.Warnings = append(st.Warnings, syncWarnings(snap)...)
	}
	if f.regions != nil {
		if err := f.regions.Refresh(); err != nil {
			st.Warnings = append(st.Warnings, Warning{Code: "shm_unmappable", Message: err.Error()})
		}
		st.Primary.Regions = f.regions.Infos(rowSizes(d.RowBytes))
		st.Primary.Ignored = f.regions.Ignored()
		st.Counters.ShmIgnored = f.regions.IgnoredTotal()
		st.Counters.ShmFaults = f.regions.Faults()
	}
	if st.Primary.Regions == nil {
		st.Primary.Regions = []shm.Info{}
	}
	if st.Primary.Ignored == nil {
		st.Primary.Ignored = []shm.Ignored{}
	}
	for _, ig := range st.Primary.Ignored {
		st.Warnings = append(st.Warnings, Warning{Code: "shm_ignored", Message: fmt.Sprintf(
			"%s matches --shm-glob but is not mapped (%s): the engine's regions are regular files owned by root or the engine's uid", ig.Path, ig.Reason)})
	}
	if st.Counters.UnprovenBlocks > 0 {
		st.Warnings = append(st.Warnings, Warning{Code: "unproven_blocks", Message: fmt.Sprintf(
			"%d block files found at mount had no digest record bound to their name and were not indexed (copied or restored without xattrs, or another block's record): they answer absent; remove them or restore them with their xattrs",
			st.Counters.UnprovenBlocks)})
	}
	for _, r := range st.Primary.Regions {
		if r.RowBytes == 0 && len(d.RowBytes) > 0 {
			st.Warnings = append(st.Warnings, Warning{Code: "shm_geometry", Message: fmt.Sprintf("%s: %s", r.Path, r.Warning)})
		}
	}
	primaryRows := 0
	for _, r := range st.Primary.Regions {
		primaryRows = max(primaryRows, int(r.Rows))
	}
	st.Warnings = append(st.Warnings, f.diagnostics.Warnings(staging.StoreState{Blocks: d.Blocks, NeverLookedUp: d.NeverLookedUp, PrimaryRows: primaryRows})...)
	if st.Counters.ChecksumFailures > 0 {
		st.Warnings = append(st.Warnings, Warning{Code: "checksum_failures", Message: fmt.Sprintf(
			"%d blocks failed their checksum and were removed (the engine recomputes them): check the store disk (dmesg, smartctl)",
			st.Counters.ChecksumFailures)})
	}
	if st.Counters.NoSpace > 0 {
		st.Warnings = append(st.Warnings, Warning{Code: "no_space", Message: noSpaceMessage(st.Counters.NoSpace, d)})
	}
	if st.Counters.StoreIOErrors > 0 {
		st.Warnings = append(st.Warnings, Warning{Code: "store_io_errors", Message: fmt.Sprintf(
			"%d reads or writes failed in the store filesystem itself (the log names each errno): a full filesystem refuses stores with ENOSPC, a failing disk fails loads and stores with EIO; check df, dmesg and smartctl",
			st.Counters.StoreIOErrors)})
	}
	return st
}

// noSpaceMessage explains ENOSPC refusals: by tmp files not yet renamed
// (killed writers leave them until they expire) or by protected blocks.
func noSpaceMessage(refused int64, d disk.Stats) string {
	if d.InFlightTmp > 0 {
		return fmt.Sprintf("%d writes failed with ENOSPC; %d bytes are held by %d tmp files not yet renamed (a writer killed before its rename leaves one, removed %s after its close), the rest by protected blocks: raise --capacity or lower --lookup-protect",
			refused, d.TmpBytes, d.InFlightTmp, disk.DefaultTmpMaxAge)
	}
	return fmt.Sprintf("%d writes failed with ENOSPC because the store filesystem is full or every block was protected: free space there (df), raise --capacity or lower --lookup-protect", refused)
}

// syncWarnings names what keeps rows from being mirrored.
func syncWarnings(snap rowsync.Snapshot) []Warning {
	var out []Warning
	for _, p := range snap.Peers {
		if p.State != rowsync.StateUp && p.State != rowsync.StateInbound {
			out = append(out, Warning{Code: "peer_down", Message: fmt.Sprintf(
				"peer %s is %s (%s): lookups answer absent and loads fail until it is back; check the peer daemon and the network",
				p.Addr, p.State, p.LastError)})
		}
	}
	if r := snap.Replication; len(snap.Peers) > 0 && !r.Allowed {
		out = append(out, Warning{Code: "mirroring_off", Message: fmt.Sprintf(
			"row mirroring is off (--replicated-kv %s: %s; %d samples, %d mismatches): only this node's rank can load from the tier",
			r.Mode, r.DecidedBy, r.Samples, r.Mismatches)})
	}
	return out
}

// rowSizes lists the distinct block sizes of the store's tiers.
func rowSizes(byTier map[string]int64) []int64 {
	seen := map[int64]bool{}
	var out []int64
	for _, v := range byTier {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}
