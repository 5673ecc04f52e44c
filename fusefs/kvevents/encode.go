// Package kvevents tells KV-aware routers (llm-d, Dynamo) which blocks left
// the disk tier, in vLLM's KV-events wire format: a ZMQ PUB socket sending
// msgpack-encoded KVEventBatch messages that carry BlockRemoved events.
//
// The format follows vLLM's vllm/distributed/kv_events.py (EventBatch,
// KVEventBatch, BlockRemoved, ZmqEventPublisher) as of vLLM PR #42892, which
// switched the events from positional arrays to maps:
//
//   - the batch is a msgspec struct with array_like=True and omit_defaults:
//     the array [ts, events, data_parallel_rank], ts a float64 of Unix
//     seconds, the rank 0 (vLLM's publisher fills in its rank, so the field
//     is never the omitted default);
//   - each event is a tagged msgspec struct without array_like: a map whose
//     first key "type" holds the class name, then its fields in declaration
//     order, fields left at their default omitted. BlockRemoved is
//     {"type": "BlockRemoved", "block_hashes": [...], "medium": "STORAGE",
//     "group_idx": N}; its later optional fields (locality, ownership) are
//     None and so absent;
//   - msgspec writes integers in the smallest msgpack form (non-negative ones
//     as positive fixint or uint8/16/32/64), strings as fixstr/str8/str16,
//     floats as float64.
//
// How a block becomes a hash is in blockHash.
package kvevents

import (
	"encoding/binary"
	"encoding/hex"
	"math"
)

// MediumStorage is the medium vLLM's offloading connector reports for its
// file-system tier (vllm/v1/kv_offload/base.py Medium.STORAGE, emitted by
// tiering/fs/manager.py), the tier kvtierfs serves.
const MediumStorage = "STORAGE"

// removedBlocks is one BlockRemoved event: hashes of one KV cache group.
type removedBlocks struct {
	group  int
	hashes []uint64
}

// blockHash is the hash vLLM's offloading connector reports for a block of
// its fs tier: the file name is the hex of the chunk's block hash (bytes), and
// with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES (the default) vLLM turns those
// bytes into an integer the way maybe_convert_block_hash in
// vllm/v1/core/kv_cache_utils.py does: big-endian, keeping the low 64 bits,
// which are the last 16 hex digits of the name. ok is false for a name that
// is not such hex.
func blockHash(nameHex string) (h uint64, ok bool) {
	if len(nameHex) < 16 {
		return 0, false
	}
	var tail [8]byte
	if _, err := hex.Decode(tail[:], []byte(nameHex[len(nameHex)-16:])); err != nil {
		return 0, false
	}
	return binary.BigEndian.Uint64(tail[:]), true
}

// encodeBatch appends the msgpack encoding of a KVEventBatch holding one
// BlockRemoved event per group to buf.
func encodeBatch(buf []byte, ts float64, events []removedBlocks) []byte {
	buf = appendArrayHeader(buf, 3)
	buf = appendFloat64(buf, ts)
	buf = appendArrayHeader(buf, len(events))
	for _, ev := range events {
		buf = appendMapHeader(buf, 4)
		buf = appendString(buf, "type")
		buf = appendString(buf, "BlockRemoved")
		buf = appendString(buf, "block_hashes")
		buf = appendArrayHeader(buf, len(ev.hashes))
		for _, h := range ev.hashes {
			buf = appendUint(buf, h)
		}
		buf = appendString(buf, "medium")
		buf = appendString(buf, MediumStorage)
		buf = appendString(buf, "group_idx")
		buf = appendUint(buf, uint64(ev.group))
	}
	return appendUint(buf, 0) // data_parallel_rank
}

// The msgpack forms below are those of the msgpack specification
// (github.com/msgpack/msgpack/blob/master/spec.md).

func appendArrayHeader(buf []byte, n int) []byte {
	switch {
	case n < 16:
		return append(buf, 0x90|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(buf, 0xdc), uint16(n))
	default:
		return binary.BigEndian.AppendUint32(append(buf, 0xdd), uint32(n))
	}
}

func appendMapHeader(buf []byte, n int) []byte {
	// Events have at most a handful of fields.
	return append(buf, 0x80|byte(n))
}

func appendString(buf []byte, s string) []byte {
	// Only the format's own names and values are written, all under 32 bytes.
	return append(append(buf, 0xa0|byte(len(s))), s...)
}

func appendUint(buf []byte, v uint64) []byte {
	switch {
	case v < 128:
		return append(buf, byte(v))
	case v <= math.MaxUint8:
		return append(buf, 0xcc, byte(v))
	case v <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(buf, 0xcd), uint16(v))
	case v <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(buf, 0xce), uint32(v))
	default:
		return binary.BigEndian.AppendUint64(append(buf, 0xcf), v)
	}
}

func appendFloat64(buf []byte, f float64) []byte {
	return binary.BigEndian.AppendUint64(append(buf, 0xcb), math.Float64bits(f))
}
