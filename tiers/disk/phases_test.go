package disk

import (
	"testing"
	"time"
)

// TestPhasePercentilesBoundTheirDurations times 99 fast steps and one slow
// one: the median's bucket holds the fast duration, the 99th percentile's
// too, and the mean counts the slow one.
func TestPhasePercentilesBoundTheirDurations(t *testing.T) {
	s := openStore(t, Config{})
	for range 99 {
		s.recordPhase(PhaseCreate, 100*time.Microsecond)
	}
	s.recordPhase(PhaseCreate, time.Second)
	st, ok := s.PhaseStats()[PhaseCreate.String()]
	if !ok || st.Count != 100 {
		t.Fatalf("create phase: %+v (found %v), want 100 timings", st, ok)
	}
	for name, us := range map[string]float64{"p50": st.P50Micros, "p99": st.P99Micros} {
		// A percentile is its bucket's upper bound: within 19 % above the
		// duration.
		if us < 100 || us > 100*1.19 {
			t.Errorf("%s = %.1f µs, want the bucket of 100 µs", name, us)
		}
	}
	if st.MeanMicros < 1e4 {
		t.Errorf("mean %.1f µs leaves out the 1 s step", st.MeanMicros)
	}
	if _, timed := s.PhaseStats()[PhaseRename.String()]; timed {
		t.Error("a phase never timed is listed")
	}
}

// TestPhaseBucketsCoverTheirBounds puts each duration in the first bucket
// whose bound holds it.
func TestPhaseBucketsCoverTheirBounds(t *testing.T) {
	for _, d := range []time.Duration{0, time.Microsecond, 3 * time.Microsecond, 700 * time.Microsecond, 40 * time.Millisecond, 2 * time.Second} {
		i := phaseBucket(d)
		if PhaseBucketBound(i) < d-time.Nanosecond {
			t.Errorf("%v in bucket %d, bound %v", d, i, PhaseBucketBound(i))
		}
		if i > 0 && PhaseBucketBound(i-1) >= d {
			t.Errorf("%v in bucket %d although bucket %d's bound %v holds it", d, i, i-1, PhaseBucketBound(i-1))
		}
	}
	if i := phaseBucket(time.Hour); i != phaseBuckets-1 {
		t.Errorf("an hour in bucket %d, want the last, %d", i, phaseBuckets-1)
	}
}

// TestStoreTimesItsPhases stores a block through the daemon path and finds
// each step it took timed once in the store's stats, and the passthrough
// steps it did not take untimed.
func TestStoreTimesItsPhases(t *testing.T) {
	s := openStore(t, Config{})
	putBlock(t, s, blockRel("m_r0", 0, hashHex(1, 64)), pageData(1, 4))
	phases := s.Stats().StorePhases
	for _, p := range []Phase{PhaseCreateFile, PhaseReleaseWait, PhaseChecksum, PhaseRecord, PhaseRenameat} {
		if st := phases[p.String()]; st.Count != 1 {
			t.Errorf("%s timed %d times, want once", p, st.Count)
		}
	}
	for _, p := range []Phase{PhaseProbe, PhaseCreateReserve} {
		if st, ok := phases[p.String()]; ok {
			t.Errorf("%s timed (%+v) on the daemon path", p, st)
		}
	}
}
