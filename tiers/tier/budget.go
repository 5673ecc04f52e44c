package tier

import (
	"slices"
	"strconv"

	"github.com/kvtierfs/kvtierfs/staging/lookupbudget"
	"github.com/kvtierfs/kvtierfs/tiers/block"
	"github.com/kvtierfs/kvtierfs/tiers/shm"
)

// Regions are the engine's shm regions as the tier reads them (*shm.Set).
type Regions interface {
	// Infos describes every region, its rows inferred from the store's
	// block sizes (RowSizes).
	Infos(rowSizes []int64) []shm.Info
}

// SizeBudget tells the lookup budget the primary region's rows (those of
// its largest region) and the groups of each tier the store holds; the
// mount calls it as the regions appear, and a publish while the budget
// knows no rows does (the first block gives the rows their size). Nothing
// without a budget or regions.
func (t *Tier) SizeBudget() {
	b := t.cfg.Budget
	if b == nil || t.cfg.Regions == nil {
		return
	}
	d := t.cfg.Store.Stats()
	rows := 0
	for _, r := range t.cfg.Regions.Infos(RowSizes(d.RowBytes)) {
		rows = max(rows, int(r.Rows))
	}
	b.SetRows(rows)
	for tier := range d.RowBytes {
		for g := range d.Groups {
			if n, err := strconv.Atoi(g); err == nil {
				b.NoteGroup(tier, n)
			}
		}
	}
}

// RowSizes lists the distinct block sizes of the store's tiers, smallest
// first: the row sizes a region of the engine may have.
func RowSizes(byTier map[string]int64) []int64 {
	var out []int64
	for _, v := range byTier {
		if !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	slices.Sort(out)
	return out
}

// budgetKey is a block's name as the lookup budget knows it.
func budgetKey(n block.Name) lookupbudget.Key {
	return lookupbudget.Key{Tier: n.Tier, Group: n.Group, Hash: n.Hash}
}
