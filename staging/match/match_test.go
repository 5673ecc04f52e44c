package match

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// testKey is the key of chunk i: distinct, lowercase hex, 64 digits.
func testKey(chunk int) string { return fmt.Sprintf("%064x", chunk+1) }

func testKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = testKey(i)
	}
	return keys
}

type blockRef struct {
	group int
	key   string
}

// blockStore is a map-backed index of stored blocks that counts the probes
// of each block.
type blockStore struct {
	blocks map[blockRef]bool
	probes map[blockRef]int
}

func newBlockStore() *blockStore {
	return &blockStore{blocks: map[blockRef]bool{}, probes: map[blockRef]int{}}
}

func (s *blockStore) present(group int, key string) bool {
	ref := blockRef{group, key}
	s.probes[ref]++
	return s.blocks[ref]
}

func (s *blockStore) probesOfGroup(group int) int {
	n := 0
	for ref, count := range s.probes {
		if ref.group == group {
			n += count
		}
	}
	return n
}

// groupCase is a group with its stored chunks as a pattern: '1' stored, '0'
// not. Acc is set to tail for windowed groups: Hit does not read it.
type groupCase struct {
	group  int
	kind   ctlabi.GroupKind
	tail   int
	stored string
}

func buildMatch(cases []groupCase) (ctlabi.MatchRequest, *blockStore) {
	store := newBlockStore()
	req := ctlabi.MatchRequest{Tier: "DeepSeek_abc123def456_r0"}
	for _, c := range cases {
		keys := testKeys(len(c.stored))
		for i, bit := range c.stored {
			if bit == '1' {
				store.blocks[blockRef{c.group, keys[i]}] = true
			}
		}
		req.Groups = append(req.Groups, ctlabi.GroupSpec{Group: c.group, Kind: c.kind, Tail: c.tail, Acc: c.tail, Keys: keys})
	}
	return req, store
}

// runMatch runs Hit and checks that no block was probed twice and that
// Probes counts the probes made.
func runMatch(t *testing.T, req ctlabi.MatchRequest, store *blockStore) ctlabi.MatchResult {
	t.Helper()
	result, err := Hit(req, store.present)
	if err != nil {
		t.Fatalf("Hit: %v", err)
	}
	total := 0
	for ref, count := range store.probes {
		if count > 1 {
			t.Errorf("block %v probed %d times, want at most once", ref, count)
		}
		total += count
	}
	if result.Probes != total {
		t.Errorf("Probes = %d, but present was called %d times", result.Probes, total)
	}
	return result
}

func TestMatchSingleGroup(t *testing.T) {
	tests := []struct {
		name string
		c    groupCase
		want int
	}{
		{"full: all stored", groupCase{0, ctlabi.KindFull, 0, "111111"}, 6},
		{"full: prefix up to the first gap", groupCase{0, ctlabi.KindFull, 0, "111011"}, 3},
		{"full: first chunk missing", groupCase{0, ctlabi.KindFull, 0, "011111"}, 0},
		{"full: no chunks", groupCase{0, ctlabi.KindFull, 0, ""}, 0},
		{"sliding: run at the end", groupCase{0, ctlabi.KindSliding, 2, "000011"}, 6},
		{"sliding: last of two runs", groupCase{0, ctlabi.KindSliding, 2, "011011"}, 6},
		{"sliding: run before a lone chunk", groupCase{0, ctlabi.KindSliding, 2, "011010"}, 3},
		{"sliding: run reaching chunk 0 shorter than the window", groupCase{0, ctlabi.KindSliding, 2, "100000"}, 1},
		{"sliding: window longer than the prompt", groupCase{0, ctlabi.KindSliding, 9, "111011"}, 3},
		{"sliding: no run", groupCase{0, ctlabi.KindSliding, 2, "010101"}, 0},
		{"sliding: nothing stored", groupCase{0, ctlabi.KindSliding, 2, "000000"}, 0},
		{"eagle: all stored drops the last chunk", groupCase{0, ctlabi.KindEagle, 2, "111111"}, 5},
		{"eagle: run of tail+1 then drop one", groupCase{0, ctlabi.KindEagle, 2, "011100"}, 3},
		{"eagle: a run of only tail is not enough", groupCase{0, ctlabi.KindEagle, 2, "011011"}, 0},
		{"eagle: short run at chunk 0", groupCase{0, ctlabi.KindEagle, 2, "110000"}, 1},
		{"eagle: one chunk at 0 drops to nothing", groupCase{0, ctlabi.KindEagle, 2, "100000"}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, store := buildMatch([]groupCase{tt.c})
			result := runMatch(t, req, store)
			if result.HitChunks != tt.want || !slices.Equal(result.PerGroup, []int{tt.want}) {
				t.Errorf("got hit %d per group %v, want %d [%d]", result.HitChunks, result.PerGroup, tt.want, tt.want)
			}
		})
	}
}

func TestMatchAcrossGroups(t *testing.T) {
	tests := []struct {
		name         string
		groups       []groupCase
		wantHit      int
		wantPerGroup []int
	}{
		{
			name:         "full limits sliding",
			groups:       []groupCase{{0, ctlabi.KindFull, 0, "111100"}, {1, ctlabi.KindSliding, 2, "001111"}},
			wantHit:      4,
			wantPerGroup: []int{4, 6},
		},
		{
			name:         "sliding limits full",
			groups:       []groupCase{{0, ctlabi.KindFull, 0, "111111"}, {1, ctlabi.KindSliding, 2, "110110"}},
			wantHit:      5,
			wantPerGroup: []int{6, 5},
		},
		{
			name:         "one group vetoes all",
			groups:       []groupCase{{0, ctlabi.KindFull, 0, "111111"}, {1, ctlabi.KindSliding, 2, "010101"}},
			wantHit:      0,
			wantPerGroup: []int{6, 0},
		},
		{
			// Full gives 8; S1 (tail 3) 7; S2 (tail 1) 5, so S1 is looked up
			// again: 3; then S2: 2; a third pass confirms 2 for both.
			name: "a later group's shrink re-checks earlier windowed groups until stable",
			groups: []groupCase{
				{0, ctlabi.KindFull, 0, "11111111"},
				{1, ctlabi.KindSliding, 3, "11101110"},
				{2, ctlabi.KindSliding, 1, "01001000"},
			},
			wantHit:      2,
			wantPerGroup: []int{8, 7, 5},
		},
		{
			name: "request order of groups does not matter",
			groups: []groupCase{
				{2, ctlabi.KindSliding, 1, "01001000"},
				{0, ctlabi.KindFull, 0, "11111111"},
				{1, ctlabi.KindSliding, 3, "11101110"},
			},
			wantHit:      2,
			wantPerGroup: []int{5, 8, 7},
		},
		{
			// The eagle group drops one chunk (8 -> 7); re-checked after the
			// sliding group, it is verified and must not drop another.
			name: "eagle drops once",
			groups: []groupCase{
				{0, ctlabi.KindFull, 0, "11111111"},
				{1, ctlabi.KindSliding, 3, "11111111"},
				{2, ctlabi.KindEagle, 2, "11111111"},
			},
			wantHit:      7,
			wantPerGroup: []int{8, 8, 7},
		},
		{
			// Eagle (tail 2) drops to 7, the sliding group (tail 1) shrinks
			// it to 4, which unverifies the eagle group: at 4 it needs chunks
			// 2..4 but chunk 4 is missing, so it falls to 3. Keeping it
			// verified would wrongly accept 4.
			name: "eagle drops again after a non-eagle group shrinks the hit",
			groups: []groupCase{
				{0, ctlabi.KindFull, 0, "11111111"},
				{1, ctlabi.KindEagle, 2, "11110111"},
				{2, ctlabi.KindSliding, 1, "00110000"},
			},
			wantHit:      3,
			wantPerGroup: []int{8, 7, 4},
		},
		{
			// vLLM's quirk kept on purpose: E1 (tail 3) drops to 9, E2 (tail
			// 2) drops to 5; an eagle shrink leaves E1 verified, so E1 is
			// re-checked with a run of 3 (chunks 2..4), not 4 (chunk 5 is
			// missing), and the engine accepts 5.
			name: "second eagle's drop re-checks the first as verified",
			groups: []groupCase{
				{0, ctlabi.KindFull, 0, "1111111111"},
				{1, ctlabi.KindEagle, 3, "1111101111"},
				{2, ctlabi.KindEagle, 2, "0001110000"},
			},
			wantHit:      5,
			wantPerGroup: []int{10, 9, 5},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, store := buildMatch(tt.groups)
			result := runMatch(t, req, store)
			if result.HitChunks != tt.wantHit || !slices.Equal(result.PerGroup, tt.wantPerGroup) {
				t.Errorf("got hit %d per group %v, want %d %v", result.HitChunks, result.PerGroup, tt.wantHit, tt.wantPerGroup)
			}
		})
	}
}

// fieldCase builds the field's layout: a full group holding every chunk and
// an EAGLE group (tail 4, acc 16) stored by the given retention rule.
func fieldCase(chunks int, retained func(kind ctlabi.GroupKind, tail, acc, chunk int) bool) (ctlabi.MatchRequest, *blockStore) {
	const tail, acc = 4, 16
	store := newBlockStore()
	keys := testKeys(chunks)
	for i, key := range keys {
		store.blocks[blockRef{0, key}] = true
		if retained(ctlabi.KindEagle, tail, acc, i) {
			store.blocks[blockRef{1, key}] = true
		}
	}
	req := ctlabi.MatchRequest{Tier: "DeepSeek_abc123def456_r0", Groups: []ctlabi.GroupSpec{
		{Group: 0, Kind: ctlabi.KindFull, Keys: keys},
		{Group: 1, Kind: ctlabi.KindEagle, Tail: tail, Acc: acc, Keys: keys},
	}}
	return req, store
}

func TestFieldCaseEagleStoreFilter(t *testing.T) {
	const chunks = 100
	t.Run("stock filter: the eagle group vetoes everything", func(t *testing.T) {
		req, store := fieldCase(chunks, StockRetained)
		result := runMatch(t, req, store)
		if result.HitChunks != 0 || !slices.Equal(result.PerGroup, []int{chunks, 0}) {
			t.Errorf("got hit %d per group %v, want 0 [%d 0]", result.HitChunks, result.PerGroup, chunks)
		}
		// The engine's backward scan probes all 100 eagle chunks; here a
		// missing chunk can skip a window of tail+1 = 5.
		if probes := store.probesOfGroup(1); probes >= chunks/2 {
			t.Errorf("eagle group probed %d times, want fewer than %d", probes, chunks/2)
		}
	})
	t.Run("fixed filter: hit ends on a segment boundary", func(t *testing.T) {
		req, store := fieldCase(chunks, Retained)
		result := runMatch(t, req, store)
		// The last run of 5 is chunks 92..96 (96 = 6×16 is a segment head);
		// dropping chunk 96 leaves 6 segments.
		if result.HitChunks != 96 || !slices.Equal(result.PerGroup, []int{chunks, 96}) {
			t.Errorf("got hit %d per group %v, want 96 [%d 96]", result.HitChunks, result.PerGroup, chunks)
		}
	})
}

func TestMatchValidation(t *testing.T) {
	valid := func() ctlabi.MatchRequest {
		return ctlabi.MatchRequest{Tier: "DeepSeek_abc123def456_r0", Groups: []ctlabi.GroupSpec{
			{Group: 0, Kind: ctlabi.KindFull, Keys: testKeys(3)},
			{Group: 1, Kind: ctlabi.KindEagle, Tail: 4, Acc: 16, Keys: testKeys(3)},
		}}
	}
	tests := []struct {
		name      string
		edit      func(r *ctlabi.MatchRequest)
		wantField string
	}{
		{"empty tier", func(r *ctlabi.MatchRequest) { r.Tier = "" }, "tier"},
		{"tier with a slash", func(r *ctlabi.MatchRequest) { r.Tier = "a/b" }, "tier"},
		{"tier dot-dot", func(r *ctlabi.MatchRequest) { r.Tier = ".." }, "tier"},
		{"tier too long", func(r *ctlabi.MatchRequest) { r.Tier = strings.Repeat("a", 256) }, "tier"},
		{"no groups", func(r *ctlabi.MatchRequest) { r.Groups = nil }, "groups"},
		{"zero kind", func(r *ctlabi.MatchRequest) { r.Groups[1].Kind = 0 }, "groups[1].kind"},
		{"unknown kind", func(r *ctlabi.MatchRequest) { r.Groups[0].Kind = 42 }, "groups[0].kind"},
		{"sliding tail zero", func(r *ctlabi.MatchRequest) { r.Groups[1].Kind, r.Groups[1].Tail = ctlabi.KindSliding, 0 }, "groups[1].tail"},
		{"eagle negative tail", func(r *ctlabi.MatchRequest) { r.Groups[1].Tail = -1 }, "groups[1].tail"},
		{"acc less than tail", func(r *ctlabi.MatchRequest) { r.Groups[1].Acc = 3 }, "groups[1].acc"},
		{"full with a tail", func(r *ctlabi.MatchRequest) { r.Groups[0].Tail = 2 }, "groups[0].tail"},
		{"full with an acc", func(r *ctlabi.MatchRequest) { r.Groups[0].Acc = 16 }, "groups[0].acc"},
		{"mismatched key counts", func(r *ctlabi.MatchRequest) { r.Groups[1].Keys = testKeys(4) }, "groups[1].keys"},
		{"non-hex key", func(r *ctlabi.MatchRequest) { r.Groups[0].Keys[1] = "xyz12" }, "groups[0].keys[1]"},
		{"uppercase key", func(r *ctlabi.MatchRequest) { r.Groups[1].Keys[2] = "ABCDEF" }, "groups[1].keys[2]"},
		{"key too short for the path", func(r *ctlabi.MatchRequest) { r.Groups[0].Keys[0] = "abcd" }, "groups[0].keys[0]"},
		{"key too long", func(r *ctlabi.MatchRequest) { r.Groups[0].Keys[0] = strings.Repeat("a", 129) }, "groups[0].keys[0]"},
		{"duplicate group id", func(r *ctlabi.MatchRequest) { r.Groups[1].Group = 0 }, "groups[1].group"},
		{"negative group id", func(r *ctlabi.MatchRequest) { r.Groups[0].Group = -1 }, "groups[0].group"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := valid()
			tt.edit(&req)
			store := newBlockStore()
			_, err := Hit(req, store.present)
			var reqErr *ctlabi.RequestError
			if !errors.As(err, &reqErr) {
				t.Fatalf("Hit error = %v, want a *RequestError", err)
			}
			if reqErr.Field != tt.wantField {
				t.Errorf("error field = %q (%v), want %q", reqErr.Field, err, tt.wantField)
			}
			if !strings.Contains(err.Error(), tt.wantField) {
				t.Errorf("error text %q does not name %q", err, tt.wantField)
			}
			if len(store.probes) != 0 {
				t.Errorf("an invalid request probed %d blocks", len(store.probes))
			}
		})
	}
	if err := valid().Validate(); err != nil {
		t.Errorf("the valid request fails: %v", err)
	}
}

func TestMatchTooManyKeys(t *testing.T) {
	keys := slices.Repeat([]string{"abcde"}, ctlabi.MaxRequestKeys/2+1)
	req := ctlabi.MatchRequest{Tier: "t", Groups: []ctlabi.GroupSpec{
		{Group: 0, Kind: ctlabi.KindFull, Keys: keys},
		{Group: 1, Kind: ctlabi.KindFull, Keys: keys},
	}}
	if _, err := Hit(req, func(int, string) bool { return true }); !errors.Is(err, ctlabi.ErrRequestTooLarge) {
		t.Errorf("Hit error = %v, want ErrRequestTooLarge", err)
	}
	req.Groups = req.Groups[:1]
	if err := req.Validate(); err != nil {
		t.Errorf("half the limit fails: %v", err)
	}
}

func TestMatchTooManyGroups(t *testing.T) {
	req := ctlabi.MatchRequest{Tier: "t"}
	for g := range ctlabi.MaxRequestGroups + 1 {
		req.Groups = append(req.Groups, ctlabi.GroupSpec{Group: g, Kind: ctlabi.KindFull, Keys: []string{"abcde"}})
	}
	probes := 0
	_, err := Hit(req, func(int, string) bool { probes++; return true })
	if !errors.Is(err, ctlabi.ErrRequestTooLarge) || !strings.Contains(err.Error(), "groups (limit") {
		t.Errorf("Hit error = %v, want ErrRequestTooLarge naming the groups", err)
	}
	if probes != 0 {
		t.Errorf("a refused request probed %d blocks", probes)
	}
	req.Groups = req.Groups[:ctlabi.MaxRequestGroups]
	if err := req.Validate(); err != nil {
		t.Errorf("MaxRequestGroups groups fail: %v", err)
	}
}

func TestMatchResultJSON(t *testing.T) {
	result := ctlabi.MatchResult{HitChunks: 96, PerGroup: []int{100, 96}, Probes: 106}
	encoded := ctlabi.EncodeMatchResult(result, nil)
	if want := `{"hit_chunks":96,"per_group":[100,96],"probes":106}`; string(encoded) != want {
		t.Errorf("encoded %s, want %s", encoded, want)
	}
	decoded, err := ctlabi.DecodeMatchResult(encoded)
	if err != nil || !reflect.DeepEqual(decoded, result) {
		t.Errorf("round trip = %+v, %v; want %+v", decoded, err, result)
	}
	if got := string(ctlabi.EncodeMatchResult(ctlabi.MatchResult{}, nil)); got != `{"hit_chunks":0,"per_group":[],"probes":0}` {
		t.Errorf("empty result encoded as %s", got)
	}

	_, matchErr := Hit(ctlabi.MatchRequest{Tier: "t"}, nil)
	encoded = ctlabi.EncodeMatchResult(ctlabi.MatchResult{}, matchErr)
	if want := `{"error":"match request: groups: no groups"}`; string(encoded) != want {
		t.Errorf("error answer %s, want %s", encoded, want)
	}
	if _, err := ctlabi.DecodeMatchResult(encoded); err == nil || err.Error() != matchErr.Error() {
		t.Errorf("decoding the error answer gave %v, want %v", err, matchErr)
	}

	for _, bad := range []string{``, `{"hit_chunks":`, `{"per_group":[1],"probes":3}`, `{"hit_chunks":"7"}`} {
		if _, err := ctlabi.DecodeMatchResult([]byte(bad)); err == nil {
			t.Errorf("DecodeMatchResult(%q) succeeded, want an error", bad)
		}
	}
}

// engineLookup is a reference for Hit: vLLM's _lookup transcribed in
// tokens, with no GPU-computed prefix, a slice per lookup and no memo. It
// returns the hit in tokens and records every block it looks up.
func engineLookup(groups []ctlabi.GroupSpec, stored map[blockRef]bool, tokensPerChunk, numTokens int, looked map[blockRef]bool) int {
	lookup := func(g ctlabi.GroupSpec, chunk int) bool {
		ref := blockRef{g.Group, g.Keys[chunk]}
		looked[ref] = true
		return stored[ref]
	}
	prefixLookup := func(g ctlabi.GroupSpec, numChunks int) int {
		hits := 0
		for chunk := 0; chunk < numChunks && lookup(g, chunk); chunk++ {
			hits++
		}
		return hits
	}
	slidingWindowLookup := func(g ctlabi.GroupSpec, numChunks, window int) int {
		consecutive := 0
		for chunk := numChunks - 1; chunk >= 0; chunk-- {
			if lookup(g, chunk) {
				consecutive++
			} else {
				consecutive = 0
			}
			if consecutive == window {
				return chunk + window
			}
		}
		return consecutive
	}
	cdiv := func(a, b int) int { return (a + b - 1) / b }

	// Group index order, then full attention first and windowed groups
	// stably sorted by window, largest first.
	byIndex := slices.Clone(groups)
	slices.SortFunc(byIndex, func(a, b ctlabi.GroupSpec) int { return a.Group - b.Group })
	var full, windowed []ctlabi.GroupSpec
	for _, g := range byIndex {
		if g.Kind == ctlabi.KindFull {
			full = append(full, g)
		} else {
			windowed = append(windowed, g)
		}
	}
	slices.SortStableFunc(windowed, func(a, b ctlabi.GroupSpec) int { return b.Tail - a.Tail })

	maxHitTokens := numTokens
	if len(windowed) > 0 {
		maxHitTokens-- // the last prompt token is recomputed
	}
	numHitTokens := 0
	verified := map[int]bool{}
	lookupGroups := append(full, windowed...)
	for len(lookupGroups) > 0 {
		lookedUpWindowed := false
		pass := lookupGroups
		lookupGroups = nil
		for _, g := range pass {
			numKeys := len(g.Keys)
			unverifiedEagle := g.Kind == ctlabi.KindEagle && !verified[g.Group]
			maxHitTokens = min(maxHitTokens, numKeys*tokensPerChunk)
			if maxHitTokens < tokensPerChunk {
				return 0
			}
			queryMax := maxHitTokens
			if unverifiedEagle {
				queryMax = min(maxHitTokens+tokensPerChunk, numKeys*tokensPerChunk)
			}
			numChunks := min(cdiv(queryMax, tokensPerChunk), numKeys)
			var hitChunks int
			if g.Kind == ctlabi.KindFull {
				hitChunks = prefixLookup(g, numChunks)
			} else {
				window := g.Tail
				if unverifiedEagle {
					window++
				}
				hitChunks = slidingWindowLookup(g, numChunks, window)
			}
			if hitChunks == 0 {
				return 0
			}
			if unverifiedEagle {
				hitChunks--
				verified[g.Group] = true
			}
			maxHitTokens = min(maxHitTokens, tokensPerChunk*hitChunks)
			newHitTokens := maxHitTokens
			if newHitTokens < tokensPerChunk {
				return 0
			}
			if newHitTokens < numHitTokens {
				if g.Kind != ctlabi.KindEagle {
					clear(verified)
				}
				if lookedUpWindowed && lookupGroups == nil {
					lookupGroups = windowed
				}
			}
			lookedUpWindowed = lookedUpWindowed || g.Kind != ctlabi.KindFull
			numHitTokens = newHitTokens
		}
	}
	return numHitTokens
}

// engineTokens turns a hit in chunks into the engine's hit in tokens: capped
// by its token bound (one token less when a group is windowed), nothing when
// under a chunk.
func engineTokens(hitChunks int, groups []ctlabi.GroupSpec, tokensPerChunk, numTokens int) int {
	bound := numTokens
	if slices.ContainsFunc(groups, func(g ctlabi.GroupSpec) bool { return g.Kind != ctlabi.KindFull }) {
		bound--
	}
	tokens := min(hitChunks*tokensPerChunk, bound)
	if tokens < tokensPerChunk {
		return 0
	}
	return tokens
}

// greatestCommonHit is a declarative reference: the largest h that every
// group allows on its own terms, an EAGLE group needing chunks
// max(0,h-tail) … h (chunk h exists) so that dropping chunk h leaves h.
func greatestCommonHit(groups []ctlabi.GroupSpec, stored map[blockRef]bool) int {
	numChunks := len(groups[0].Keys)
	allStored := func(g ctlabi.GroupSpec, from, to int) bool {
		for chunk := max(0, from); chunk < to; chunk++ {
			if !stored[blockRef{g.Group, g.Keys[chunk]}] {
				return false
			}
		}
		return true
	}
	allows := func(g ctlabi.GroupSpec, h int) bool {
		switch g.Kind {
		case ctlabi.KindFull:
			return allStored(g, 0, h)
		case ctlabi.KindSliding:
			return allStored(g, h-g.Tail, h)
		default:
			return h < numChunks && allStored(g, h-g.Tail, h+1)
		}
	}
	for h := numChunks; h > 0; h-- {
		if !slices.ContainsFunc(groups, func(g ctlabi.GroupSpec) bool { return !allows(g, h) }) {
			return h
		}
	}
	return 0
}

// randomRequest draws 1 to 4 groups with distinct ids in shuffled order and a
// random store: uniform at some density, or one of the retention rules with
// holes punched in.
func randomRequest(rng *rand.Rand) (ctlabi.MatchRequest, map[blockRef]bool) {
	numChunks := rng.IntN(41)
	keys := testKeys(numChunks)
	ids := rng.Perm(8)
	req := ctlabi.MatchRequest{Tier: "t"}
	stored := map[blockRef]bool{}
	for i := range 1 + rng.IntN(4) {
		kind := []ctlabi.GroupKind{ctlabi.KindFull, ctlabi.KindSliding, ctlabi.KindEagle}[rng.IntN(3)]
		g := ctlabi.GroupSpec{Group: ids[i], Kind: kind, Keys: keys}
		if kind != ctlabi.KindFull {
			g.Tail = 1 + rng.IntN(5)
			g.Acc = g.Tail + rng.IntN(7)
		}
		density := []float64{0.3, 0.7, 0.95, 1}[rng.IntN(4)]
		rule := rng.IntN(3) // 0 uniform, 1 Retained, 2 StockRetained
		for chunk, key := range keys {
			keep := rng.Float64() < density
			if rule == 1 {
				keep = keep && Retained(kind, g.Tail, g.Acc, chunk)
			} else if rule == 2 {
				keep = keep && StockRetained(kind, g.Tail, g.Acc, chunk)
			}
			if keep {
				stored[blockRef{g.Group, key}] = true
			}
		}
		req.Groups = append(req.Groups, g)
	}
	return req, stored
}

func TestMatchAgainstReferences(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 12434))
	for iteration := range 20000 {
		req, stored := randomRequest(rng)
		tokensPerChunk := []int{2, 3, 16}[rng.IntN(3)] // vLLM's chunks hold at least 2 tokens
		numTokens := len(req.Groups[0].Keys)*tokensPerChunk + rng.IntN(tokensPerChunk)
		describe := func() string {
			var b strings.Builder
			for _, g := range req.Groups {
				fmt.Fprintf(&b, "\n  group %d %v tail %d: ", g.Group, g.Kind, g.Tail)
				for _, key := range g.Keys {
					if stored[blockRef{g.Group, key}] {
						b.WriteByte('1')
					} else {
						b.WriteByte('0')
					}
				}
			}
			return fmt.Sprintf("iteration %d, %d tokens, %d per chunk:%s", iteration, numTokens, tokensPerChunk, b.String())
		}

		store := &blockStore{blocks: stored, probes: map[blockRef]int{}}
		result := runMatch(t, req, store)

		looked := map[blockRef]bool{}
		wantTokens := engineLookup(req.Groups, stored, tokensPerChunk, numTokens, looked)
		if got := engineTokens(result.HitChunks, req.Groups, tokensPerChunk, numTokens); got != wantTokens {
			t.Fatalf("%s\nHitChunks %d gives %d tokens, the engine %d", describe(), result.HitChunks, got, wantTokens)
		}
		for i, g := range req.Groups {
			alone := []ctlabi.GroupSpec{g}
			want := engineLookup(alone, stored, tokensPerChunk, numTokens, looked)
			if got := engineTokens(result.PerGroup[i], alone, tokensPerChunk, numTokens); got != want {
				t.Fatalf("%s\nPerGroup[%d] %d gives %d tokens, the engine alone %d", describe(), i, result.PerGroup[i], got, want)
			}
		}
		// The engine gives up before looking when a windowed group lowers a
		// one-chunk prompt's bound under a chunk; Hit still probes then.
		oneChunkPrompt := numTokens == tokensPerChunk
		for ref := range store.probes {
			if !oneChunkPrompt && !looked[ref] {
				t.Fatalf("%s\nHit probed %v, which the engine never looks up", describe(), ref)
			}
		}

		eagles := 0
		for _, g := range req.Groups {
			if g.Kind == ctlabi.KindEagle {
				eagles++
			}
		}
		switch declarative := greatestCommonHit(req.Groups, stored); {
		case eagles <= 1 && result.HitChunks != declarative:
			t.Fatalf("%s\nHitChunks %d, want the greatest common hit %d", describe(), result.HitChunks, declarative)
		case result.HitChunks < declarative:
			t.Fatalf("%s\nHitChunks %d below the greatest common hit %d", describe(), result.HitChunks, declarative)
		}
	}
}

// BenchmarkMatch matches the field's 12,434 keys: a full group and an EAGLE
// group (tail 4, acc 16) of 6,217 chunks each, answered from a map of block
// paths as the filesystem's index would.
func BenchmarkMatch(b *testing.B) {
	const chunks = 12434 / 2
	for _, bench := range []struct {
		name     string
		retained func(kind ctlabi.GroupKind, tail, acc, chunk int) bool
	}{
		{"retained", Retained},
		{"stock-veto", StockRetained},
	} {
		b.Run(bench.name, func(b *testing.B) {
			req, store := fieldCase(chunks, bench.retained)
			index := make(map[string]struct{}, 2*chunks)
			for ref := range store.blocks {
				index[block.Name{Tier: req.Tier, Group: ref.group, Hash: ref.key}.Path()] = struct{}{}
			}
			present := func(group int, key string) bool {
				_, ok := index[block.Name{Tier: req.Tier, Group: group, Hash: key}.Path()]
				return ok
			}
			var result ctlabi.MatchResult
			for b.Loop() {
				var err error
				if result, err = Hit(req, present); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(result.Probes), "probes/op")
			b.ReportMetric(float64(result.HitChunks), "hit-chunks")
		})
	}
}
