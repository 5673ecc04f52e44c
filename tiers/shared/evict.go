package shared

import (
	"errors"
	"io/fs"
	"path"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// chainGap separates write bursts: blocks of one tier and group written behind
// less than this apart form a run, which loses its tail before its head (an
// engine stores a request's blocks in prefix order, head first).
const chainGap = time.Second

// staleTmpAge is how old a tmp file in the shared layout must be before the
// lease holder removes it: its writer crashed or was cut off (a write-behind
// takes at most --shared-timeout).
const staleTmpAge = 10 * time.Minute

// maxWalkListing bounds the names of one directory the evictor's walk reads.
const maxWalkListing = 1 << 20

// errStopping ends a walk when the level closes.
var errStopping = errors.New("shared level closing")

// stopping reports whether Close was called.
func (l *Level) stopping() bool {
	select {
	case <-l.stop:
		return true
	default:
		return false
	}
}

// sharedBlock is a block found in the shared layout.
type sharedBlock struct {
	rel      string
	name     block.Name
	bytes    int64
	lastUse  time.Time
	scanInfo FileInfo
}

// scan walks the shared layout (`<tier>/<h[0:3]>/<h[3:5]>_g<N>/<h>.bin`),
// each directory read under the bound; it also lists tmp files older than
// staleTmpAge.
func (l *Level) scan() (out []sharedBlock, staleTmps []string, err error) {
	now := l.cfg.Clock.Now()
	var walk func(rel string, depth int) error
	walk = func(rel string, depth int) error {
		entries, err := call(l.bound, func() ([]fs.DirEntry, error) { return l.dir.ReadDir(rel, maxWalkListing, nil) })
		switch {
		case errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ELOOP) || errors.Is(err, syscall.ENOTDIR):
			// Gone, or a link where a directory belongs: never walked through.
			return nil
		case errors.Is(err, errTooLarge):
			l.cfg.Logger.Warn("shared store directory too large to walk: skipped", "path", rel, "limit", maxWalkListing)
			return nil
		case err != nil:
			return err
		}
		for _, e := range entries {
			if l.stopping() {
				return errStopping
			}
			child := path.Join(rel, e.Name())
			if depth < 3 {
				if e.IsDir() && !(depth == 0 && strings.HasPrefix(e.Name(), ".")) {
					if err := walk(child, depth+1); err != nil {
						return err
					}
				}
				continue
			}
			kind, name := block.Parse(child)
			if kind == block.TmpFile {
				if info, err := call(l.bound, func() (FileInfo, error) { return l.dir.Stat(child) }); err == nil && now.Sub(info.ModTime) > staleTmpAge {
					staleTmps = append(staleTmps, child)
				}
			}
			if kind != block.File {
				continue
			}
			info, err := call(l.bound, func() (FileInfo, error) { return l.dir.Stat(child) })
			if err != nil {
				if errors.Is(err, syscall.ENOENT) {
					continue
				}
				return err
			}
			bytes := info.Allocated
			if bytes == 0 {
				bytes = info.Size
			}
			// A modification time in the future (clocks agree far better
			// than Protect) was set by hand: the block counts as the oldest,
			// never as one used a moment ago.
			lastUse := info.ModTime
			if lastUse.After(now.Add(l.cfg.Protect)) {
				lastUse = time.Time{}
			}
			out = append(out, sharedBlock{rel: child, name: name, bytes: bytes, lastUse: lastUse, scanInfo: info})
		}
		return nil
	}
	if err := walk(".", 0); err != nil {
		return nil, nil, err
	}
	return out, staleTmps, nil
}

// evictionOrder orders blocks for eviction: least recently used runs first,
// each run (blocks of one tier and group written less than chainGap apart)
// from its tail to its head.
func evictionOrder(blocks []sharedBlock) []sharedBlock {
	sort.Slice(blocks, func(i, j int) bool {
		a, b := blocks[i], blocks[j]
		if a.name.Tier != b.name.Tier {
			return a.name.Tier < b.name.Tier
		}
		if a.name.Group != b.name.Group {
			return a.name.Group < b.name.Group
		}
		return a.lastUse.Before(b.lastUse)
	})
	var runs [][]sharedBlock
	for i, b := range blocks {
		if i > 0 {
			prev := blocks[i-1]
			if prev.name.Tier == b.name.Tier && prev.name.Group == b.name.Group && b.lastUse.Sub(prev.lastUse) < chainGap {
				runs[len(runs)-1] = append(runs[len(runs)-1], b)
				continue
			}
		}
		runs = append(runs, []sharedBlock{b})
	}
	sort.SliceStable(runs, func(i, j int) bool { return runs[i][0].lastUse.Before(runs[j][0].lastUse) })
	out := make([]sharedBlock, 0, len(blocks))
	for _, r := range runs {
		for i := len(r) - 1; i >= 0; i-- {
			out = append(out, r[i])
		}
	}
	return out
}

// protected reports whether a block was used too recently to evict: written
// or touched by a fetch on any node (its modification time), or looked up here.
func (l *Level) protected(b sharedBlock, now time.Time) bool {
	if now.Sub(b.lastUse) < l.cfg.Protect {
		return true
	}
	l.reads.mu.Lock()
	defer l.reads.mu.Unlock()
	at, ok := l.reads.recent[b.rel]
	return ok && now.Sub(at) < l.cfg.Protect
}

// evict brings the shared store down to its capacity, while this node holds
// the lease: it stops at once when the lease is lost or cannot be renewed.
func (l *Level) evict() {
	// A long walk is followed by a renewal before the first removal.
	renewed := l.cfg.Clock.Now()
	blocks, staleTmps, err := l.scan()
	if errors.Is(err, errStopping) {
		return
	}
	if err != nil {
		l.cfg.Logger.Warn("shared store scan failed", "err", err)
		return
	}
	l.journalUnrecorded(blocks)
	for _, tmp := range staleTmps {
		if !l.holding() {
			return
		}
		l.bound.do(func() error { return l.dir.Remove(tmp) })
	}
	var used int64
	for _, b := range blocks {
		used += b.bytes
	}
	l.c.usedBytes.Store(used)
	if used <= l.cfg.Capacity {
		return
	}
	for _, b := range evictionOrder(blocks) {
		if used <= l.cfg.Capacity || l.stopping() {
			break
		}
		now := l.cfg.Clock.Now()
		if now.Sub(renewed) >= l.cfg.LeaseTTL/3 {
			renewed = now
			l.tryLease()
		}
		if !l.holding() {
			return
		}
		if l.protected(b, now) {
			continue
		}
		mine := l.leaseMine()
		changed, err := call(l.bound, func() (changed bool, err error) {
			// The lease is read again before every removal: a node whose
			// lease another took over removes nothing more.
			if got, err := l.dir.ReadFile(leaseFile, maxLeaseBytes); err != nil || string(got) != string(mine) {
				return false, errLeaseLost
			}
			// A block rewritten or fetched since the scan is not the one chosen.
			info, err := l.dir.Stat(b.rel)
			if err != nil {
				return false, err
			}
			if !info.sameFile(b.scanInfo) {
				return true, nil
			}
			if err := l.dir.Remove(b.rel); err != nil {
				return false, err
			}
			l.dir.Remove(b.rel + sidecarSuffix)
			l.journalRemove(b.rel)
			return false, nil
		})
		switch {
		case changed:
			continue
		case errors.Is(err, syscall.ENOENT):
			// Removed by its writer or found corrupt elsewhere meanwhile.
		case errors.Is(err, errLeaseLost):
			l.setLease(false, time.Time{}, "")
			return
		case err != nil:
			l.cfg.Logger.Warn("shared store eviction failed", "path", b.rel, "err", err)
			return
		default:
			l.c.evicted.Add(1)
		}
		used -= b.bytes
		l.c.usedBytes.Store(used)
		l.reads.remember(b.rel, false, now)
	}
}
