package diskbench

import "testing"

// TestLookupChainClasses checks the lookup batch's shape: the stored blocks
// first, in order, then absent keys in leaves that stored blocks made, then
// absent keys in leaves nothing made, LookupKeys in all.
func TestLookupChainClasses(t *testing.T) {
	r := &run{cfg: Config{Blocks: 40, LookupKeys: 1001}}
	chain := r.lookupChain()
	if len(chain) != r.cfg.LookupKeys {
		t.Fatalf("%d keys, want %d", len(chain), r.cfg.LookupKeys)
	}
	leaves := map[string]bool{}
	counts := map[string]int{}
	for i, k := range chain {
		counts[k.class]++
		switch k.class {
		case lookupPresent:
			if i >= r.cfg.Blocks || k.hash != key(i) {
				t.Fatalf("key %d: present key %s out of prefix order", i, k.hash)
			}
			leaves[k.hash[:5]] = true
		case lookupAbsentInDir:
			if !leaves[k.hash[:5]] {
				t.Fatalf("key %d: %s is not in a stored block's leaf", i, k.hash)
			}
		case lookupAbsentNoDirs:
			if leaves[k.hash[:5]] {
				t.Fatalf("key %d: %s is in a stored block's leaf", i, k.hash)
			}
		}
		if k.class != lookupPresent && i < r.cfg.Blocks {
			t.Fatalf("key %d: an absent key before the stored chain ends", i)
		}
	}
	if counts[lookupPresent] != 40 || counts[lookupAbsentInDir] != 480 || counts[lookupAbsentNoDirs] != 481 {
		t.Fatalf("classes %v, want 40 present, 480 and 481 absent", counts)
	}
}
