package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
	"github.com/kvtierfs/kvtierfs/integration/engineio"
	"github.com/kvtierfs/kvtierfs/staging/match"
)

// scheduler is the head node's engine: primary tier, lookups, promotions,
// stores, and the connector metadata that tells every worker which rows to
// store into or load from.
type scheduler struct {
	cfg     Config
	head    *node
	tier    *engineio.Tier
	tierDir string
	primary *primaryTier
	workers []*worker
	kv      *kvIndex
	res     *Result
	// measuring is set while the scenario's measured requests run; the
	// per-request figures count only those.
	measuring   bool
	loadSeconds float64
	reporter    *progressReporter
	// io feeds the engine's tier I/O threads (startIOThreads).
	io      chan func()
	profile *phaseProfile // --profile; nil without
}

// newScheduler opens the tier on the head node's mount as the engine does (the
// O_DIRECT probe) and writes the model's config.json.
func newScheduler(cfg Config, head *node, workers []*worker, res *Result, reporter *progressReporter) (*scheduler, error) {
	tier, err := engineio.OpenTier(head.mountpoint)
	if err != nil {
		return nil, fmt.Errorf("opening the tier on %s: %w", head.mountpoint, err)
	}
	s := &scheduler{
		cfg:      cfg,
		head:     head,
		tier:     tier,
		primary:  newPrimaryTier(cfg.Rows),
		workers:  workers,
		kv:       newKVIndex(),
		res:      res,
		reporter: reporter,
	}
	base, config, err := modelDir(cfg)
	if err != nil {
		return nil, err
	}
	s.tierDir = base + "_r0"
	if err := os.MkdirAll(filepath.Join(head.mountpoint, base), 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(head.mountpoint, base, "config.json"), config, 0o644); err != nil {
		return nil, fmt.Errorf("writing the tier's config.json: %w", err)
	}
	return s, nil
}

// modelDir returns the engine's `<model>_<digest12>` directory name and the
// config.json it holds; the digest covers everything that changes the bytes
// of a block.
func modelDir(cfg Config) (string, []byte, error) {
	config, err := json.MarshalIndent(map[string]any{
		"model":            cfg.Model,
		"row_bytes":        cfg.RowBytes,
		"tokens_per_chunk": cfg.TokensPerChunk,
		"world_size":       cfg.WorldSize,
		"kv":               cfg.KV,
		"groups":           FormatGroups(cfg.Groups),
		"hash":             "sha256",
	}, "", "  ")
	if err != nil {
		return "", nil, err
	}
	digest := sha256.Sum256(config)
	return cfg.Model + "_" + hex.EncodeToString(digest[:])[:12], append(config, '\n'), nil
}

// blockPath is the block's file under the head's mount.
func (s *scheduler) blockPath(b blockKey) string {
	return s.tier.BlockPath(s.tierDir, b.group, b.hash)
}

// exists is the engine's lookup of one block: faccessat through the mount.
func (s *scheduler) exists(b blockKey) bool {
	s.res.Lookups++
	return s.tier.Exists(s.blockPath(b))
}

// retained is the engine's store filter: which chunks of a group it stores.
func (s *scheduler) retained(g Group, chunk int) bool {
	if s.cfg.Engine == EngineStock {
		return match.StockRetained(g.Kind, g.Tail, g.Acc, chunk)
	}
	// The upstream engine has the EAGLE store filter fixed (vLLM #52771).
	return match.Retained(g.Kind, g.Tail, g.Acc, chunk)
}

// matchRequest is the engine's lookup of a prompt's keys in every group.
func (s *scheduler) matchRequest(keys []string) ctlabi.MatchRequest {
	req := ctlabi.MatchRequest{Tier: s.tierDir, Groups: make([]ctlabi.GroupSpec, len(s.cfg.Groups))}
	for i, g := range s.cfg.Groups {
		req.Groups[i] = ctlabi.GroupSpec{Group: i, Kind: g.Kind, Tail: g.Tail, Acc: g.Acc, Keys: keys}
	}
	return req
}

// neededBlocks lists the blocks a hit of `hit` chunks loads, chunk by chunk:
// every chunk of a full-attention group, the last Tail chunks of a windowed one.
func (s *scheduler) neededBlocks(keys []string, hit int) []blockKey {
	var blocks []blockKey
	for c := 0; c < hit; c++ {
		for g, group := range s.cfg.Groups {
			if group.Kind == ctlabi.KindFull || c >= hit-group.Tail {
				blocks = append(blocks, blockKey{group: g, hash: keys[c]})
			}
		}
	}
	return blocks
}

// serve runs one request: lookup, load of the hit, prefill and store of the
// rest. A measured request counts towards the coverage.
func (s *scheduler) serve(ctx context.Context, tokens []uint32) error {
	return s.serveTogether(ctx, [][]uint32{tokens})
}

// serveTogether runs requests that arrive at once: their lookups and loads
// (in the same scheduler steps for the upstream engine, one after another
// for the others), then the prefill and store of each one's rest.
func (s *scheduler) serveTogether(ctx context.Context, prompts [][]uint32) error {
	keys := make([][]string, len(prompts))
	tokens := make([]int, len(prompts))
	for i, p := range prompts {
		keys[i], tokens[i] = chunkHashes(p, s.cfg.TokensPerChunk, s.cfg.HashSeed), len(p)
	}
	hits, err := s.lookup(ctx, keys, tokens)
	if err != nil {
		return err
	}
	for i, hit := range hits {
		if s.measuring {
			s.res.Requests++
			s.res.TokensTotal += int64(tokens[i])
			s.res.TokensHit += int64(hit * s.cfg.TokensPerChunk)
			if hit == 0 {
				s.res.ZeroHitRequests++
			}
		}
		if err := s.prefill(ctx, keys[i], hit); err != nil {
			return err
		}
	}
	return nil
}

// lookup runs the engine's lookups of requests that arrive together and
// returns each one's hit in chunks.
func (s *scheduler) lookup(ctx context.Context, keys [][]string, tokens []int) ([]int, error) {
	if s.cfg.Engine == EngineUpstream {
		return s.lookupUpstream(ctx, keys, tokens)
	}
	lookup := s.lookupFixed
	if s.cfg.Engine == EngineStock {
		lookup = s.lookupStock
	}
	hits := make([]int, len(keys))
	for i, k := range keys {
		var err error
		if hits[i], err = lookup(ctx, k); err != nil {
			return nil, err
		}
	}
	return hits, nil
}

// reservation is a row reserved for promoting block by the stock lookup.
type reservation struct {
	block blockKey
	row   int
}

// lookupStock is the stock engine's lookup (see the package doc): each step
// walks every key of every group, reserving a row per key found on disk, and
// runs the match rule on the keys resident or reserved; it repeats until
// nothing is left to promote, then loads the hit from the primary tier. It
// returns the hit in chunks.
func (s *scheduler) lookupStock(ctx context.Context, keys []string) (int, error) {
	held := newRowSet()
	defer func() {
		for _, row := range held.rows {
			s.primary.unpin(row)
		}
	}()
	req := s.matchRequest(keys)
	for {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		found, reserved := s.stockWalk(keys, held)
		present := func(group int, hash string) bool { return found[blockKey{group: group, hash: hash}] }
		match, err := match.Hit(req, present)
		if err != nil {
			return 0, err
		}
		if s.measuring {
			s.res.RetryPeak = max(s.res.RetryPeak, len(reserved))
		}
		if match.HitChunks == 0 {
			for _, r := range reserved {
				s.primary.unpin(r.row)
			}
			return 0, nil
		}
		if len(reserved) == 0 {
			blocks := s.neededBlocks(keys, match.HitChunks)
			rows := make([]int, len(blocks))
			for i, b := range blocks {
				var resident bool
				if rows[i], resident = s.primary.find(b); !resident {
					return 0, fmt.Errorf("engine model: block %d/%s of a stock hit is not resident", b.group, b.hash)
				}
			}
			return match.HitChunks, s.loadToGPUs(rows, blocks)
		}
		blocks, rows := make([]blockKey, len(reserved)), make([]int, len(reserved))
		for i, r := range reserved {
			blocks[i], rows[i] = r.block, r.row
		}
		failed := false
		for i, err := range s.promote(blocks, rows) {
			if err != nil {
				s.primary.unpin(rows[i])
				failed = true
				continue
			}
			s.primary.assign(rows[i], blocks[i])
			held.add(rows[i])
		}
		s.res.Waves++
		if failed {
			return 0, nil
		}
	}
}

// stockWalk is one step of the stock manager's lookup: every key of every
// group, groups in the engine's lookup order, keys in prefix order. A key
// resident in the primary tier is a hit (pinned for the request in held); a
// key on disk reserves a row for its promotion (RETRY); a key on disk with no
// row left, or absent, is a MISS. It returns the keys that were hits or
// RETRY, and the reservations.
func (s *scheduler) stockWalk(keys []string, held *rowSet) (map[blockKey]bool, []reservation) {
	found := make(map[blockKey]bool)
	var reserved []reservation
	for _, group := range s.lookupOrder() {
		for _, hash := range keys {
			b := blockKey{group: group, hash: hash}
			if row, ok := s.primary.find(b); ok {
				if held.add(row) {
					s.primary.pin(row)
				}
				found[b] = true
				continue
			}
			if !s.exists(b) {
				continue
			}
			if row, ok := s.primary.alloc(); ok {
				reserved = append(reserved, reservation{block: b, row: row})
				found[b] = true
			}
		}
	}
	return found, reserved
}

// rowSet is a set of rows that remembers the order they were added in, so
// releasing them leaves the same LRU order on every run.
type rowSet struct {
	has  map[int]bool
	rows []int
}

func newRowSet() *rowSet { return &rowSet{has: map[int]bool{}} }

// add adds row and reports whether it was new.
func (r *rowSet) add(row int) bool {
	if r.has[row] {
		return false
	}
	r.has[row] = true
	r.rows = append(r.rows, row)
	return true
}

// lookupOrder is the engine's order of the groups' lookups: full attention by
// group id, then windowed groups by window, largest first.
func (s *scheduler) lookupOrder() []int {
	order := make([]int, len(s.cfg.Groups))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		ga, gb := s.cfg.Groups[a], s.cfg.Groups[b]
		if fullA, fullB := ga.Kind == ctlabi.KindFull, gb.Kind == ctlabi.KindFull; fullA != fullB {
			if fullA {
				return -1
			}
			return 1
		}
		return gb.Tail - ga.Tail
	})
	return order
}

// lookupFixed is the fixed engine's lookup: match without staging (one
// request to the mount's .kvtier/match), then stage the hit's blocks in
// waves sized to the rows that can be allocated, loading each wave to the
// GPUs and releasing its rows before the next. It returns the hit in chunks.
func (s *scheduler) lookupFixed(ctx context.Context, keys []string) (int, error) {
	hit, err := s.matchThroughMount(keys)
	if err != nil || hit == 0 {
		return 0, err
	}
	needed := s.neededBlocks(keys, hit)
	for step := 0; len(needed) > 0; step++ {
		if step > 0 && s.cfg.StepGap > 0 {
			// The engine computes on what the previous wave loaded.
			time.Sleep(s.cfg.StepGap)
		}
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		var wave, fetch []blockKey
		var rows, fetchRows []int
		for ; len(needed) > 0; needed = needed[1:] {
			b := needed[0]
			row, ok := s.primary.find(b)
			if ok {
				s.primary.pin(row)
			} else if row, ok = s.primary.alloc(); ok {
				fetch, fetchRows = append(fetch, b), append(fetchRows, row)
			} else {
				break
			}
			wave, rows = append(wave, b), append(rows, row)
		}
		if len(wave) == 0 {
			return 0, fmt.Errorf("no primary row to stage into: all %d rows are pinned", s.primary.rows())
		}
		failed := false
		start := time.Now()
		errs := s.promote(fetch, fetchRows)
		if step > 0 {
			s.res.LaterWaveWaitSeconds += time.Since(start).Seconds()
		}
		for i, err := range errs {
			if err != nil {
				failed = true
				continue
			}
			s.primary.assign(fetchRows[i], fetch[i])
		}
		if len(fetch) > 0 {
			s.res.Waves++
		}
		if !failed {
			err = s.loadToGPUs(rows, wave)
		}
		for _, row := range rows {
			s.primary.unpin(row)
		}
		switch {
		case err != nil:
			return 0, err
		case failed:
			return 0, nil
		}
		s.progress("wave %d: %d blocks staged, %d to go", s.res.Waves, len(fetch), len(needed))
	}
	return hit, nil
}

// matchThroughMount asks the head's MOUNTPOINT/.kvtier/match for the hit of
// keys under the engine's rules; its probes count as lookups.
func (s *scheduler) matchThroughMount(keys []string) (int, error) {
	req, err := ctlabi.EncodeMatchRequest(s.matchRequest(keys))
	if err != nil {
		return 0, err
	}
	f, err := os.OpenFile(filepath.Join(s.head.mountpoint, ctlabi.Dir, ctlabi.MatchFile), os.O_RDWR, 0)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	if _, err := f.Write(req); err != nil {
		return 0, fmt.Errorf("writing the match request: %w", err)
	}
	answer, err := io.ReadAll(io.NewSectionReader(f, 0, 1<<20))
	if err != nil {
		return 0, fmt.Errorf("reading the match answer: %w", err)
	}
	res, err := ctlabi.DecodeMatchResult(answer)
	if err != nil {
		return 0, err
	}
	s.res.Lookups += int64(res.Probes)
	return res.HitChunks, nil
}

// promote reads blocks from the tier into rows of the head's region, as the
// engine's load threads do; a failed load has deleted the file.
func (s *scheduler) promote(blocks []blockKey, rows []int) []error {
	start := time.Now()
	errs := s.onIOThreads(len(blocks), func(i int) error {
		return s.tier.Load(s.blockPath(blocks[i]), s.head.region.Row(rows[i]))
	})
	s.loadSeconds += time.Since(start).Seconds()
	for _, err := range errs {
		if err != nil {
			s.res.LoadErrors++
			continue
		}
		s.res.RowsPromoted++
		s.res.BytesRead += int64(s.cfg.RowBytes)
	}
	return errs
}

// loadToGPUs has every rank load its slot of rows into its GPU and counts the
// rows whose KV is right on every rank.
func (s *scheduler) loadToGPUs(rows []int, blocks []blockKey) error {
	right := make([][]bool, len(s.workers))
	err := onEveryRank(s.workers, func(w *worker) error {
		var err error
		right[w.rank], err = w.loadKV(rows, blocks, s.kv)
		return err
	})
	if err != nil {
		return err
	}
	for i := range rows {
		identical := true
		for _, rank := range right {
			identical = identical && rank[i]
		}
		s.res.RowsChecked++
		if identical {
			s.res.RowsIdentical++
		}
	}
	return nil
}

// prefill computes the chunks from hit on: every rank stores the KV of the
// blocks the engine's filter retains into rows of its node's region (GPU→CPU),
// then the head stores those rows to the tier (CPU→disk), in batches of the
// rows that can be allocated.
func (s *scheduler) prefill(ctx context.Context, keys []string, hit int) error {
	var pending []blockKey
	for c := hit; c < len(keys); c++ {
		for g, group := range s.cfg.Groups {
			b := blockKey{group: g, hash: keys[c]}
			if _, resident := s.primary.find(b); !resident && s.retained(group, c) {
				pending = append(pending, b)
			}
		}
	}
	done := 0
	for len(pending) > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		var rows []int
		for len(rows) < len(pending) {
			row, ok := s.primary.alloc()
			if !ok {
				break
			}
			rows = append(rows, row)
		}
		if len(rows) == 0 {
			return fmt.Errorf("no primary row to store into: all %d rows are pinned", s.primary.rows())
		}
		batch := pending[:len(rows)]
		pending = pending[len(rows):]
		onEveryRank(s.workers, func(w *worker) error {
			w.storeKV(rows, batch, s.kv)
			return nil
		})
		stored := make([]bool, len(batch))
		errs := s.onIOThreads(len(batch), func(i int) error {
			var err error
			stored[i], err = s.tier.Store(s.blockPath(batch[i]), s.head.region.Row(rows[i]))
			return err
		})
		for i, row := range rows {
			switch {
			case errs[i] != nil:
				s.res.StoreErrors++
			case stored[i]:
				s.res.BytesWritten += int64(s.cfg.RowBytes)
			}
			s.primary.assign(row, batch[i])
			s.primary.unpin(row)
		}
		done += len(batch)
		s.progress("prefill: %d of %d blocks stored", done, done+len(pending))
	}
	return nil
}

// onIOThreads runs job(0…n-1) on the engine's tier I/O threads.
func (s *scheduler) onIOThreads(n int, job func(i int) error) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		s.io <- func() {
			defer wg.Done()
			errs[i] = job(i)
		}
	}
	wg.Wait()
	return errs
}

// startIOThreads starts the engine's pool of IOThreads tier I/O threads,
// which live as long as the engine, as its worker's thread pool does, and
// like the engine's receive no signals (see OwnSignalFreeThread). close
// ends them.
func (s *scheduler) startIOThreads() {
	s.io = make(chan func())
	for range s.cfg.IOThreads {
		go func() {
			engineio.OwnSignalFreeThread()
			for job := range s.io {
				job()
			}
		}()
	}
}

// close ends the I/O threads.
func (s *scheduler) close() {
	close(s.io)
}

// restart forgets the primary tier, as an engine restart does: every later
// hit has to come from the disk tier.
func (s *scheduler) restart() {
	s.primary.reset()
}

// progress reports a long run's progress.
func (s *scheduler) progress(format string, args ...any) {
	s.reporter.report(format, args...)
}
