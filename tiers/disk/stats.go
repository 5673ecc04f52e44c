package disk

import (
	"strconv"
	"sync/atomic"
)

// Counters are the store's monotonic event counts.
type Counters struct {
	Lookups          atomic.Int64
	LookupHits       atomic.Int64
	Reads            atomic.Int64
	ReadBytes        atomic.Int64
	Writes           atomic.Int64
	WriteBytes       atomic.Int64
	ChecksumFailures atomic.Int64
	Evictions        atomic.Int64
	NoSpace          atomic.Int64
	RejectedWrites   atomic.Int64
}

// Counters exposes the store's counters for metrics.
func (s *Store) Counters() *Counters { return &s.counters }

// GroupStats is the occupancy of one KV group.
type GroupStats struct {
	Blocks int64 `json:"blocks"`
	Bytes  int64 `json:"bytes"`
}

// Stats is a snapshot of the store's occupancy.
type Stats struct {
	Store         string `json:"store"`
	Blocks        int64  `json:"blocks"`
	LogicalBytes  int64  `json:"logical_bytes"`
	PhysicalBytes int64  `json:"physical_bytes"`
	CapacityBytes int64  `json:"capacity_bytes"`
	FreeBytes     int64  `json:"free_bytes"`
	Evictions     int64  `json:"evictions"`
	InFlightTmp   int    `json:"inflight_tmp_files"`
	// NeverLookedUp counts the blocks no lookup has found since the store was opened.
	NeverLookedUp int64                 `json:"never_looked_up"`
	RowBytes      map[string]int64      `json:"row_bytes"`
	Groups        map[string]GroupStats `json:"-"`
}

// Stats returns the current occupancy. Groups are keyed by group number.
// It walks the index; Space answers capacity and free bytes without.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Stats{
		Store:       s.root,
		Blocks:      int64(len(s.blocks)),
		Evictions:   s.counters.Evictions.Load(),
		InFlightTmp: len(s.tmps),
		RowBytes:    make(map[string]int64, len(s.rowBytes)),
		Groups:      make(map[string]GroupStats),
	}
	for k, v := range s.rowBytes {
		st.RowBytes[k] = v
	}
	groups := make(map[int]GroupStats)
	for _, b := range s.blocks {
		st.LogicalBytes += b.size
		if b.lastLookup == 0 {
			st.NeverLookedUp++
		}
		st.PhysicalBytes += b.physical
		g := groups[b.name.Group]
		g.Blocks++
		g.Bytes += b.size
		groups[b.name.Group] = g
	}
	for group, g := range groups {
		st.Groups[strconv.Itoa(group)] = g
	}
	st.CapacityBytes, st.FreeBytes = s.spaceLocked()
	return st
}

// Space returns the store's capacity and the bytes it may still use.
func (s *Store) Space() (capacity, free int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.spaceLocked()
}

func (s *Store) spaceLocked() (capacity, free int64) {
	return s.capacity, max(0, s.limitLocked()-s.used)
}
