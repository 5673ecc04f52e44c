package disk

import (
	"math"
	"sync/atomic"
	"time"
)

// Phase is one timed step of a store's tmp creation (the engine's open) or
// publication (its rename), as the daemon sees it (DESIGN "The store").
type Phase int

// The phases of a store. PhaseCreate and PhaseRename are whole requests;
// the others are parts of them.
const (
	// PhaseTmpLookup is the LOOKUP of the tmp name the kernel sends before
	// its CREATE.
	PhaseTmpLookup Phase = iota
	// PhaseCreate is the whole CREATE of a tmp file.
	PhaseCreate
	// PhaseCreateFile creates the store file and makes it the store's.
	PhaseCreateFile
	// PhaseCreateReserve counts a passthrough tmp's row against the capacity.
	PhaseCreateReserve
	// PhaseRename is the whole RENAME that publishes a block.
	PhaseRename
	// PhaseReleaseWait waits for the writer to release the tmp file.
	PhaseReleaseWait
	// PhaseProbe reads the probe pages, finds the row and punches zero
	// pages; part of PhaseProof.
	PhaseProbe
	// PhaseProbeRead is the read of the probe pages, part of PhaseProbe.
	PhaseProbeRead
	// PhaseChecksum checksums what no row gave and checks vLLM's CRC32C
	// xattr; part of PhaseProof.
	PhaseChecksum
	// PhaseRecord writes the digest record and clears the pending mark; part of PhaseProof.
	PhaseRecord
	// PhaseRenameat renames the tmp in the store and checks its identity, under the store's lock.
	PhaseRenameat
	// PhaseIndex tells a published block's listeners (tiers/tier times it:
	// the lookup index, staging, the budget, the diagnostics), the end of
	// the rename.
	PhaseIndex
	// PhasePending marks the tmp pending its proof, before the rename.
	PhasePending
	// PhaseProof is a block's whole proof, the end of its rename.
	PhaseProof
	// PhaseLoadProofWait is what a load of a block waited for its proof.
	PhaseLoadProofWait
	phaseCount
)

// phaseNames name the phases in stats.json and the metrics.
var phaseNames = [phaseCount]string{"tmp_lookup", "create", "create_file", "create_reserve",
	"rename", "rename_release_wait", "rename_probe", "rename_probe_read", "rename_checksum", "rename_record", "rename_renameat", "rename_index",
	"rename_pending", "rename_proof", "load_proof_wait"}

// String is the phase's name in stats.json.
func (p Phase) String() string { return phaseNames[p] }

// PhaseBucketsPerOctave and phaseBuckets shape the histogram: bucket i counts
// durations up to 2^(i/4) µs, so a percentile is known within 19 %, from 1 µs
// to about 16 s (the last bucket takes everything longer).
const (
	PhaseBucketsPerOctave = 4
	phaseBuckets          = 24*PhaseBucketsPerOctave + 1
)

// phaseTimes are always-on latency histograms of the store's phases: a
// few atomic adds per observation.
type phaseTimes struct {
	count [phaseCount][phaseBuckets]atomic.Int64
	sumNs [phaseCount]atomic.Int64
}

// phaseBucket is the bucket of duration d.
func phaseBucket(d time.Duration) int {
	us := float64(d) / float64(time.Microsecond)
	if us <= 1 {
		return 0
	}
	return min(int(math.Ceil(PhaseBucketsPerOctave*math.Log2(us))), phaseBuckets-1)
}

// PhaseBucketBound is the upper bound of bucket i.
func PhaseBucketBound(i int) time.Duration {
	return time.Duration(math.Exp2(float64(i)/PhaseBucketsPerOctave) * float64(time.Microsecond))
}

// TimePhase records that phase p took from start to now.
func (s *Store) TimePhase(p Phase, start time.Time) { s.recordPhase(p, time.Since(start)) }

// recordPhase records that phase p took d.
func (s *Store) recordPhase(p Phase, d time.Duration) {
	s.phases.count[p][phaseBucket(d)].Add(1)
	s.phases.sumNs[p].Add(int64(d))
}

// PhaseStats summarises one phase's histogram.
type PhaseStats struct {
	Count int64
	// MeanMicros, P50Micros and P99Micros are in microseconds; a percentile
	// is its bucket's upper bound.
	MeanMicros float64
	P50Micros  float64
	P99Micros  float64
	// Buckets[i] counts the durations up to PhaseBucketBound(i) and
	// longer than the bound before (the last takes everything longer).
	Buckets    []int64
	SumSeconds float64
}

// PhaseStats returns every phase's histogram by name; phases never timed are left out.
func (s *Store) PhaseStats() map[string]PhaseStats {
	out := make(map[string]PhaseStats)
	for p := range phaseCount {
		st := PhaseStats{Buckets: make([]int64, phaseBuckets)}
		for i := range st.Buckets {
			st.Buckets[i] = s.phases.count[p][i].Load()
			st.Count += st.Buckets[i]
		}
		if st.Count == 0 {
			continue
		}
		st.SumSeconds = time.Duration(s.phases.sumNs[p].Load()).Seconds()
		st.MeanMicros = st.SumSeconds * 1e6 / float64(st.Count)
		st.P50Micros = st.percentileMicros(0.50)
		st.P99Micros = st.percentileMicros(0.99)
		out[p.String()] = st
	}
	return out
}

// percentileMicros is the upper bound of the bucket holding quantile q.
func (st PhaseStats) percentileMicros(q float64) float64 {
	rank := int64(math.Ceil(q * float64(st.Count)))
	var seen int64
	for i, n := range st.Buckets {
		if seen += n; seen >= rank {
			return float64(PhaseBucketBound(i)) / float64(time.Microsecond)
		}
	}
	return math.Inf(1)
}
