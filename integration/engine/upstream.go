package engine

import (
	"context"
	"fmt"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
)

// The upstream engine: vLLM main's scheduler-side lookup over its
// TieringOffloadingManager with a CPU primary tier and the fs tier, as read
// in vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py
// (get_num_new_matched_tokens, _lookup_complete_chunks,
// _maximal_prefix_lookup, _sliding_window_lookup, _touch),
// vllm/v1/kv_offload/tiering/manager.py (lookup, _initiate_promotion) and
// vllm/v1/kv_offload/tiering/async_lookup.py (AsyncLookupManager).

// lookupResult is the manager's answer for one key.
type lookupResult uint8

const (
	// resultHit: the key is ready in the primary tier.
	resultHit lookupResult = iota
	// resultHitPending: the key is being promoted into a primary row.
	resultHitPending
	// resultRetry: the fs tier's answer is not known yet.
	resultRetry
	// resultMiss: absent, or found on disk with no primary row to promote into.
	resultMiss
)

// verdict is the fs tier's cached answer for a key (AsyncLookupManager's
// lookup state): asked and pending, present or absent.
type verdict uint8

const (
	verdictPending verdict = iota + 1
	verdictPresent
	verdictAbsent
)

// upstreamMaxSteps is how many scheduler steps a request may be deferred
// ("ask again") before the model counts it parked, as the 40 steps.
const upstreamMaxSteps = 40

// upstreamRequest is one request in the upstream engine's lookup.
type upstreamRequest struct {
	keys   []string
	tokens int
	// asked is the keys whose verdict this request holds a reference to.
	asked map[blockKey]bool
	// hit is the final hit in chunks once done.
	hit  int
	done bool
}

// upstreamLookups is the state the upstream engine's lookups share across
// requests and steps: the fs tier's verdicts (kept while a request that asked
// for a key is active), this step's lookup batch, the promotions started.
type upstreamLookups struct {
	verdicts  map[blockKey]verdict
	refs      map[blockKey]int
	batch     []upstreamAsk
	promoting map[blockKey]int // block → the pinned row it is being promoted into
	started   []reservation    // promotions started this step, in order
}

// upstreamAsk is one key of a step's lookup batch and the request that
// asked for it first.
type upstreamAsk struct {
	req *upstreamRequest
	key blockKey
}

func newUpstreamLookups() *upstreamLookups {
	return &upstreamLookups{verdicts: map[blockKey]verdict{}, refs: map[blockKey]int{}, promoting: map[blockKey]int{}}
}

// lookupUpstream runs the upstream engine's lookups of requests that arrive
// together, step by step, until each has its hit (loaded to the GPUs in the
// step it was decided) or has been deferred for upstreamMaxSteps (parked:
// no hit). It returns each request's hit in chunks.
func (s *scheduler) lookupUpstream(ctx context.Context, keys [][]string, tokens []int) ([]int, error) {
	l := newUpstreamLookups()
	reqs := make([]*upstreamRequest, len(keys))
	for i := range keys {
		reqs[i] = &upstreamRequest{keys: keys[i], tokens: tokens[i], asked: map[blockKey]bool{}}
	}
	for step := 0; ; step++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		pending := 0
		for _, r := range reqs {
			if r.done {
				continue
			}
			hit, deferred := s.upstreamWalk(l, r)
			s.touchUpstream(r, hit)
			if deferred && step < upstreamMaxSteps {
				pending++
				continue
			}
			if deferred {
				hit = 0
				if s.measuring {
					s.res.ParkedRequests++
				}
			}
			if err := s.finishUpstream(l, r, hit); err != nil {
				return nil, err
			}
		}
		s.endUpstreamStep(l)
		if pending == 0 {
			break
		}
	}
	hits := make([]int, len(reqs))
	for i, r := range reqs {
		hits[i] = r.hit
	}
	return hits, nil
}

// touchUpstream is the scheduler's _touch after each lookup: the request's
// keys its primary rows hold become the most recently used, every chunk of
// a full-attention group and, of a windowed group, those from its window
// before the hit on.
func (s *scheduler) touchUpstream(r *upstreamRequest, hit int) {
	for g, group := range s.cfg.Groups {
		from := 0
		if group.Kind != ctlabi.KindFull {
			from = max(0, hit-group.Tail)
		}
		for _, hash := range r.keys[from:] {
			s.primary.touch(blockKey{group: g, hash: hash})
		}
	}
}

// finishUpstream loads a request's hit from the primary tier to the GPUs
// (prepare_load pins the rows) and drops its references to verdicts.
func (s *scheduler) finishUpstream(l *upstreamLookups, r *upstreamRequest, hit int) error {
	r.done, r.hit = true, hit
	for b := range r.asked {
		if l.refs[b]--; l.refs[b] == 0 {
			delete(l.refs, b)
			delete(l.verdicts, b)
		}
	}
	if hit == 0 {
		return nil
	}
	blocks := s.neededBlocks(r.keys, hit)
	rows := make([]int, len(blocks))
	for i, b := range blocks {
		row, resident := s.primary.find(b)
		if !resident {
			return fmt.Errorf("engine model: block %d/%s of an upstream hit is not resident", b.group, b.hash)
		}
		rows[i] = row
		s.primary.pin(row)
	}
	err := s.loadToGPUs(rows, blocks)
	for _, row := range rows {
		s.primary.unpin(row)
	}
	return err
}

// endUpstreamStep is the end of a scheduler step: the fs tier looks the
// step's batch up (one faccessat per key, each request's keys together in
// the order they were asked: async_lookup's worker), then the promotions
// started in the step load (one job per request, _flush_pending_promotions);
// a loaded row is ready and evictable, a failed one is a miss from now on
// (mark_miss).
func (s *scheduler) endUpstreamStep(l *upstreamLookups) {
	var order []*upstreamRequest
	byReq := map[*upstreamRequest][]blockKey{}
	for _, a := range l.batch {
		if _, ok := byReq[a.req]; !ok {
			order = append(order, a.req)
		}
		byReq[a.req] = append(byReq[a.req], a.key)
	}
	for _, r := range order {
		for _, b := range byReq[r] {
			if _, active := l.verdicts[b]; !active {
				continue // every request that asked has finished
			}
			if s.exists(b) {
				l.verdicts[b] = verdictPresent
			} else {
				l.verdicts[b] = verdictAbsent
			}
		}
	}
	l.batch = l.batch[:0]
	if len(l.started) == 0 {
		return
	}
	blocks, rows := make([]blockKey, len(l.started)), make([]int, len(l.started))
	for i, p := range l.started {
		blocks[i], rows[i] = p.block, p.row
	}
	for i, err := range s.promote(blocks, rows) {
		delete(l.promoting, blocks[i])
		if err != nil {
			l.verdicts[blocks[i]] = verdictAbsent
		} else {
			s.primary.assign(rows[i], blocks[i])
		}
		s.primary.unpin(rows[i])
	}
	s.res.Waves++
	l.started = l.started[:0]
}

// managerLookup is TieringOffloadingManager.lookup of one key: the primary
// tier first (ready: HIT; being promoted: HIT_PENDING), then the fs tier's
// cached verdict; a key found there starts a promotion into a primary row, a
// free one or the least recently used ready one (only rows being promoted or
// loaded are protected), or is a MISS when every row is taken.
func (s *scheduler) managerLookup(l *upstreamLookups, r *upstreamRequest, b blockKey) lookupResult {
	if _, ok := s.primary.find(b); ok {
		return resultHit
	}
	if _, ok := l.promoting[b]; ok {
		return resultHitPending
	}
	if !r.asked[b] {
		r.asked[b] = true
		l.refs[b]++
	}
	switch l.verdicts[b] {
	case 0:
		l.verdicts[b] = verdictPending
		l.batch = append(l.batch, upstreamAsk{req: r, key: b})
		return resultRetry
	case verdictPending:
		return resultRetry
	case verdictAbsent:
		return resultMiss
	}
	row, ok := s.primary.alloc()
	if !ok {
		return resultMiss
	}
	l.promoting[b] = row
	l.started = append(l.started, reservation{block: b, row: row})
	if s.measuring {
		s.res.RetryPeak = max(s.res.RetryPeak, len(l.promoting))
	}
	return resultHitPending
}

// upstreamWalk is _lookup_complete_chunks for a request with nothing
// computed locally: full-attention groups by a prefix lookup, windowed groups
// by a scan from the end (largest window first), an unverified EAGLE group
// asking one chunk more and dropping it, and another pass over the groups
// whenever a later group shrinks the hit. It returns the hit in chunks, or
// deferred when some key was not ready (the request asks again next step).
func (s *scheduler) upstreamWalk(l *upstreamLookups, r *upstreamRequest) (hit int, deferred bool) {
	chunk := s.cfg.TokensPerChunk
	order := s.lookupOrder()
	var windowGroups []int
	maxHit := r.tokens
	for _, g := range order {
		if s.cfg.Groups[g].Kind != ctlabi.KindFull {
			windowGroups = append(windowGroups, g)
		}
	}
	if len(windowGroups) > 0 {
		maxHit-- // the last prompt token is recomputed
	}
	numHit := 0
	deferLookup := false
	eagleVerified := map[int]bool{}
	for groups := order; len(groups) > 0; {
		lookedUpWindow := false
		pass := groups
		groups = nil
		for _, g := range pass {
			group := s.cfg.Groups[g]
			eagleUnverified := group.Kind == ctlabi.KindEagle && !eagleVerified[g]
			maxHit = min(maxHit, len(r.keys)*chunk)
			if maxHit < chunk {
				return 0, false
			}
			queryMax := maxHit
			if eagleUnverified {
				queryMax = min(maxHit+chunk, len(r.keys)*chunk)
			}
			keys := r.keys[:min((queryMax+chunk-1)/chunk, len(r.keys))]
			var n int
			var known bool
			if group.Kind == ctlabi.KindFull {
				n, known = s.prefixLookup(l, r, g, keys)
			} else {
				window := group.Tail
				if eagleUnverified {
					window++
				}
				n, known = s.windowLookup(l, r, g, keys, window)
			}
			if known && n == 0 {
				return 0, false
			}
			if !known {
				deferLookup = true
			} else {
				if eagleUnverified {
					n--
					eagleVerified[g] = true
				}
				maxHit = min(maxHit, chunk*n)
			}
			if maxHit < chunk {
				return 0, false
			}
			if maxHit < numHit {
				if group.Kind != ctlabi.KindEagle {
					clear(eagleVerified)
				}
				switch {
				case deferLookup:
					deferLookup = false
					groups = order
				case lookedUpWindow && len(groups) == 0:
					groups = windowGroups
				}
			}
			lookedUpWindow = lookedUpWindow || group.Kind != ctlabi.KindFull
			numHit = maxHit
		}
	}
	if deferLookup {
		return 0, true
	}
	return numHit / chunk, false
}

// prefixLookup is _maximal_prefix_lookup: keys from the start until the
// first MISS; a pending key counts (HIT_PENDING) or not (RETRY) and defers.
func (s *scheduler) prefixLookup(l *upstreamLookups, r *upstreamRequest, group int, keys []string) (int, bool) {
	hit, deferred := 0, false
	for _, hash := range keys {
		switch s.managerLookup(l, r, blockKey{group: group, hash: hash}) {
		case resultHit:
			hit++
		case resultHitPending:
			hit++
			deferred = true
		case resultRetry:
			deferred = true
		case resultMiss:
			return hit, !deferred
		}
	}
	return hit, !deferred
}

// windowLookup is _sliding_window_lookup: from the end, the end index of
// the first run of window consecutive hits (HIT_PENDING counts, RETRY and
// MISS break the run).
func (s *scheduler) windowLookup(l *upstreamLookups, r *upstreamRequest, group int, keys []string, window int) (int, bool) {
	run, deferred := 0, false
	for idx := len(keys) - 1; idx >= 0; idx-- {
		switch s.managerLookup(l, r, blockKey{group: group, hash: keys[idx]}) {
		case resultHit:
			run++
		case resultHitPending:
			run++
			deferred = true
		case resultRetry:
			run = 0
			deferred = true
		case resultMiss:
			run = 0
		}
		if run == window {
			return idx + window, !deferred
		}
	}
	return run, !deferred
}
