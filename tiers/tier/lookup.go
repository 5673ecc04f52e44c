package tier

import (
	"strings"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// Answer is where a looked-up block is, as its lookup is answered.
type Answer int

// A block lookup's answers.
const (
	// Absent: neither the store nor the shared level holds the block; the
	// kernel may cache the absence.
	Absent Answer = iota
	// Withheld: a level holds the block, but it is answered absent for
	// now (the lookup budget's batch cannot promote it, or a load could not
	// reach every rank); the kernel must not cache that answer.
	Withheld
	// Local: the store holds the block.
	Local
	// InShared: only the shared level holds the block; a load fetches it first.
	InShared
)

// Verdict is the answer to an engine's lookup of a block.
type Verdict struct {
	Answer Answer
	// AskEachTime: every lookup of this present block must reach the
	// daemon (the lookup budget decides each), so the kernel may not
	// cache its entry.
	AskEachTime bool
}

// Lookup answers the engine's lookup of a block by thread: the store first,
// then the shared level (DESIGN.md "The shared level"); a block found there
// may be withheld by the lookup budget (DESIGN.md "The lookup budget") or,
// on a multi-node group, while a load could not reach every rank. Staging,
// the diagnostics and the shared level's admission hear of the lookup as
// the budget answered it, before the mirroring check.
func (t *Tier) Lookup(ref block.Ref, thread uint32) Verdict {
	found, where := t.find(ref, thread, true)
	switch {
	case where == Withheld || !found:
		return Verdict{Answer: where}
	case t.cfg.Gate != nil && !t.cfg.Gate.ServeLoads():
		t.withheld.Add(1)
		return Verdict{Answer: Withheld}
	}
	return Verdict{Answer: where, AskEachTime: t.cfg.Budget != nil && t.cfg.Budget.MustAsk(ref.Name.Tier)}
}

// ServesLoads reports whether a load could be served now: always without
// a Gate.
func (t *Tier) ServesLoads() bool { return t.cfg.Gate == nil || t.cfg.Gate.ServeLoads() }

// LookupsWithheld counts present blocks answered absent because a load
// could not have reached every rank.
func (t *Tier) LookupsWithheld() int64 { return t.withheld.Load() }

// find looks a block up in the store and, missing there, in the shared
// level, lets the lookup budget withhold it for the engine's own lookups
// (budgeted), and tells staging, the diagnostics and the shared level's
// admission. found is the answer as the budget gave it; where is Local,
// InShared, Withheld or Absent. A match's probes are not budgeted (Match).
func (t *Tier) find(ref block.Ref, thread uint32, budgeted bool) (found bool, where Answer) {
	where = Absent
	switch {
	case t.cfg.Store.Lookup(ref.Rel, thread):
		where = Local
	case t.cfg.Shared != nil && t.cfg.Shared.Lookup(ref.Rel):
		where = InShared
	}
	found = where != Absent
	if budgeted && t.cfg.Budget != nil && !t.cfg.Budget.Answer(budgetKey(ref.Name), thread, found) && found {
		found, where = false, Withheld
	}
	if t.cfg.Stager != nil {
		t.cfg.Stager.NoteLookup(ref, thread, found)
	}
	if t.cfg.Diagnostics != nil {
		t.cfg.Diagnostics.LookedUp(ref, found)
	}
	if where == Local && t.cfg.Shared != nil {
		if size, ok := t.cfg.Store.Size(ref.Rel); ok {
			t.cfg.Shared.LookedUp(ref.Rel, size)
		}
	}
	return found, where
}

// MissedDir counts the engine's lookup of rel, by thread, that failed at a
// missing directory of the tier layout (`<tier>/<h[0:3]>` or
// `<tier>/<h[0:3]>/<h[3:5]>_g<N>`): most absent keys end there, never
// reaching their block's name. The primer's lookups, ahead of the engine,
// and names outside the layout are not counted.
func (t *Tier) MissedDir(rel string, thread uint32) {
	if t.cfg.Primer != nil && t.cfg.Primer.Owns(thread) {
		return
	}
	if dir := block.ParseDir(rel); dir.Level != block.NotLayoutDir {
		t.cfg.Store.CountMissedLookup()
		if t.cfg.Diagnostics != nil {
			t.cfg.Diagnostics.MissedLookup(dir.Tier, dir.Group)
		}
	}
}

// SharedDir makes the directory rel of the tier layout in the store when
// the shared level holds it and the store lacks it, so that a key's lookup
// walks on to its block; true if it now exists in the store. Only the
// layout's levels (tier, prefix, group: three components at most) are
// asked, never a hidden name.
func (t *Tier) SharedDir(rel string) bool {
	depth := strings.Count(rel, "/") + 1
	if t.cfg.Shared == nil || depth > 3 || strings.HasPrefix(rel, ".") || !t.cfg.Shared.Lookup(rel) {
		return false
	}
	if err := t.cfg.Store.MakeDirs(rel); err != nil {
		t.cfg.Logger.Warn("creating a directory the shared store holds", "path", rel, "err", err)
		return false
	}
	return true
}
