package fusefs

import (
	"testing"
	"time"
)

// TestBlockEntryTimeout: a mount whose lookups decide each time (the lookup
// budget, row mirroring) lets the kernel cache a present block only for the
// default entry timeout; any other for DefaultBlockEntryTimeout, or the
// lookup protection when shorter.
func TestBlockEntryTimeout(t *testing.T) {
	for _, tc := range []struct {
		budget, mirrored bool
		protect, want    time.Duration
	}{
		{false, false, time.Hour, DefaultBlockEntryTimeout},
		{false, false, time.Minute, time.Minute},
		{true, false, time.Hour, DefaultEntryTimeout},
		{false, true, time.Hour, DefaultEntryTimeout},
		{true, true, time.Millisecond, DefaultEntryTimeout},
	} {
		if got := BlockEntryTimeout(tc.budget, tc.mirrored, tc.protect); got != tc.want {
			t.Errorf("BlockEntryTimeout(budget %v, mirrored %v, protect %v) = %v, want %v", tc.budget, tc.mirrored, tc.protect, got, tc.want)
		}
	}
}
