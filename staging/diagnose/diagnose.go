// Package diagnose holds the field diagnostics (issue 4): the filesystem
// sees every store, lookup and load of the engine, which is enough to name
// the failures that cost the field weeks, as stat's warnings (the
// ctlabi.Warn* codes of write_only_group, write_only_tier, hash_seed_drift
// and primary_tier_exhausted). Each rule needs evidence over a sliding
// window, so a short burst or a fresh mount does not trigger it.
package diagnose

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// Defaults of the diagnostics options that the mount's flags show.
const (
	// DefaultWindow is the default Window.
	DefaultWindow = 10 * time.Minute
	// DefaultMinStoredBytes is the default MinStoredBytes: 1 GiB.
	DefaultMinStoredBytes = 1 << 30
	// MaxReadGrace caps the default ReadGrace, a quarter of the Window.
	MaxReadGrace = 30 * time.Second
)

// Options are the windows and thresholds of the diagnostics.
// Zero fields take the defaults.
type Options struct {
	// Window is how far back the rules look; none fires before the mount
	// has been up for a whole window. Default DefaultWindow.
	Window time.Duration
	// ReadGrace is how long a key that answered present may go unread
	// before it counts as waiting. Default a quarter of Window, at most
	// MaxReadGrace.
	ReadGrace time.Duration
	// MinStoredBytes is the bytes a group (write_only_group) or the whole
	// tier (write_only_tier) must have stored in the window. Default
	// DefaultMinStoredBytes.
	MinStoredBytes int64
	// MinLookups is the lookups in the window hash_seed_drift needs.
	// Default 1000.
	MinLookups int64
	// MaxHitRatio is the largest share of lookups answering present that
	// still counts as finding almost nothing. Default 0.01.
	MaxHitRatio float64
	// MinStores is the blocks stored in the window hash_seed_drift needs.
	// Default 100.
	MinStores int64
	// MinNeverLookedUp is the stored blocks never looked up since the mount
	// that hash_seed_drift needs; they must also be half the store or more.
	// Default 1000.
	MinNeverLookedUp int64
	// MinWaiting is the fewest waiting keys primary_tier_exhausted needs.
	// Default 64.
	MinWaiting int
	// PinTolerance is how close to the primary region's row count counts as
	// pinned at it, as a fraction of the rows. Default 0.1.
	PinTolerance float64
	// MaxTrackedKeys bounds the keys remembered as waiting. Default 1<<18.
	MaxTrackedKeys int
	// MaxTrackedGroups bounds the (tier, group) pairs counted; beyond it the
	// least recently counted are forgotten. Default 1024.
	MaxTrackedGroups int
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// StoreState is what the diagnostics need to know beyond the events, read
// when the warnings are computed.
type StoreState struct {
	// Blocks is the number of blocks in the store.
	Blocks int64
	// NeverLookedUp is the number of those never looked up since the mount.
	NeverLookedUp int64
	// PrimaryRows is the row count of the engine's primary (shm) region;
	// 0 when unknown, which disables primary_tier_exhausted.
	PrimaryRows int
}

// Diagnostics turns the filesystem's events into warnings. Its methods are
// safe for concurrent use; mu guards all its state.
type Diagnostics struct {
	opts  Options
	start time.Time

	mu      sync.Mutex
	groups  map[groupID]*window     // per tier directory and group
	uses    uint64                  // counts made, which order the groups by recent use
	waiting map[block.Ref]*presence // keys that answered present and have not been read since
}

// presence is when a waiting key first and last answered present.
type presence struct {
	first, last time.Time
}

// positiveOr sets *v to def unless *v is positive.
func positiveOr[T int | int64 | float64 | time.Duration](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}

// New starts the diagnostics; the mount's uptime counts from now.
func New(opts Options) *Diagnostics {
	positiveOr(&opts.Window, DefaultWindow)
	positiveOr(&opts.ReadGrace, min(MaxReadGrace, opts.Window/4))
	positiveOr(&opts.MinStoredBytes, DefaultMinStoredBytes)
	positiveOr(&opts.MinLookups, 1000)
	positiveOr(&opts.MaxHitRatio, 0.01)
	positiveOr(&opts.MinStores, 100)
	positiveOr(&opts.MinNeverLookedUp, 1000)
	positiveOr(&opts.MinWaiting, 64)
	positiveOr(&opts.PinTolerance, 0.1)
	positiveOr(&opts.MaxTrackedKeys, 1<<18)
	positiveOr(&opts.MaxTrackedGroups, 1024)
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Diagnostics{
		opts:    opts,
		start:   opts.Now(),
		groups:  make(map[groupID]*window),
		waiting: make(map[block.Ref]*presence),
	}
}

// Stored records a block stored (its rename landed) with its size.
func (d *Diagnostics) Stored(key block.Ref, bytes int64) {
	d.count(key, func(t *tally) {
		t.storedBlocks++
		t.storedBytes += bytes
	})
}

// Read records a load of a block (its open for a load, or the bytes
// served), with its size.
func (d *Diagnostics) Read(key block.Ref, bytes int64) {
	d.mu.Lock()
	_, wasWaiting := d.waiting[key]
	delete(d.waiting, key)
	d.mu.Unlock()
	d.count(key, func(t *tally) {
		t.readBlocks++
		t.readBytes += bytes
		if wasWaiting {
			t.waitedReads++
		}
	})
}

// LookedUp records the answer to a lookup of key.
func (d *Diagnostics) LookedUp(key block.Ref, present bool) {
	now := d.opts.Now()
	d.mu.Lock()
	if present {
		if p := d.waiting[key]; p != nil {
			p.last = now
		} else {
			if len(d.waiting) >= d.opts.MaxTrackedKeys {
				d.countWaitingLocked(now)
			}
			if len(d.waiting) < d.opts.MaxTrackedKeys {
				d.waiting[key] = &presence{first: now, last: now}
			}
		}
	}
	d.mu.Unlock()
	d.count(key, func(t *tally) {
		t.lookups++
		if present {
			t.lookupHits++
		}
	})
}

// MissedLookup records a lookup that failed before reaching a block: a
// directory of the tier layout (`<h[0:3]>` or `<h[3:5]>_g<group>`) is
// missing, as it is for most absent keys. group is -1 when the path did not
// get as far as the group directory.
func (d *Diagnostics) MissedLookup(tier string, group int) {
	d.add(groupID{tier: tier, group: group}, func(t *tally) { t.lookups++ })
}

// count applies add to the current bucket of key's group.
func (d *Diagnostics) count(key block.Ref, add func(*tally)) { d.add(groupOf(key), add) }

// add applies add to the current bucket of a tier group.
func (d *Diagnostics) add(id groupID, add func(*tally)) {
	epoch := d.epoch(d.opts.Now())
	d.mu.Lock()
	defer d.mu.Unlock()
	w := d.groups[id]
	if w == nil {
		if len(d.groups) >= d.opts.MaxTrackedGroups {
			d.forgetGroupsLocked(epoch)
		}
		w = &window{}
		d.groups[id] = w
	}
	d.uses++
	w.last, w.lastUse = epoch, d.uses
	add(w.at(epoch))
}

// forgetGroupsLocked makes room for new (tier, group) pairs: it forgets
// those with nothing counted in the window ending at epoch and, if fewer
// than a quarter of MaxTrackedGroups go that way, the least recently counted
// down to three quarters of it. A flood of new pairs thus costs one walk per
// MaxTrackedGroups/4 of them, and pairs in use outlive it.
func (d *Diagnostics) forgetGroupsLocked(epoch int64) {
	for id, w := range d.groups {
		if epoch-w.last >= windowBuckets {
			delete(d.groups, id)
		}
	}
	keep := d.opts.MaxTrackedGroups * 3 / 4
	if len(d.groups) <= keep {
		return
	}
	ids := slices.Collect(maps.Keys(d.groups))
	slices.SortFunc(ids, func(a, b groupID) int { return cmp.Compare(d.groups[a].lastUse, d.groups[b].lastUse) })
	for _, id := range ids[:len(ids)-keep] {
		delete(d.groups, id)
	}
}

// Warnings returns the failures diagnosed now, sorted by code and subject;
// a healthy workload gets none.
func (d *Diagnostics) Warnings(st StoreState) []ctlabi.Warning {
	now := d.opts.Now()
	epoch := d.epoch(now)
	fullWindow := now.Sub(d.start) >= d.opts.Window
	d.mu.Lock()
	defer d.mu.Unlock()
	tiers := make(map[string]map[int]tally)
	var total tally
	for id, w := range d.groups {
		sum := w.sum(epoch)
		if tiers[id.tier] == nil {
			tiers[id.tier] = make(map[int]tally)
		}
		tiers[id.tier][id.group] = sum
		total.add(sum)
	}
	var warnings []ctlabi.Warning
	if fullWindow {
		warnings = append(warnings, d.writeOnlyGroups(tiers)...)
		if w, ok := d.writeOnlyTier(total); ok {
			warnings = append(warnings, w)
		}
	}
	if w, ok := d.hashSeedDrift(total, st); ok {
		warnings = append(warnings, w)
	}
	if w, ok := d.primaryTierExhaustedLocked(now, total, st); ok {
		warnings = append(warnings, w)
	}
	slices.SortStableFunc(warnings, func(a, b ctlabi.Warning) int { return cmp.Compare(a.Code, b.Code) })
	return warnings
}

// writeOnlyGroups finds the groups that stored MinStoredBytes in the window
// and read nothing while another group of the same tier read something.
func (d *Diagnostics) writeOnlyGroups(tiers map[string]map[int]tally) []ctlabi.Warning {
	var warnings []ctlabi.Warning
	for _, tier := range slices.Sorted(maps.Keys(tiers)) {
		groups := tiers[tier]
		var readGroups []string
		var readBytes int64
		for _, g := range slices.Sorted(maps.Keys(groups)) {
			if groups[g].readBlocks > 0 {
				readGroups = append(readGroups, strconv.Itoa(g))
				readBytes += groups[g].readBytes
			}
		}
		if len(readGroups) == 0 {
			continue
		}
		for _, g := range slices.Sorted(maps.Keys(groups)) {
			t := groups[g]
			if t.readBlocks > 0 || t.storedBytes < d.opts.MinStoredBytes {
				continue
			}
			warnings = append(warnings, ctlabi.Warning{Code: ctlabi.WarnWriteOnlyGroup, Message: fmt.Sprintf(
				"tier %s, group %d: %s stored in %d blocks and none read in the last %s, while group(s) %s read %s "+
					"(group %d: %d lookups, %d present). The engine stores this group but never gets a hit on it, and groups are ANDed, "+
					"so it vetoes hits. With an EAGLE/MTP draft group this is the engine's store filter keeping only chunks {acc-tail … acc-1} of "+
					"each segment: keep {0} ∪ {acc-tail … acc-1} for EAGLE groups (staging/match.Retained), or stop storing the group.",
				tier, g, formatBytes(t.storedBytes), t.storedBlocks, d.opts.Window, strings.Join(readGroups, ","), formatBytes(readBytes),
				g, t.lookups, t.lookupHits)})
		}
	}
	return warnings
}

// writeOnlyTier fires when the whole tier stored MinStoredBytes in the
// window and read nothing.
func (d *Diagnostics) writeOnlyTier(total tally) (ctlabi.Warning, bool) {
	if total.readBlocks > 0 || total.storedBytes < d.opts.MinStoredBytes {
		return ctlabi.Warning{}, false
	}
	return ctlabi.Warning{Code: ctlabi.WarnWriteOnlyTier, Message: fmt.Sprintf(
		"%s written in %d blocks and nothing read in the last %s (%d lookups, %d answered present). "+
			"The tier costs disk writes and serves no load. If lookups answer present, the engine vetoes its hits: "+
			"check EAGLE/MTP groups (write_only_group, staging/match.Retained) and the primary tier (primary_tier_exhausted); "+
			"if they miss, check that every engine process uses the same --prefix-caching-hash-algo (and, with an xxhash algorithm, the same PYTHONHASHSEED); if there are no lookups, "+
			"check that the engine's secondary_tiers config points its loads at this mount.",
		formatBytes(total.storedBytes), total.storedBlocks, d.opts.Window, total.lookups, total.lookupHits)}, true
}

// hashSeedDrift fires when lookups in the window hit at most MaxHitRatio,
// new blocks keep being stored and the store holds many blocks (half or
// more) never looked up since the mount.
func (d *Diagnostics) hashSeedDrift(total tally, st StoreState) (ctlabi.Warning, bool) {
	if total.lookups < d.opts.MinLookups || float64(total.lookupHits) > d.opts.MaxHitRatio*float64(total.lookups) ||
		total.storedBlocks < d.opts.MinStores ||
		st.NeverLookedUp < d.opts.MinNeverLookedUp || 2*st.NeverLookedUp < st.Blocks {
		return ctlabi.Warning{}, false
	}
	return ctlabi.Warning{Code: ctlabi.WarnHashSeedDrift, Message: fmt.Sprintf(
		"lookups found %d of %d keys (%.2f%%) in the last %s while %d new blocks were stored, and %d of the %d blocks in the store "+
			"were never looked up since the mount. The engine's block hashes no longer match the stored ones. vLLM's default block "+
			"hash is the same in every process since vLLM PR #51875: check that every engine process on every node uses the same "+
			"--prefix-caching-hash-algo. Only the xxhash algorithms still depend on PYTHONHASHSEED: with them, set the same "+
			"PYTHONHASHSEED (e.g. 0) for every engine process on every node and keep it across restarts. Blocks stored under other "+
			"hashes are never found again and age out by eviction.",
		total.lookupHits, total.lookups, 100*float64(total.lookupHits)/float64(total.lookups), d.opts.Window,
		total.storedBlocks, st.NeverLookedUp, st.Blocks)}, true
}

// primaryTierExhaustedLocked fires when the keys that answered present in the
// window and have gone unread for ReadGrace number at least MinWaiting and
// about the primary region's row count or more, while the keys read after
// answering present stay at about the row count or fewer: the engine can
// only take as many blocks as it has rows.
func (d *Diagnostics) primaryTierExhaustedLocked(now time.Time, total tally, st StoreState) (ctlabi.Warning, bool) {
	waiting := d.countWaitingLocked(now)
	rows := float64(st.PrimaryRows)
	if st.PrimaryRows <= 0 || waiting < d.opts.MinWaiting ||
		float64(waiting) < (1-d.opts.PinTolerance)*rows || float64(total.waitedReads) > (1+d.opts.PinTolerance)*rows {
		return ctlabi.Warning{}, false
	}
	return ctlabi.Warning{Code: ctlabi.WarnPrimaryTierExhausted, Message: fmt.Sprintf(
		"%d keys answered present in the last %s and were not read within %s, while %d were read after answering present; "+
			"the primary region has %d rows. The engine's lookup takes a primary-tier row for every key it confirms, so once the rows "+
			"are taken the keys on disk answer MISS and the hit is vetoed. Match without staging (MOUNTPOINT/.kvtier/match, "+
			"staging/match.Hit) and load the hit in waves, or give the primary tier more rows (cpu_bytes_to_use).",
		waiting, d.opts.Window, d.opts.ReadGrace, total.waitedReads, st.PrimaryRows)}, true
}

// countWaitingLocked forgets the keys that last answered present before
// the window and returns how many of the others have waited ReadGrace.
func (d *Diagnostics) countWaitingLocked(now time.Time) int {
	waiting := 0
	for key, p := range d.waiting {
		switch {
		case now.Sub(p.last) > d.opts.Window:
			delete(d.waiting, key)
		case now.Sub(p.first) >= d.opts.ReadGrace:
			waiting++
		}
	}
	return waiting
}

// epoch is the window bucket that holds time t.
func (d *Diagnostics) epoch(t time.Time) int64 {
	return int64(t.Sub(d.start) / (d.opts.Window / windowBuckets))
}

// windowBuckets is the resolution of a window.
const windowBuckets = 20

// tally counts one group's events.
type tally struct {
	storedBlocks, storedBytes int64
	readBlocks, readBytes     int64
	lookups, lookupHits       int64
	waitedReads               int64 // reads of keys that were waiting: answered present, not read since
}

func (t *tally) add(o tally) {
	t.storedBlocks += o.storedBlocks
	t.storedBytes += o.storedBytes
	t.readBlocks += o.readBlocks
	t.readBytes += o.readBytes
	t.lookups += o.lookups
	t.lookupHits += o.lookupHits
	t.waitedReads += o.waitedReads
}

// window is a ring of tallies, one per bucket of Window/windowBuckets.
type window struct {
	buckets [windowBuckets]tally
	epochs  [windowBuckets]int64 // the epoch each bucket counts
	last    int64                // the latest epoch counted
	lastUse uint64               // Diagnostics.uses at the latest count
}

// at returns the bucket of epoch, emptied if it last counted an older one.
func (w *window) at(epoch int64) *tally {
	i := epoch % windowBuckets
	if w.epochs[i] != epoch {
		w.buckets[i], w.epochs[i] = tally{}, epoch
	}
	return &w.buckets[i]
}

// sum adds up the buckets of the window that ends at epoch.
func (w *window) sum(epoch int64) tally {
	var total tally
	for i := range w.buckets {
		if age := epoch - w.epochs[i]; age >= 0 && age < windowBuckets {
			total.add(w.buckets[i])
		}
	}
	return total
}

// formatBytes writes n with a binary unit: "512 B", "1.5 GiB".
func formatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return strconv.FormatInt(n, 10) + " B"
	}
	value, exp := float64(n)/unit, 0
	for value >= unit && exp < 4 {
		value /= unit
		exp++
	}
	return strconv.FormatFloat(value, 'f', 1, 64) + " " + "KMGTP"[exp:exp+1] + "iB"
}

// groupID is one KV group of one engine tier: the unit the rules count.
type groupID struct {
	tier  string
	group int
}

// groupOf is the group a block belongs to.
func groupOf(ref block.Ref) groupID {
	return groupID{tier: ref.Name.Tier, group: ref.Name.Group}
}
