package engine

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"sync"

	"github.com/kvtierfs/kvtierfs/gpu"
)

// vocabSize bounds the token ids of the synthetic prompts.
const vocabSize = 129_280

// splitmix64 is the SplitMix64 generator: fast, deterministic, good enough
// for token ids and KV bytes.
type splitmix64 uint64

func (s *splitmix64) next() uint64 {
	*s += 0x9E3779B97F4A7C15
	z := uint64(*s)
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

// seedOf derives a generator seed from a name.
func seedOf(name string) splitmix64 {
	sum := sha256.Sum256([]byte(name))
	return splitmix64(binary.LittleEndian.Uint64(sum[:8]))
}

// tokenStream returns n deterministic token ids named by stream: the same
// name always gives the same tokens.
func tokenStream(stream string, n int) []uint32 {
	gen := seedOf("tokens/" + stream)
	tokens := make([]uint32, n)
	for i := range tokens {
		tokens[i] = uint32(gen.next() % vocabSize)
	}
	return tokens
}

// completeChunks is the number of chunks the engine keys for a prompt: the
// complete chunks of all tokens but the last, which is always recomputed.
func completeChunks(promptTokens, tokensPerChunk int) int {
	return (promptTokens - 1) / tokensPerChunk
}

// chunkHashes returns the chained keys of the complete chunks of a prompt:
// key i is the hex sha256 of key i-1, the chunk's token ids (little-endian
// uint32) and the hash seed; the parent of chunk 0 is the hash of the seed
// (vLLM's NONE_HASH), so a different seed changes every key.
func chunkHashes(tokens []uint32, tokensPerChunk int, seed string) []string {
	parent := sha256.Sum256([]byte("kvtierfs-none-hash/" + seed))
	parentHex := hex.EncodeToString(parent[:])
	chunks := completeChunks(len(tokens), tokensPerChunk)
	keys := make([]string, chunks)
	buf := make([]byte, 4*tokensPerChunk)
	for c := range keys {
		for i, tok := range tokens[c*tokensPerChunk : (c+1)*tokensPerChunk] {
			binary.LittleEndian.PutUint32(buf[4*i:], tok)
		}
		h := sha256.New()
		h.Write([]byte(parentHex))
		h.Write(buf)
		h.Write([]byte(seed))
		parentHex = hex.EncodeToString(h.Sum(nil))
		keys[c] = parentHex
	}
	return keys
}

// blockKey names a block: a chunk's key in one KV group.
type blockKey struct {
	group int
	hash  string
}

// kvSource identifies the KV bytes of a block on a rank: rank is -1 for a
// replicated (MLA) cache, where every rank holds the same bytes.
type kvSource struct {
	block blockKey
	rank  int
}

// fillKV writes the deterministic KV bytes of src into dst.
func fillKV(dst []byte, src kvSource) {
	gen := seedOf(fmt.Sprintf("kv/%d/%s/%d", src.block.group, src.block.hash, src.rank))
	for len(dst) >= 8 {
		binary.LittleEndian.PutUint64(dst, gen.next())
		dst = dst[8:]
	}
	for i := range dst {
		dst[i] = byte(gen.next())
	}
}

// kvIndex remembers the fingerprint of every KV slot a worker computed, so
// loads can be checked against what that chunk's KV must be on that rank.
type kvIndex struct {
	mu           sync.Mutex
	fingerprints map[kvSource]uint64
}

func newKVIndex() *kvIndex {
	return &kvIndex{fingerprints: make(map[kvSource]uint64)}
}

// record stores the fingerprint of slot, which holds src's KV, unless it is
// known already (KV bytes are a function of src).
func (k *kvIndex) record(src kvSource, slot []byte) {
	if _, known := k.expected(src); known {
		return
	}
	fp := gpu.FingerprintHost(slot)
	k.mu.Lock()
	k.fingerprints[src] = fp
	k.mu.Unlock()
}

// expected returns src's fingerprint and whether a worker computed that KV.
func (k *kvIndex) expected(src kvSource) (uint64, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	fp, ok := k.fingerprints[src]
	return fp, ok
}
