package disk

import (
	"testing"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

func TestStats(t *testing.T) {
	s := openStore(t, Config{Capacity: 20 * page64})
	empty := s.Stats()
	if empty.Blocks != 0 || empty.LogicalBytes != 0 || empty.PhysicalBytes != 0 || empty.FreeBytes != 20*page64 ||
		empty.CapacityBytes != 20*page64 || len(empty.Groups) != 0 || len(empty.RowBytes) != 0 || empty.Store != s.Root() {
		t.Errorf("empty store Stats = %+v", empty)
	}
	putBlock(t, s, blockRel(testTier, 0, hashHex(1, 64)), pageData(1, 2))
	putBlock(t, s, blockRel(testTier, 0, hashHex(2, 64)), pageData(2, 2))
	putBlock(t, s, blockRel(testTier, 1, hashHex(3, 64)), pageData(3, 2))
	putBlock(t, s, blockRel("other_r0", 0, hashHex(4, 32)), pageData(4, 1))
	putBlock(t, s, blockRel("other_r0", 2, hashHex(5, 32)), pageData(5, 1))

	st := s.Stats()
	if st.Blocks != 5 || st.LogicalBytes != 8*page64 {
		t.Errorf("Blocks=%d LogicalBytes=%d, want 5, %d", st.Blocks, st.LogicalBytes, 8*block.PageSize)
	}
	if st.PhysicalBytes < st.LogicalBytes {
		t.Errorf("PhysicalBytes %d < LogicalBytes %d for dense files", st.PhysicalBytes, st.LogicalBytes)
	}
	if st.FreeBytes != st.CapacityBytes-st.PhysicalBytes {
		t.Errorf("FreeBytes = %d, want capacity %d - physical %d", st.FreeBytes, st.CapacityBytes, st.PhysicalBytes)
	}
	want := map[string]GroupStats{
		"0": {Blocks: 3, Bytes: 5 * page64},
		"1": {Blocks: 1, Bytes: 2 * page64},
		"2": {Blocks: 1, Bytes: 1 * page64},
	}
	if len(st.Groups) != len(want) {
		t.Errorf("Groups = %v, want %v", st.Groups, want)
	}
	for k, v := range want {
		if st.Groups[k] != v {
			t.Errorf("Groups[%s] = %+v, want %+v", k, st.Groups[k], v)
		}
	}
	if len(st.RowBytes) != 2 || st.RowBytes[testTier] != 2*page64 || st.RowBytes["other_r0"] != page64 {
		t.Errorf("RowBytes = %v", st.RowBytes)
	}
	checkAccounting(t, s)

	// A tmp being written takes free space and shows as in flight.
	rel := blockRel(testTier, 1, hashHex(6, 64))
	mkdirFor(t, s, rel)
	w, err := s.CreateTmp(tmpRelFor(rel, 1), engineCreateFlags)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteAt(pageData(6, 2), 0); err != nil {
		t.Fatal(err)
	}
	mid := s.Stats()
	if mid.InFlightTmp != 1 || mid.FreeBytes != st.FreeBytes-2*page64 || mid.Blocks != 5 {
		t.Errorf("with a tmp in flight: InFlightTmp=%d FreeBytes=%d Blocks=%d", mid.InFlightTmp, mid.FreeBytes, mid.Blocks)
	}
	w.Close()
	if err := s.Publish(tmpRelFor(rel, 1), rel); err != nil {
		t.Fatal(err)
	}
	end := s.Stats()
	if end.InFlightTmp != 0 || end.Blocks != 6 || end.Groups["1"] != (GroupStats{Blocks: 2, Bytes: 4 * page64}) ||
		end.FreeBytes != end.CapacityBytes-end.PhysicalBytes || end.LogicalBytes != 10*page64 {
		t.Errorf("after publishing: %+v groups %v", end, end.Groups)
	}
	// The returned maps are copies.
	end.RowBytes[testTier] = 1
	s.RowBytes()["other_r0"] = 1
	if got := s.RowBytes(); got[testTier] != 2*page64 || got["other_r0"] != page64 {
		t.Errorf("RowBytes changed through a returned map: %v", got)
	}

	checkAccounting(t, s)
}

// FreeBytes never exceeds the capacity, even when the filesystem has far more room.
func TestStatsFreeBytesBoundedByCapacity(t *testing.T) {
	s := openStore(t, Config{Capacity: 3 * page64})
	putBlock(t, s, blockRel(testTier, 0, hashHex(1, 64)), pageData(1, 1))
	st := s.Stats()
	if st.FreeBytes != st.CapacityBytes-st.PhysicalBytes || st.FreeBytes > st.CapacityBytes || st.PhysicalBytes < page64 {
		t.Errorf("FreeBytes = %d with capacity %d and one page used", st.FreeBytes, st.CapacityBytes)
	}
}
