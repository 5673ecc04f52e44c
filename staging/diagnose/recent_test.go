package diagnose

import (
	"testing"
	"time"
)

// TestRecentClearsAfterAQuietWindow grows a counter, lets a window pass
// without growth (the warning clears, the total stays) and grows it again
// (a new run counts from the old total).
func TestRecentClearsAfterAQuietWindow(t *testing.T) {
	now := time.Unix(1000, 0)
	r := NewRecent(time.Minute, func() time.Time { return now })
	if grown, recent := r.Grew("c", 0); recent || grown != 0 {
		t.Fatalf("a counter at 0: grown %d, recent %v", grown, recent)
	}
	steps := []struct {
		advance time.Duration
		total   int64
		grown   int64
		recent  bool
	}{
		{0, 2, 2, true},
		{30 * time.Second, 3, 3, true},  // same run
		{50 * time.Second, 3, 3, true},  // quiet 50s of 60
		{11 * time.Second, 3, 0, false}, // quiet a whole window: cleared
		{time.Hour, 3, 0, false},        // stays clear
		{time.Second, 5, 2, true},       // a new run counts from 3
		{2 * time.Minute, 5, 0, false},  // cleared again
		{0, 4, 0, false},                // a total that fell is no growth
	}
	for i, s := range steps {
		now = now.Add(s.advance)
		grown, recent := r.Grew("c", s.total)
		if grown != s.grown || recent != s.recent {
			t.Errorf("step %d (total %d): grown %d, recent %v; want %d, %v", i, s.total, grown, recent, s.grown, s.recent)
		}
	}
	if _, recent := r.Grew("other", 0); recent {
		t.Error("counters are not independent")
	}
}
