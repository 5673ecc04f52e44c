package disk

import (
	"fmt"
	"strconv"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Counters are the store's monotonic event counts.
type Counters struct {
	Lookups    atomic.Int64
	LookupHits atomic.Int64
	Reads      atomic.Int64
	ReadBytes  atomic.Int64
	Writes     atomic.Int64
	WriteBytes atomic.Int64
	// ChecksumFailures counts blocks that failed verification with their
	// file as the daemon last saw it, ChangedOutside those whose file had
	// changed since (changed.go).
	ChecksumFailures atomic.Int64
	ChangedOutside   atomic.Int64
	Evictions        atomic.Int64
	NoSpace          atomic.Int64
	// RejectedWrites counts block writes refused for what the caller
	// asked: past a tmp's bound on disjoint ranges (EDQUOT), past the
	// largest file the store filesystem holds (EFBIG), or invalid (EINVAL).
	RejectedWrites atomic.Int64
	// UnprovenBlocks counts block files found at Open that were not indexed:
	// no digest record bound to their name, nor a matching vLLM CRC32C.
	UnprovenBlocks atomic.Int64
	// TmpsExpired counts tmp files removed because their closed writer never renamed them.
	TmpsExpired atomic.Int64
	// PublishRefused counts renames refused because the tmp's name no longer
	// named the file written (swapped for a link or another file).
	PublishRefused atomic.Int64
	// IOErrors counts reads and writes that the store filesystem itself
	// failed (a failing disk's EIO, a full filesystem's ENOSPC), not those
	// it refused for the caller's request (RejectedWrites).
	IOErrors atomic.Int64
	// StoresFromRow and StoresReadBack count passthrough stores whose digest
	// came from the engine's row, and those whose tmp file was read back.
	StoresFromRow  atomic.Int64
	StoresReadBack atomic.Int64
	// OtherFilesRefused counts writes outside the block layout refused
	// with EDQUOT: the table of other files was full (other.go).
	OtherFilesRefused atomic.Int64
}

// Counters exposes the store's counters for metrics.
func (s *Store) Counters() *Counters { return &s.counters }

// GroupStats is the occupancy of one KV group.
type GroupStats struct {
	Blocks int64
	Bytes  int64
}

// Stats is a snapshot of the store's occupancy.
type Stats struct {
	Store         string
	Blocks        int64
	LogicalBytes  int64
	PhysicalBytes int64
	CapacityBytes int64
	FreeBytes     int64
	Evictions     int64
	InFlightTmp   int
	// TmpBytes is what the tmp files count against the capacity.
	TmpBytes int64
	// NeverLookedUp counts the blocks no lookup has found since the store was opened.
	NeverLookedUp int64
	RowBytes      map[string]int64
	Groups        map[string]GroupStats
	// StorePhases times the steps of stores' creates and renames (phases.go).
	StorePhases map[string]PhaseStats
	// OtherFiles is the number of files outside the block layout the store
	// tracks, OtherFilesMax its bound (Config.MaxOtherFiles), and
	// OtherFilesUntracked those found past it, counted until the next Open.
	OtherFiles          int64
	OtherFilesMax       int64
	OtherFilesUntracked int64
}

// Stats returns the current occupancy. Groups are keyed by group number.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Stats{
		Store:         s.root,
		Blocks:        int64(len(s.blocks)),
		LogicalBytes:  s.totals.logical,
		PhysicalBytes: s.totals.physical,
		NeverLookedUp: s.totals.neverLookedUp,
		Evictions:     s.counters.Evictions.Load(),
		InFlightTmp:   len(s.tmps),
		RowBytes:      make(map[string]int64, len(s.rowBytes)),
		Groups:        make(map[string]GroupStats, len(s.totals.groups)),
	}
	st.OtherFiles, st.OtherFilesMax, st.OtherFilesUntracked = int64(len(s.others)), int64(s.cfg.MaxOtherFiles), int64(s.othersUntracked)
	for k, v := range s.rowBytes {
		st.RowBytes[k] = v
	}
	for _, t := range s.tmps {
		st.TmpBytes += t.allocated
	}
	for group, g := range s.totals.groups {
		st.Groups[strconv.Itoa(group)] = g
	}
	st.CapacityBytes, st.FreeBytes = s.spaceLocked()
	st.StorePhases = s.PhaseStats()
	return st
}

// blockTotals are sums over the indexed blocks.
type blockTotals struct {
	logical, physical int64
	// neverLookedUp counts blocks no lookup has found since the store opened.
	neverLookedUp int64
	groups        map[int]GroupStats
}

// add counts block b into the totals (sign 1) or out of them (sign -1).
func (t *blockTotals) add(b *entry, sign int64) {
	t.logical += sign * b.size
	t.physical += sign * b.physical
	if b.lastLookup == 0 {
		t.neverLookedUp += sign
	}
	g := t.groups[b.name.Group]
	g.Blocks += sign
	g.Bytes += sign * b.size
	if g.Blocks == 0 {
		delete(t.groups, b.name.Group)
		return
	}
	t.groups[b.name.Group] = g
}

// Reach returns the bytes the tier can hold now, used plus free: its
// capacity, bounded by what the store filesystem has left (the disk's
// other users take their share); and the bytes it may still use. df shows
// these, so that an empty tier shows empty however full the disk is.
func (s *Store) Reach() (size, free int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, free = s.spaceLocked()
	return s.used + free, free
}

func (s *Store) spaceLocked() (capacity, free int64) {
	return s.capacity, max(0, s.limitLocked()-s.used)
}

// Check asks the store filesystem for its usage through the store root's
// descriptor: an error, or no answer, means the store cannot serve.
func (s *Store) Check() error {
	var st unix.Statfs_t
	if err := unix.Fstatfs(s.rootFD, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", s.root, err)
	}
	return nil
}
