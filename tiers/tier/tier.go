// Package tier is a mount's block tier without FUSE: it owns the events of a
// block's life and the answer to a block's lookup (DESIGN.md "Packages and
// their imports"). The store (tiers/disk) keeps the blocks; the Tier tells
// everyone who follows them (staging, the lookup budget, the diagnostics,
// KV events, write-behind to the shared level, and the mount's lookup index
// and kernel caches) through one ordered listener list, and decides what a
// lookup answers: the local store, then the shared level, then whether the
// lookup budget or mirroring withholds it. fusefs translates its verdicts
// into FUSE replies. Stats assembles the mount's stats.json from every
// part's plain stats and raises its warnings.
package tier

import (
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/kvtierfs/kvtierfs/staging/lookupbudget"
	"github.com/kvtierfs/kvtierfs/tiers/block"
	"github.com/kvtierfs/kvtierfs/tiers/disk"
)

// Kind is what happened to a block (Event).
type Kind int

// The events of a block's life, each told as the delivery rule says (Listener).
const (
	// Leaving: the mount is about to publish over the block's name or
	// unlink it. Told before the store acts, so that nothing serves the
	// old bytes or attributes once it has.
	Leaving Kind = iota
	// Published: the engine published the block through the mount; Size
	// is its size.
	Published
	// Imported: the store published the block from bytes fetched
	// elsewhere (the shared level), making its directories itself.
	Imported
	// Unlinked: the engine unlinked the block through the mount.
	Unlinked
	// Evicted: the store removed the block by itself (eviction, a failed
	// check or proof, its file gone from the store directory).
	Evicted
)

// Event is a change to a block of the tier.
type Event struct {
	Kind Kind
	Ref  block.Ref
	// Size is a Published block's size.
	Size int64
}

// Listener follows the tier's block events. The delivery rule: every
// listener hears every event, the listeners of one event one after another
// in the order New lists them; events told on different goroutines reach a
// listener concurrently, so a listener is safe for concurrent calls. Leaving is told on the goroutine of the mount's request, before the
// store acts (Publish, Unlink); Published and Imported on the goroutine that
// published, after the rename and before the store's Publish or Import
// returns; Unlinked and Evicted later, on the store's one notifier
// goroutine, in the order the blocks left (disk.Store.Listen). A listener
// must not block, and ignores the kinds it does not need.
type Listener func(Event)

// Store is the block store as the tier uses it (*disk.Store).
type Store interface {
	// Lookup answers whether the store holds the block at rel, and
	// protects it as looked up by thread.
	Lookup(rel string, thread uint32) bool
	// Size is the size of a block the store holds.
	Size(rel string) (int64, bool)
	Publish(tmpRel, destRel string) error
	Remove(rel string) error
	// Listen adds a listener of the store's own events (disk.Store.Listen).
	Listen(fn func(disk.Event))
	TimePhase(p disk.Phase, start time.Time)
	// CountMissedLookup counts a lookup that ended at a missing directory.
	CountMissedLookup()
	// Stats is the store's occupancy: its tiers' row sizes and its groups.
	Stats() disk.Stats
	// MakeDirs makes the missing directories of relDir.
	MakeDirs(relDir string) error
}

// Shared is the shared second level as the tier uses it (*shared.Level).
type Shared interface {
	// Lookup answers whether the shared store holds the block at rel.
	Lookup(rel string) bool
	// LookedUp tells the level's admission a local block answered a lookup.
	LookedUp(rel string, size int64)
	// Published queues a block published locally for write-behind.
	Published(rel string, size int64)
}

// Stager is staging as the tier tells it (*staging.Stager).
type Stager interface {
	NoteLookup(ref block.Ref, thread uint32, present bool)
	NoteStore(ref block.Ref)
	Invalidate(ref block.Ref)
}

// Budget is the lookup budget as the tier asks and tells it
// (*lookupbudget.Budget; DESIGN.md "The lookup budget").
type Budget interface {
	// Answer decides whether a block found (or not) is answered present.
	Answer(key lookupbudget.Key, thread uint32, found bool) bool
	// MustAsk reports whether every lookup of the tier's present blocks
	// must reach the budget (the kernel may not cache them).
	MustAsk(tier string) bool
	NoteStore(key lookupbudget.Key)
	// Loaded and NoteIOThread tell it a block opened for a load by a thread.
	Loaded(key lookupbudget.Key)
	NoteIOThread(thread uint32)
	// Rows is the rows the budget knows; 0 before the regions are sized.
	Rows() int
	// SetRows and NoteGroup size it: the primary region's rows, a group
	// of a tier.
	SetRows(rows int)
	NoteGroup(tier string, group int)
	// Exempt stops deciding the tier's lookups (its engine matches).
	Exempt(tier string)
}

// Diagnostics is the field diagnostics as the tier tells them
// (*diagnose.Diagnostics).
type Diagnostics interface {
	Stored(ref block.Ref, bytes int64)
	Read(ref block.Ref, bytes int64)
	LookedUp(ref block.Ref, present bool)
	// MissedLookup counts a lookup whose directory was absent (group -1:
	// the group directory itself).
	MissedLookup(tier string, group int)
}

// KVEvents publishes the blocks that leave the tier to routers
// (*kvevents.Publisher).
type KVEvents interface {
	BlockGone(rel string)
}

// Gate says whether a load could be served now (*rowsync.Node: every peer
// can take a mirrored row).
type Gate interface {
	ServeLoads() bool
}

// Primer looks the layout's names up ahead of the engine (*prime.Helper).
type Primer interface {
	// Owns reports whether a request's caller thread is the primer's.
	Owns(thread uint32) bool
}

// Config is what a Tier is made of; every field but Store may be nil.
type Config struct {
	Store       Store
	Shared      Shared
	Stager      Stager
	Budget      Budget
	Diagnostics Diagnostics
	KVEvents    KVEvents
	Gate        Gate
	Primer      Primer
	// Regions size the lookup budget (SizeBudget).
	Regions Regions
	// Logger receives the tier's warnings; nil discards them.
	Logger *slog.Logger
}

// Tier owns a mount's block events and lookups.
type Tier struct {
	cfg Config
	// listeners are fixed at New, before the store's first event.
	listeners []Listener

	// withheld counts present blocks answered absent while Gate was closed.
	withheld atomic.Int64
	// matches counts match requests; matchThreads numbers their descriptors.
	matches      atomic.Int64
	matchThreads atomic.Uint32
}

// New makes the tier the store's one listener. Its listeners, in order:
// those of cfg (staging, the lookup budget, the diagnostics, KV events,
// write-behind to the shared level), then the mount's (fusefs: its lookup
// index, then the kernel's caches, so that the kernel asks again only once
// everything else has the news).
func New(cfg Config, mount ...Listener) *Tier {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	t := &Tier{cfg: cfg}
	if s := cfg.Stager; s != nil {
		t.listen(func(e Event) {
			switch e.Kind {
			case Leaving, Evicted:
				s.Invalidate(e.Ref)
			case Published:
				s.NoteStore(e.Ref)
			}
		})
	}
	if b := cfg.Budget; b != nil {
		t.listen(func(e Event) {
			if e.Kind != Published {
				return
			}
			b.NoteStore(budgetKey(e.Ref.Name))
			if b.Rows() == 0 {
				t.SizeBudget()
			}
		})
	}
	if d := cfg.Diagnostics; d != nil {
		t.listen(func(e Event) {
			if e.Kind == Published {
				d.Stored(e.Ref, e.Size)
			}
		})
	}
	if k := cfg.KVEvents; k != nil {
		t.listen(func(e Event) {
			if e.Kind == Unlinked || e.Kind == Evicted {
				k.BlockGone(e.Ref.Rel)
			}
		})
	}
	if sh := cfg.Shared; sh != nil {
		t.listen(func(e Event) {
			if e.Kind == Published {
				sh.Published(e.Ref.Rel, e.Size)
			}
		})
	}
	for _, fn := range mount {
		t.listen(fn)
	}
	cfg.Store.Listen(t.storeEvent)
	return t
}

// listen adds a listener, in New only.
func (t *Tier) listen(fn Listener) { t.listeners = append(t.listeners, fn) }

// tell delivers an event to every listener, in order.
func (t *Tier) tell(e Event) {
	for _, fn := range t.listeners {
		fn(e)
	}
}

// storeEvents are the tier's kinds of the store's events.
var storeEvents = map[disk.EventKind]Kind{disk.Published: Published, disk.Imported: Imported,
	disk.Unlinked: Unlinked, disk.Removed: Evicted}

// storeEvent tells the listeners a store event about a block file; the
// telling of a publish is timed as the rename's index phase.
func (t *Tier) storeEvent(e disk.Event) {
	kind, known := storeEvents[e.Kind]
	ref, isBlock := block.ParseRef(e.Rel)
	if !known || !isBlock {
		return
	}
	if kind == Published {
		defer t.cfg.Store.TimePhase(disk.PhaseIndex, time.Now())
	}
	t.tell(Event{Kind: kind, Ref: ref, Size: e.Size})
}

// Publish publishes the tmp file at tmpRel as the block ref (disk.Store.Publish),
// telling Leaving first.
func (t *Tier) Publish(tmpRel string, ref block.Ref) error {
	t.tell(Event{Kind: Leaving, Ref: ref})
	return t.cfg.Store.Publish(tmpRel, ref.Rel)
}

// Unlink removes the block ref for the engine (disk.Store.Remove), telling
// Leaving first.
func (t *Tier) Unlink(ref block.Ref) error {
	t.tell(Event{Kind: Leaving, Ref: ref})
	return t.cfg.Store.Remove(ref.Rel)
}

// Loaded tells the lookup budget and the diagnostics that thread opened the
// block ref, of size bytes, for a load.
func (t *Tier) Loaded(ref block.Ref, thread uint32, size int64) {
	if b := t.cfg.Budget; b != nil {
		b.Loaded(budgetKey(ref.Name))
	}
	t.NoteIOThread(thread)
	if d := t.cfg.Diagnostics; d != nil {
		d.Read(ref, size)
	}
}

// NoteIOThread tells the lookup budget that thread is one of the engine's
// I/O threads (it created a block's tmp file or opened a block).
func (t *Tier) NoteIOThread(thread uint32) {
	if b := t.cfg.Budget; b != nil {
		b.NoteIOThread(thread)
	}
}
