package tier

import (
	"fmt"
	"time"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
	"github.com/kvtierfs/kvtierfs/internal/descriptors"
	"github.com/kvtierfs/kvtierfs/staging"
	"github.com/kvtierfs/kvtierfs/staging/diagnose"
	"github.com/kvtierfs/kvtierfs/staging/lookupbudget"
	"github.com/kvtierfs/kvtierfs/sync/rowsync"
	"github.com/kvtierfs/kvtierfs/tiers/disk"
	"github.com/kvtierfs/kvtierfs/tiers/shared"
	"github.com/kvtierfs/kvtierfs/tiers/shm"
)

// StoreStats is the block store as stats.json reads it (*disk.Store).
type StoreStats interface {
	Stats() disk.Stats
	Counters() *disk.Counters
}

// BudgetStats is the lookup budget as stats.json reads it (*lookupbudget.Budget).
type BudgetStats interface {
	Stats() lookupbudget.Stats
}

// StagerStats is staging as stats.json reads it (*staging.Stager).
type StagerStats interface {
	Stats() staging.Stats
}

// SharedStats is the shared level as stats.json reads it (*shared.Level).
type SharedStats interface {
	Stats() shared.Stats
}

// SyncStats is row mirroring as stats.json reads it (*rowsync.Node).
type SyncStats interface {
	Snapshot() rowsync.Snapshot
}

// RegionStats are the engine's shm regions as stats.json reads them (*shm.Set).
type RegionStats interface {
	Regions
	// Refresh maps the regions that appeared since the last look.
	Refresh() error
	// Ignored lists files that match the regions' glob but are not mapped;
	// IgnoredNow counts them, IgnoredTotal every one ignored since the mount.
	Ignored() []shm.Ignored
	IgnoredNow() int
	IgnoredTotal() int64
	// Faults counts the regions' pages that faulted.
	Faults() int64
}

// PrimerStats is the primer as stats.json reads it (*prime.Helper).
type PrimerStats interface {
	// Looked is how many names the primer looked up.
	Looked() int64
}

// KVEventStats are KV events as stats.json reads them (*kvevents.Publisher).
type KVEventStats interface {
	Counts() (published, dropped int64)
}

// DescriptorStats are the daemon's file descriptors as stats.json reads
// them (*descriptors.Reserve).
type DescriptorStats interface {
	// Count is how many descriptors the daemon holds and its limit.
	Count() (open, limit int, err error)
	// Refused counts the engine's opens refused to keep descriptors for
	// the daemon's own work.
	Refused() int64
}

// Warner names the field failures the diagnostics' counts show now
// (*diagnose.Diagnostics).
type Warner interface {
	Warnings(st diagnose.StoreState) []ctlabi.Warning
}

// StatsConfig is what a mount's stats.json is assembled from; every field
// but Store and Tier may be nil.
type StatsConfig struct {
	Mountpoint  string
	Store       StoreStats
	Tier        *Tier
	Budget      BudgetStats
	Stager      StagerStats
	Shared      SharedStats
	Sync        SyncStats
	Regions     RegionStats
	Primer      PrimerStats
	KVEvents    KVEventStats
	Diagnostics Warner
	// WarningWindow is how long a warning raised by a counter stays after
	// the counter last grew; 0 means diagnose.DefaultWindow.
	WarningWindow time.Duration
	// Now is the clock of those windows; nil means time.Now.
	Now func() time.Time
	// Descriptors are the daemon's file descriptors; nil reports none.
	Descriptors DescriptorStats
}

// Stats assembles a mount's stats.json: the one place that copies each
// part's plain stats into its ctlabi section and raises every warning
// (those of staging/diagnose included).
type Stats struct {
	cfg StatsConfig
	// recent clears the counters' warnings once they stop growing.
	recent *diagnose.Recent
}

// NewStats makes the assembler of the parts cfg names.
func NewStats(cfg StatsConfig) *Stats {
	return &Stats{cfg: cfg, recent: diagnose.NewRecent(cfg.WarningWindow, cfg.Now)}
}

// Snapshot takes a snapshot of the mount's state. mount holds the counters
// the mount keeps itself (fusefs: its loads, the tiers it primed); Snapshot
// fills in every other.
func (s *Stats) Snapshot(mount ctlabi.Counters) ctlabi.Stats {
	d := s.cfg.Store.Stats()
	c := s.cfg.Store.Counters()
	st := ctlabi.Stats{
		Mountpoint: s.cfg.Mountpoint,
		Disk:       abiDisk(d),
		Groups:     make(map[string]ctlabi.Group, len(d.Groups)),
		Counters:   mount,
		Peers:      []ctlabi.Peer{},
		Warnings:   []ctlabi.Warning{},
	}
	counters := &st.Counters
	counters.Lookups = c.Lookups.Load()
	counters.LookupHits = c.LookupHits.Load()
	counters.Reads = c.Reads.Load()
	counters.ReadBytes = c.ReadBytes.Load()
	counters.Writes = c.Writes.Load()
	counters.WriteBytes = c.WriteBytes.Load()
	counters.ChecksumFailures = c.ChecksumFailures.Load()
	counters.BlocksChangedOutside = c.ChangedOutside.Load()
	counters.NoSpace = c.NoSpace.Load()
	counters.RejectedWrites = c.RejectedWrites.Load()
	counters.UnprovenBlocks = c.UnprovenBlocks.Load()
	counters.TmpsExpired = c.TmpsExpired.Load()
	counters.PublishRefused = c.PublishRefused.Load()
	counters.StoreIOErrors = c.IOErrors.Load()
	counters.StoresFromRow = c.StoresFromRow.Load()
	counters.StoresReadBack = c.StoresReadBack.Load()
	for group, g := range d.Groups {
		st.Groups[group] = ctlabi.Group(g)
	}
	counters.OtherFilesRefused = c.OtherFilesRefused.Load()
	counters.LookupsWithheld = s.cfg.Tier.LookupsWithheld()
	if p := s.cfg.Primer; p != nil {
		counters.NamesPrimed = p.Looked()
	}
	counters.Matches = s.cfg.Tier.Matches()
	if budget := s.cfg.Budget; budget != nil {
		b := budget.Stats()
		counters.BudgetChainsCapped, counters.BudgetKeysWithheld = b.ChainsCapped, b.KeysWithheld
		if b.ChainsCapped > 0 {
			st.Warnings = append(st.Warnings, budgetWarning(b))
		}
	}
	if k := s.cfg.KVEvents; k != nil {
		counters.KVEventsPublished, counters.KVEventsDropped = k.Counts()
	}
	if stager := s.cfg.Stager; stager != nil {
		ss := ctlabi.Staging(stager.Stats())
		st.Staging = &ss
	}
	if sh := s.cfg.Shared; sh != nil {
		ss := sh.Stats()
		st.Shared = abiShared(ss)
		st.Warnings = append(st.Warnings, sharedWarnings(ss)...)
	}
	if sync := s.cfg.Sync; sync != nil {
		snap := sync.Snapshot()
		for _, p := range snap.Peers {
			st.Peers = append(st.Peers, ctlabi.Peer(p))
		}
		replication := ctlabi.Replication(snap.Replication)
		st.Replication = &replication
		counters.RowsMirrored = int64(snap.RowsMirrored)
		counters.AuthFailures = int64(snap.AuthFailures)
		counters.HandshakesEvicted = int64(snap.HandshakesEvicted)
		counters.RowsLate = int64(snap.RowsLate)
		st.Warnings = append(st.Warnings, syncWarnings(snap)...)
	}
	if regions := s.cfg.Regions; regions != nil {
		if err := regions.Refresh(); err != nil {
			st.Warnings = append(st.Warnings, ctlabi.Warning{Code: ctlabi.WarnShmUnmappable, Message: err.Error()})
		}
		for _, r := range regions.Infos(RowSizes(d.RowBytes)) {
			st.Primary.Regions = append(st.Primary.Regions, ctlabi.Region(r))
		}
		for _, ig := range regions.Ignored() {
			st.Primary.Ignored = append(st.Primary.Ignored, ctlabi.IgnoredFile(ig))
		}
		st.Primary.IgnoredCount = regions.IgnoredNow()
		counters.ShmIgnored = regions.IgnoredTotal()
		counters.ShmFaults = regions.Faults()
	}
	if st.Primary.Regions == nil {
		st.Primary.Regions = []ctlabi.Region{}
	}
	if st.Primary.Ignored == nil {
		st.Primary.Ignored = []ctlabi.IgnoredFile{}
	}
	if ig := st.Primary.Ignored; len(ig) == 1 && st.Primary.IgnoredCount == 1 {
		st.Warnings = append(st.Warnings, ctlabi.Warning{Code: ctlabi.WarnShmIgnored, Message: fmt.Sprintf(
			"%s matches --shm-glob but is not mapped (%s): the engine's regions are regular files owned by root or the engine's uid",
			ctlabi.Printable(ig[0].Path), ig[0].Reason)})
	} else if len(ig) > 0 {
		st.Warnings = append(st.Warnings, ctlabi.Warning{Code: ctlabi.WarnShmIgnored, Message: fmt.Sprintf(
			"%d files match --shm-glob but are not mapped, %s among them (%s): the engine's regions are regular files owned by root or the engine's uid",
			st.Primary.IgnoredCount, ctlabi.Printable(ig[0].Path), ig[0].Reason)})
	}
	if counters.UnprovenBlocks > 0 {
		st.Warnings = append(st.Warnings, ctlabi.Warning{Code: ctlabi.WarnUnprovenBlocks, Message: fmt.Sprintf(
			"%s found at mount had no digest record bound to their name and were not indexed (copied or restored without xattrs, or another block's record): they answer absent; remove them or restore them with their xattrs",
			plural(counters.UnprovenBlocks, "block file"))})
	}
	for _, r := range st.Primary.Regions {
		if r.RowBytes == 0 && len(d.RowBytes) > 0 {
			st.Warnings = append(st.Warnings, ctlabi.Warning{Code: ctlabi.WarnShmGeometry, Message: fmt.Sprintf("%s: %s", ctlabi.Printable(r.Path), r.Warning)})
		}
	}
	primaryRows := 0
	for _, r := range st.Primary.Regions {
		primaryRows = max(primaryRows, int(r.Rows))
	}
	if diagnostics := s.cfg.Diagnostics; diagnostics != nil {
		st.Warnings = append(st.Warnings, diagnostics.Warnings(diagnose.StoreState{Blocks: d.Blocks, NeverLookedUp: d.NeverLookedUp, PrimaryRows: primaryRows})...)
	}
	quiet := s.recent.Window()
	if n, recent := s.recent.Grew(ctlabi.WarnChecksumFailures, counters.ChecksumFailures); recent {
		st.Warnings = append(st.Warnings, ctlabi.Warning{Code: ctlabi.WarnChecksumFailures, Message: fmt.Sprintf(
			"%s failed their checksum and were removed (the engine recomputes them), their files unchanged since the daemon last saw them (inode and change time): check the store disk (dmesg, smartctl), or for a writable shared mapping of a store file made before its rename (such writes move no change time); clears after %s without one",
			plural(n, "block"), quiet)})
	}
	if n, recent := s.recent.Grew(ctlabi.WarnChangedOutside, counters.BlocksChangedOutside); recent {
		st.Warnings = append(st.Warnings, ctlabi.Warning{Code: ctlabi.WarnChangedOutside, Message: fmt.Sprintf(
			"%s failed their checksum and were removed (the engine recomputes them) after their files were changed outside the daemon (their inode or change time moved since it last saw them): something with the engine's uid writes into the store directory, or into a block through a file kept open after its rename; the log names each block; clears after %s without one",
			plural(n, "block"), quiet)})
	}
	if n, recent := s.recent.Grew(ctlabi.WarnNoSpace, counters.NoSpace); recent {
		st.Warnings = append(st.Warnings, ctlabi.Warning{Code: ctlabi.WarnNoSpace, Message: noSpaceMessage(n, d) + fmt.Sprintf("; clears after %s without one", quiet)})
	}
	if n, recent := s.recent.Grew(ctlabi.WarnOtherFilesFull, counters.OtherFilesRefused); recent {
		st.Warnings = append(st.Warnings, ctlabi.Warning{Code: ctlabi.WarnOtherFilesFull, Message: fmt.Sprintf(
			"%s outside the block layout failed with EDQUOT: the store tracks %d such files, its bound (%d untracked found at mount); remove files the engine does not need from the mount; clears after %s without one",
			plural(n, "write"), d.OtherFilesMax, d.OtherFilesUntracked, quiet)})
	}
	st.Descriptors, counters.OpensRefused = s.descriptors()
	if w, ok := s.descriptorsWarning(st.Descriptors, counters.OpensRefused); ok {
		st.Warnings = append(st.Warnings, w)
	}
	if n, recent := s.recent.Grew(ctlabi.WarnStoreIOErrors, counters.StoreIOErrors); recent {
		st.Warnings = append(st.Warnings, ctlabi.Warning{Code: ctlabi.WarnStoreIOErrors, Message: fmt.Sprintf(
			"%s failed in the store filesystem itself (the log names each errno): a full filesystem refuses stores with ENOSPC, a failing disk fails loads and stores with EIO; check df, dmesg and smartctl; clears after %s without one",
			plural(n, "read or write", "reads or writes"), quiet)})
	}
	return st
}

// abiDisk is the "disk" section of the store's stats.
func abiDisk(d disk.Stats) ctlabi.Disk {
	out := ctlabi.Disk{Store: d.Store, Blocks: d.Blocks, LogicalBytes: d.LogicalBytes, PhysicalBytes: d.PhysicalBytes,
		CapacityBytes: d.CapacityBytes, FreeBytes: d.FreeBytes, Evictions: d.Evictions, InFlightTmp: d.InFlightTmp,
		TmpBytes: d.TmpBytes, NeverLookedUp: d.NeverLookedUp, RowBytes: d.RowBytes, StorePhases: make(map[string]ctlabi.Phase, len(d.StorePhases)),
		OtherFiles: d.OtherFiles, OtherFilesMax: d.OtherFilesMax, OtherFilesUntracked: d.OtherFilesUntracked}
	for name, ph := range d.StorePhases {
		out.StorePhases[name] = ctlabi.Phase(ph)
	}
	return out
}

// abiShared is the "shared" section of the shared level's stats.
func abiShared(s shared.Stats) *ctlabi.Shared {
	return &ctlabi.Shared{Dir: s.Dir, Reachable: s.Reachable, QueueBlocks: s.QueueBlocks, QueueBytes: s.QueueBytes,
		BytesBehind: s.BytesBehind, WrittenBlocks: s.WrittenBlocks, WrittenBytes: s.WrittenBytes, DroppedBlocks: s.DroppedBlocks,
		FetchedBlocks: s.FetchedBlocks, FetchedBytes: s.FetchedBytes, FetchSecondsAvg: s.FetchSecondsAvg, Lookups: s.Lookups,
		LookupHits: s.LookupHits, NegativeHits: s.NegativeHits, CorruptDropped: s.CorruptDropped, Timeouts: s.Timeouts,
		LeaseHolder: s.LeaseHolder, LeaseHeld: s.LeaseHeld, CapacityBytes: s.CapacityBytes, UsedBytes: s.UsedBytes,
		EvictedBlocks: s.EvictedBlocks, JournalNames: s.JournalNames, JournalFallbacks: s.JournalFallbacks}
}

// noSpaceMessage explains ENOSPC refusals: by tmp files not yet renamed
// (killed writers leave them until they expire) or by protected blocks.
func noSpaceMessage(refused int64, d disk.Stats) string {
	if d.InFlightTmp > 0 {
		return fmt.Sprintf("%s failed with ENOSPC; %d bytes are held by %d tmp files not yet renamed (a writer killed before its rename leaves one, removed %s after its close), the rest by protected blocks: raise --capacity or lower --lookup-protect",
			plural(refused, "write"), d.TmpBytes, d.InFlightTmp, disk.DefaultTmpMaxAge)
	}
	return fmt.Sprintf("%s failed with ENOSPC because the store filesystem is full or every block was protected: free space there (df), raise --capacity or lower --lookup-protect", plural(refused, "write"))
}

// syncWarnings names what keeps rows from being mirrored.
func syncWarnings(snap rowsync.Snapshot) []ctlabi.Warning {
	var out []ctlabi.Warning
	others := 0
	for _, p := range snap.Peers {
		if p.State != rowsync.StateSelf {
			others++
		}
		if !p.Serving() {
			out = append(out, ctlabi.Warning{Code: ctlabi.WarnPeerDown, Message: fmt.Sprintf(
				"peer %s is %s (%s): lookups answer absent and loads fail until it is back; check the peer daemon and the network",
				p.Addr, p.State, p.LastError)})
		}
	}
	// A fresh pair has no store samples yet: undecided, not off.
	if r := snap.Replication; others > 0 && !r.Allowed && (r.Mismatches > 0 || r.Mode == rowsync.ModeOff.String()) {
		out = append(out, ctlabi.Warning{Code: ctlabi.WarnMirroringOff, Message: fmt.Sprintf(
			"row mirroring is off (--replicated-kv %s: %s; %d samples, %d mismatches): only this node's rank can load from the tier",
			r.Mode, r.DecidedBy, r.Samples, r.Mismatches)})
	}
	return out
}

// sharedWarnings names what keeps the shared level from working.
func sharedWarnings(st shared.Stats) []ctlabi.Warning {
	var out []ctlabi.Warning
	if !st.Reachable {
		out = append(out, ctlabi.Warning{Code: ctlabi.WarnSharedUnreachable, Message: fmt.Sprintf(
			"the shared store %s does not answer within --shared-timeout (%d calls timed out): lookups answer absent from local blocks only and %d bytes wait to be written behind; check its filesystem's client and servers",
			st.Dir, st.Timeouts, st.BytesBehind)})
	}
	if st.BehindGrowing {
		out = append(out, ctlabi.Warning{Code: ctlabi.WarnSharedBehind, Message: fmt.Sprintf(
			"write-behind to the shared store does not keep up: %d bytes behind and growing (%d blocks dropped from the queue): raise --shared-rate or --shared-queue, or use --shared-admit looked-up",
			st.BytesBehind, st.DroppedBlocks)})
	}
	return out
}

// plural is n and the noun, singular for 1: plural(1, "block") is "1
// block", plural(2, "block") "2 blocks"; an irregular plural comes third.
func plural(n int64, singular string, pluralForm ...string) string {
	if n == 1 {
		return fmt.Sprintf("1 %s", singular)
	}
	if len(pluralForm) > 0 {
		return fmt.Sprintf("%d %s", n, pluralForm[0])
	}
	return fmt.Sprintf("%d %ss", n, singular)
}

// budgetWarning names the lookup budget's cap and what lifts it.
func budgetWarning(b lookupbudget.Stats) ctlabi.Warning {
	return ctlabi.Warning{Code: ctlabi.WarnLookupBudgetCapped, Message: fmt.Sprintf(
		"%d lookups found prefixes longer than the engine's primary tier can promote at once (%d rows): the lookup budget "+
			"answered present only the first chunks that fit (%d at the latest cap, %d rows kept for each window group) and withheld "+
			"%d present blocks, so an engine whose lookup promotes every key it confirms gets that hit instead of none. To serve "+
			"longer prefixes from this tier, give the primary tier more rows (cpu_bytes_to_use), or match through "+
			"MOUNTPOINT/.kvtier/match and load the hit in waves",
		b.ChainsCapped, b.Rows, b.LastCap, b.WindowRows, b.KeysWithheld)}
}

// descriptorsLow is the share of the descriptor limit held at which stat
// warns before any open is refused: every open through the mount holds one
// of the daemon's (descriptors.Reserve).
const descriptorsLow = 0.9

// descriptors are the daemon's descriptors now and the opens refused; zero
// where they cannot be counted.
func (s *Stats) descriptors() (ctlabi.Descriptors, int64) {
	fds := s.cfg.Descriptors
	if fds == nil {
		return ctlabi.Descriptors{}, 0
	}
	refused := fds.Refused()
	open, limit, err := fds.Count()
	if err != nil || limit <= 0 {
		return ctlabi.Descriptors{}, refused
	}
	kept, _ := descriptors.Levels(limit)
	return ctlabi.Descriptors{Open: int64(open), Limit: int64(limit), Kept: int64(kept)}, refused
}

// descriptorsWarning warns while the daemon holds descriptorsLow of its
// limit or leaves fewer than the descriptors kept for its own work free,
// and while opens were refused within the warning window.
func (s *Stats) descriptorsWarning(d ctlabi.Descriptors, refused int64) (ctlabi.Warning, bool) {
	n, recent := s.recent.Grew(ctlabi.WarnDescriptorsLow, refused)
	switch {
	case recent:
		return ctlabi.Warning{Code: ctlabi.WarnDescriptorsLow, Message: fmt.Sprintf(
			"%s through the mount refused with ENFILE to keep %d of the daemon's %d file descriptors for its own work (it holds %d): files held open through the mount hold the daemon's; find who holds them (lsof +D MOUNTPOINT) or raise the daemon's LimitNOFILE; clears after %s without one",
			plural(n, "open"), d.Kept, d.Limit, d.Open, s.recent.Window())}, true
	case d.Limit > 0 && (float64(d.Open) >= descriptorsLow*float64(d.Limit) || d.Limit-d.Open < d.Kept):
		return ctlabi.Warning{Code: ctlabi.WarnDescriptorsLow, Message: fmt.Sprintf(
			"the daemon holds %d of the %d file descriptors its limit allows: opens through the mount that would leave fewer than %d free are refused with ENFILE, to keep them for its own work; find who holds files open through the mount (lsof +D MOUNTPOINT) or raise the daemon's LimitNOFILE", d.Open, d.Limit, d.Kept)}, true
	}
	return ctlabi.Warning{}, false
}
