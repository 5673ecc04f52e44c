package prime

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// A tier is primed at most once per Interval, a refused one waits the
// interval too, and no more than maxPrimings are prepared at once.
func TestScheduleBoundsPrimings(t *testing.T) {
	var s Schedule
	now := time.Unix(1000, 0)
	if !s.Begin("a", now) {
		t.Fatal("the first priming of a tier was refused")
	}
	if s.Begin("a", now.Add(Interval-time.Nanosecond)) {
		t.Fatal("a tier was primed twice within the interval")
	}
	if !s.Begin("b", now) {
		t.Fatal("a second tier was refused while one priming was prepared")
	}
	if s.Begin("c", now) {
		t.Fatalf("a priming began while %d were prepared", maxPrimings)
	}
	s.Done()
	if s.Begin("c", now) {
		t.Fatal("a tier refused for the bound was primed again within the interval")
	}
	if !s.Begin("a", now.Add(Interval)) {
		t.Fatal("a tier was not primed again after the interval once a priming was done")
	}
}

// The schedule remembers at most maxTiers tiers beyond those primed within
// the interval, so a flood of tier names does not grow it without bound.
func TestScheduleForgetsOldTiers(t *testing.T) {
	var s Schedule
	now := time.Unix(1000, 0)
	for i := range maxTiers {
		if s.Begin(fmt.Sprint(i), now) {
			s.Done()
		}
	}
	if len(s.last) != maxTiers {
		t.Fatalf("%d tiers remembered, want %d", len(s.last), maxTiers)
	}
	if s.Begin("new", now.Add(Interval)) {
		s.Done()
	}
	if len(s.last) != 1 {
		t.Fatalf("%d tiers remembered after the interval, want 1 (the new one)", len(s.last))
	}
}

// A tier's names are its 4,096 prefix names, each three hex digits, then
// its group directories.
func TestTierNames(t *testing.T) {
	groups := []string{"t/abc/de_g0"}
	names := TierNames("t", groups)
	if len(names) != PrefixNames+1 || names[0] != "t/000" || names[0xabc] != "t/abc" || names[PrefixNames-1] != "t/fff" || names[PrefixNames] != groups[0] {
		t.Fatalf("%d names (%s … %s), want the %d prefix names t/000…t/fff and the group directory", len(names), names[0], names[len(names)-1], PrefixNames)
	}
	seen := make(map[string]bool)
	for _, n := range names[:PrefixNames] {
		if seen[n] || len(strings.TrimPrefix(n, "t/")) != 3 {
			t.Fatalf("prefix name %q repeated or not three digits", n)
		}
		seen[n] = true
	}
}
