package fusefs

import (
	"path/filepath"
	"testing"

	"github.com/hanwen/go-fuse/v2/fs"

	"github.com/kvtierfs/kvtierfs/tiers/block"
	"github.com/kvtierfs/kvtierfs/tiers/tier"
)

// TestIndexFollowsTheTiersEvents: the lookup index, as the tier's listener,
// forgets a block leaving or evicted, learns a published one, and indexes
// the directories the store made for an imported one.
func TestIndexFollowsTheTiersEvents(t *testing.T) {
	root := t.TempDir()
	rel := "T/abc/de_g0/abcde0123456789abcdef0123456789a.bin"
	mustMkdir(t, filepath.Join(root, "T/abc/de_g0"))
	mustWrite(t, filepath.Join(root, rel))
	f := &FS{index: newLookupIndex(openStoreAt(t, root), &fs.LoopbackRoot{Path: root})}
	f.index.scan("")
	ref, ok := block.ParseRef(rel)
	if !ok {
		t.Fatalf("%s is no block name", rel)
	}
	for _, step := range []struct {
		kind tier.Kind
		want []string
	}{
		{tier.Leaving, nil},
		{tier.Published, []string{rel}},
		{tier.Unlinked, []string{rel}}, // an unlink's Leaving forgets it, not Unlinked
		{tier.Evicted, nil},
	} {
		f.indexEvent(tier.Event{Kind: step.kind, Ref: ref})
		_, blocks := layoutNames(f.index)
		equalNames(t, "blocks", blocks, step.want)
	}

	imported := "T/fed/cb_g1/fedcb0123456789abcdef0123456789a.bin"
	mustMkdir(t, filepath.Join(root, "T/fed/cb_g1"))
	mustWrite(t, filepath.Join(root, imported))
	ref, _ = block.ParseRef(imported)
	f.indexEvent(tier.Event{Kind: tier.Imported, Ref: ref})
	layout, _ := layoutNames(f.index)
	equalNames(t, "layout after an import", layout, []string{"T/abc", "T/abc/de_g0", "T/fed", "T/fed/cb_g1"})
}

// TestTierConfigLeavesAbsentPartsNil: a mount without staging, budget, KV
// events, regions, mirroring, shared level or primer gives the tier none (no typed
// nil pointer the tier would call), and its lookups answer from the store.
func TestTierConfigLeavesAbsentPartsNil(t *testing.T) {
	store := openStoreAt(t, t.TempDir())
	f := &FS{}
	cfg := f.tierConfig(Options{Store: store})
	if cfg.Shared != nil || cfg.Stager != nil || cfg.Budget != nil || cfg.Regions != nil || cfg.KVEvents != nil ||
		cfg.Gate != nil || cfg.Primer != nil || cfg.Diagnostics != nil {
		t.Fatalf("a mount without them configured the tier with %+v", cfg)
	}
	ref := block.Name{Tier: "T", Group: 0, Hash: "abcde0123456789abcdef0123456789a"}.Ref()
	if got := tier.New(cfg).Lookup(ref, 1); got.Answer != tier.Absent {
		t.Errorf("an absent block answered %+v", got)
	}
}
