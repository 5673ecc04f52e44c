package match

import (
	"cmp"
	"slices"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
)

// What Hit follows.
//
// vLLM's OffloadingConnectorScheduler._lookup, with _maximal_prefix_lookup and
// _sliding_window_lookup (vllm/distributed/kv_transfer/kv_connector/v1/
// offloading/scheduler.py, in the versions with EAGLE draft groups and the SWA
// store alignment filter), read for its rules and restated here in chunks,
// with no GPU-computed prefix and every lookup answered by presence alone:
//
//   - The candidate hit starts at the number of complete chunks, N. The engine
//     first lowers its token bound by one when any group is windowed (the last
//     prompt token is recomputed); with chunks of two tokens or more (vLLM's
//     are block_size × blocks_per_chunk) that bound still ends inside chunk N,
//     so the chunks a lookup reads are the same. The engine then reports
//     min(HitChunks × tokens per chunk, its bound) tokens, or none when that is
//     under one chunk. A caller wanting a lower bound sends fewer keys.
//   - Groups are looked up full attention first (by group index), then the
//     windowed groups by window size, largest first (ties by group index).
//   - Full attention (_maximal_prefix_lookup): the hit is the number of leading
//     present chunks among the candidate's.
//   - Sliding window (_sliding_window_lookup): scanning back from the
//     candidate's end, the hit is the end of the last run of `tail` present
//     chunks; a run that reaches chunk 0 counts even when shorter than the
//     window (nothing precedes it); no run at all is a miss.
//   - An unverified EAGLE group queries one chunk past the candidate (capped at
//     N), needs a run of tail+1, then drops one chunk (num_hit_chunks -= 1) and
//     is marked verified. The drop mirrors the GPU prefix cache
//     (find_longest_cache_hit in vllm/v1/core/single_type_kv_cache_manager.py),
//     which drops the last matched block under EAGLE so the draft model's
//     input for it is recomputed. A verified EAGLE group is looked up like a plain
//     sliding group. The verified marks are cleared whenever a non-EAGLE group
//     shrinks the hit, so the drop is redone at the new candidate.
//   - Any group with no hit, or a hit shrunk to zero, vetoes the whole lookup
//     (return 0): groups are ANDed.
//   - Each lookup can only lower the candidate. When one lowers it after a
//     windowed group was already looked up in the same pass, all windowed
//     groups are looked up again; passes repeat until none lowers it. Full
//     attention needs no second look: a shorter prefix of a present prefix is
//     present.
//
// One consequence kept on purpose: with two EAGLE groups, when the second one's
// drop lowers the candidate, the first is re-checked as verified, i.e. with a
// run of `tail`, not tail+1; Hit answers what the engine would compute.
// Not modelled: deferred (asynchronous) lookups and the in-flight-load check,
// which are about timing, not presence; groups with different chunk sizes
// (every group here has one key per chunk); and full-attention draft groups
// (KindEagle is a windowed draft group).

// Hit computes the engine's hit for req under vLLM's lookup rules (see the
// comment at the top of this file) with one call per needed (group, chunk)
// to present, which reports whether the group's block for key is stored.
// Hit stages and pins nothing; it only calls present, from the calling
// goroutine, and never twice for the same group and chunk. It returns a
// *RequestError or an ErrRequestTooLarge error for an invalid request.
func Hit(req ctlabi.MatchRequest, present func(group int, key string) bool) (ctlabi.MatchResult, error) {
	if err := req.Validate(); err != nil {
		return ctlabi.MatchResult{}, err
	}
	m := newMatcher(req.Groups, present)
	result := ctlabi.MatchResult{HitChunks: m.combinedHit(), PerGroup: make([]int, len(req.Groups))}
	for g := range req.Groups {
		result.PerGroup[g] = m.aloneHit(g)
	}
	result.Probes = m.probes
	return result, nil
}

type chunkState uint8

const (
	unprobed chunkState = iota
	stored
	absent
)

// matcher memoises present per (group, chunk); groups are indexed as in the
// request. skip[g][c] leads, through a chain that find compresses, to the
// first chunk at or after c not known to be stored, so a lookup steps over
// runs it already knows in one go: the engine's passes may look a group up
// once per chunk of the prompt, and walking the same known run each time
// cost a request of 2^18 keys seconds of CPU.
type matcher struct {
	groups  []ctlabi.GroupSpec
	chunks  int
	present func(group int, key string) bool
	state   [][]chunkState
	skip    [][]int32
	probes  int
}

func newMatcher(groups []ctlabi.GroupSpec, present func(group int, key string) bool) *matcher {
	m := &matcher{groups: groups, chunks: len(groups[0].Keys), present: present,
		state: make([][]chunkState, len(groups)), skip: make([][]int32, len(groups))}
	for g := range groups {
		m.state[g] = make([]chunkState, m.chunks)
		m.skip[g] = make([]int32, m.chunks+1)
		for c := range m.skip[g] {
			m.skip[g][c] = int32(c)
		}
	}
	return m
}

func (m *matcher) has(g, chunk int) bool {
	if state := m.state[g][chunk]; state != unprobed {
		return state == stored
	}
	m.probes++
	if m.present(m.groups[g].Group, m.groups[g].Keys[chunk]) {
		m.state[g][chunk] = stored
		m.skip[g][chunk] = int32(chunk + 1)
		return true
	}
	m.state[g][chunk] = absent
	return false
}

// nextNotStored returns the first chunk at or after c of group g not known
// to be stored (m.chunks if none), compressing the skip chain it follows.
func (m *matcher) nextNotStored(g, c int) int {
	skip := m.skip[g]
	root := c
	for int(skip[root]) != root {
		root = int(skip[root])
	}
	for int(skip[c]) != root {
		c, skip[c] = int(skip[c]), int32(root)
	}
	return root
}

// leadingRun returns how many of the chunks [0, limit) are present before the
// first absent one.
func (m *matcher) leadingRun(g, limit int) int {
	n := 0
	for n < limit && m.has(g, n) {
		n++
	}
	return n
}

// lastRunEnd returns the largest end <= limit such that the chunks
// [max(0, end-window), end) are all present, or 0 when there is none: the
// answer of vLLM's backward scan, whose run touching chunk 0 counts even when
// shorter than the window. Rather than probing every chunk from the end, it
// checks each candidate window from its oldest chunk forward; an absent chunk
// rules out every window containing it, so the next candidate ends there, and
// the present chunks just checked are the newest of that next window. It thus
// probes a subset of what the engine's scan probes, and an absent chunk can
// skip a whole window.
func (m *matcher) lastRunEnd(g, limit, window int) int {
	end := limit
	knownFrom := end // chunks [knownFrom, end) are known present
	for end > 0 {
		start := max(0, end-window)
		gap := -1
		for c := m.nextNotStored(g, start); c < knownFrom; c = m.nextNotStored(g, c) {
			if !m.has(g, c) {
				gap = c
				break
			}
		}
		if gap < 0 {
			return end
		}
		end, knownFrom = gap, start
	}
	return 0
}

// lookup returns the hit group g allows with the candidate hit h (1 <= h <=
// N), never more than h; 0 is a veto. An unverified EAGLE group queries one
// chunk past h, needs tail+1 chunks and drops one.
func (m *matcher) lookup(g, h int, unverifiedEagle bool) int {
	spec := m.groups[g]
	switch {
	case spec.Kind == ctlabi.KindFull:
		return m.leadingRun(g, h)
	case unverifiedEagle:
		end := m.lastRunEnd(g, min(h+1, m.chunks), spec.Tail+1)
		if end == 0 {
			return 0
		}
		return end - 1
	default:
		return m.lastRunEnd(g, h, spec.Tail)
	}
}

// aloneHit is the hit group g allows when it is the only group.
func (m *matcher) aloneHit(g int) int {
	if m.chunks == 0 {
		return 0
	}
	return m.lookup(g, m.chunks, m.groups[g].Kind == ctlabi.KindEagle)
}

// combinedHit runs the engine's lookup loop over all groups.
func (m *matcher) combinedHit() int {
	if m.chunks == 0 {
		return 0
	}
	order := lookupOrder(m.groups)
	numFull := 0
	for _, g := range m.groups {
		if g.Kind == ctlabi.KindFull {
			numFull++
		}
	}
	windowed := order[numFull:]
	h := m.chunks
	previous := 0 // the hit after the previous lookup, 0 before the first
	verified := make([]bool, len(m.groups))
	for pass := order; len(pass) > 0; {
		var next []int
		windowedLookedUp := false
		for _, g := range pass {
			kind := m.groups[g].Kind
			unverifiedEagle := kind == ctlabi.KindEagle && !verified[g]
			h = m.lookup(g, h, unverifiedEagle)
			if h == 0 {
				return 0
			}
			if unverifiedEagle {
				verified[g] = true
			}
			if h < previous {
				if kind != ctlabi.KindEagle {
					clear(verified)
				}
				if windowedLookedUp && next == nil {
					next = windowed
				}
			}
			windowedLookedUp = windowedLookedUp || kind != ctlabi.KindFull
			previous = h
		}
		pass = next
	}
	return h
}

// lookupOrder returns the group indices in the engine's lookup order: full
// attention by group id, then windowed groups by tail descending, then id.
func lookupOrder(groups []ctlabi.GroupSpec) []int {
	order := make([]int, len(groups))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		ga, gb := groups[a], groups[b]
		if fullA, fullB := ga.Kind == ctlabi.KindFull, gb.Kind == ctlabi.KindFull; fullA != fullB {
			if fullA {
				return -1
			}
			return 1
		}
		return cmp.Or(cmp.Compare(gb.Tail, ga.Tail), cmp.Compare(ga.Group, gb.Group))
	})
	return order
}
