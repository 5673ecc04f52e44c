package engine

import (
	"bytes"
	"slices"
	"testing"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
)

// TestChunkHashes: keys chain (a changed chunk changes every later key, not
// the earlier ones), the seed changes all keys, and the last token is never
// part of a complete chunk.
func TestChunkHashes(t *testing.T) {
	tokens := tokenStream("t", 4*16+1)
	keys := chunkHashes(tokens, 16, "0")
	if len(keys) != 4 || len(keys[0]) != 64 {
		t.Fatalf("%d keys of %d digits, want 4 of 64", len(keys), len(keys[0]))
	}
	if got := chunkHashes(tokens[:4*16], 16, "0"); len(got) != 3 {
		t.Fatalf("a prompt of exactly 4 chunks keys %d chunks, want 3 (the last token is recomputed)", len(got))
	}
	changed := slices.Clone(tokens)
	changed[2*16]++
	other := chunkHashes(changed, 16, "0")
	if !slices.Equal(other[:2], keys[:2]) || other[2] == keys[2] || other[3] == keys[3] {
		t.Fatal("changing chunk 2 must change keys 2 and 3 only")
	}
	for i, k := range chunkHashes(tokens, 16, "1") {
		if k == keys[i] {
			t.Fatalf("key %d is the same under another hash seed", i)
		}
	}
}

// TestKVBytes: MLA KV is the same on every rank, GQA KV differs per rank, and
// every block's KV differs.
func TestKVBytes(t *testing.T) {
	fill := func(src kvSource) []byte {
		b := make([]byte, 4096)
		fillKV(b, src)
		return b
	}
	a, b := blockKey{0, "aa"}, blockKey{1, "aa"}
	if bytes.Equal(fill(kvSource{a, -1}), fill(kvSource{b, -1})) {
		t.Fatal("two groups' blocks of a chunk have the same KV")
	}
	if bytes.Equal(fill(kvSource{a, 0}), fill(kvSource{a, 1})) {
		t.Fatal("GQA ranks have the same KV")
	}
	if !bytes.Equal(fill(kvSource{a, -1}), fill(kvSource{a, -1})) {
		t.Fatal("KV is not deterministic")
	}
}

// TestNeededBlocks: a hit loads every chunk of a full group and the last Tail
// chunks of windowed groups.
func TestNeededBlocks(t *testing.T) {
	s := &scheduler{cfg: Config{Groups: []Group{{Kind: ctlabi.KindFull}, {Kind: ctlabi.KindEagle, Tail: 2, Acc: 8}}}}
	keys := []string{"k0", "k1", "k2", "k3"}
	got := s.neededBlocks(keys, 3)
	want := []blockKey{{0, "k0"}, {0, "k1"}, {1, "k1"}, {0, "k2"}, {1, "k2"}}
	if !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

// TestParseGroups round-trips --groups and rejects bad windows.
func TestParseGroups(t *testing.T) {
	groups, err := ParseGroups("full,sliding:1:4,eagle:2:8")
	if err != nil || FormatGroups(groups) != "full,sliding:1:4,eagle:2:8" {
		t.Fatalf("got %v %v", groups, err)
	}
	for _, bad := range []string{"", "full:1:1", "sliding:2:1", "eagle:0:4", "eagle:2", "mamba"} {
		if _, err := ParseGroups(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
