package kvevents

import (
	"bytes"
	"encoding/hex"
	"strings"
	"testing"
)

// TestEncodeBatchGolden checks a batch byte for byte against the encoding
// msgspec gives vLLM's KVEventBatch (array_like) holding BlockRemoved events
// (tagged maps), derived by hand from the msgpack specification.
func TestEncodeBatchGolden(t *testing.T) {
	events := []removedBlocks{
		{group: 0, hashes: []uint64{1, 200, 0xfedcba9876543210}},
		{group: 300, hashes: []uint64{70000}},
	}
	want := strings.Join([]string{
		"93",                 // KVEventBatch: array of 3 (ts, events, data_parallel_rank)
		"cb3ff8000000000000", // ts 1.5 as float64
		"92",                 // events: array of 2
		"84",                 // BlockRemoved: map of 4
		"a4" + hex.EncodeToString([]byte("type")),
		"ac" + hex.EncodeToString([]byte("BlockRemoved")),
		"ac" + hex.EncodeToString([]byte("block_hashes")),
		"93",                 // 3 hashes
		"01",                 // positive fixint
		"ccc8",               // uint8 200
		"cffedcba9876543210", // uint64
		"a6" + hex.EncodeToString([]byte("medium")),
		"a7" + hex.EncodeToString([]byte("STORAGE")),
		"a9" + hex.EncodeToString([]byte("group_idx")),
		"00",
		"84",
		"a4" + hex.EncodeToString([]byte("type")),
		"ac" + hex.EncodeToString([]byte("BlockRemoved")),
		"ac" + hex.EncodeToString([]byte("block_hashes")),
		"91",
		"ce00011170", // uint32 70000
		"a6" + hex.EncodeToString([]byte("medium")),
		"a7" + hex.EncodeToString([]byte("STORAGE")),
		"a9" + hex.EncodeToString([]byte("group_idx")),
		"cd012c", // uint16 300
		"00",     // data_parallel_rank 0
	}, "")
	got := hex.EncodeToString(encodeBatch(nil, 1.5, events))
	if got != want {
		t.Fatalf("encoding\n got %s\nwant %s", got, want)
	}
}

// TestEncodeLongArrays checks the array header past 15 elements.
func TestEncodeLongArrays(t *testing.T) {
	hashes := make([]uint64, 16)
	buf := encodeBatch(nil, 0, []removedBlocks{{hashes: hashes}})
	hashesAt := bytes.Index(buf, []byte("block_hashes")) + len("block_hashes")
	if got := hex.EncodeToString(buf[hashesAt : hashesAt+3]); got != "dc0010" {
		t.Fatalf("header of 16 hashes: %s, want dc0010 (array 16)", got)
	}
	hashes = make([]uint64, 70000)
	buf = encodeBatch(nil, 0, []removedBlocks{{hashes: hashes}})
	if got := hex.EncodeToString(buf[hashesAt : hashesAt+5]); got != "dd00011170" {
		t.Fatalf("header of 70000 hashes: %s, want dd00011170 (array 32)", got)
	}
}

// TestBlockHash checks the hash of a block file name against what vLLM's
// maybe_convert_block_hash gives for the same bytes:
// int.from_bytes(bytes.fromhex(name), "big") & (2**64 - 1), computed in Python.
func TestBlockHash(t *testing.T) {
	for _, c := range []struct {
		name string
		want uint64
	}{
		// sha256("chunk-0"), a 64-digit sha256 name.
		{"b18efa847f7a3fa48fe0aafd4a6250aa5129740e05126859377af20cedafdeee", 3997773756585991918},
		// A 32-digit xxhash-128 name.
		{"0123456789abcdef0123456789abcdef", 81985529216486895},
		{"ffffffffffffffff", 1<<64 - 1},
	} {
		got, ok := blockHash(c.name)
		if !ok || got != c.want {
			t.Errorf("blockHash(%s) = %d, %v; want %d", c.name, got, ok, c.want)
		}
	}
	for _, bad := range []string{"", "0123456789abcde", "0123456789abcdeg"} {
		if _, ok := blockHash(bad); ok {
			t.Errorf("blockHash(%q) accepted", bad)
		}
	}
}
