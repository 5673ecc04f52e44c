package mount_test

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

// TestKVEventsReportEvictionsAndUnlinks runs a router's side of vLLM's KV
// events over loopback: a SUB socket bound where the daemon connects
// (--kv-events-endpoint tcp://127.0.0.1:PORT). Blocks evicted to stay within
// --capacity, and a block the engine unlinks, arrive as BlockRemoved events
// with medium STORAGE, their KV group, and the hash vLLM reports for the
// chunk: the low 64 bits of the file name's bytes.
func TestKVEventsReportEvictionsAndUnlinks(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	sub := zmq4.NewSub(ctx)
	t.Cleanup(func() {
		cancel()
		sub.Close()
	})
	if err := sub.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, "kv@"); err != nil {
		t.Fatal(err)
	}
	msgs := make(chan zmq4.Msg, 1024)
	go func() {
		for {
			msg, err := sub.Recv()
			if err != nil {
				return
			}
			msgs <- msg
		}
	}()

	d := mounttest.Start(t, mounttest.Options{Args: []string{"--capacity", "4MiB", "--lookup-protect", "1ms",
		"--kv-events-endpoint", "tcp://" + sub.Addr().String(), "--kv-events-topic", "kv@node-a"}})
	tier := openTier(t, d)
	region := newRegion(t, 1)

	// byHash maps the hash vLLM would report for each stored block to its index.
	byHash := map[uint64]int{}
	store := func(i int) {
		storeBlock(t, tier, region.Row(0), i)
		name, err := hex.DecodeString(hashOf(i))
		if err != nil {
			t.Fatal(err)
		}
		byHash[binary.BigEndian.Uint64(name[len(name)-8:])] = i
	}
	// removedBlocks checks one message and returns the blocks it names.
	lastSeq := int64(-1)
	removedBlocks := func(msg zmq4.Msg) []int {
		t.Helper()
		if len(msg.Frames) != 3 || string(msg.Frames[0]) != "kv@node-a" || len(msg.Frames[1]) != 8 {
			t.Fatalf("frames %q: want topic kv@node-a, 8-byte sequence number, payload", msg.Frames)
		}
		if seq := int64(binary.BigEndian.Uint64(msg.Frames[1])); seq <= lastSeq {
			t.Fatalf("sequence number %d after %d", seq, lastSeq)
		} else {
			lastSeq = seq
		}
		var batch []any
		if err := msgpack.Unmarshal(msg.Frames[2], &batch); err != nil || len(batch) != 3 {
			t.Fatalf("payload %x: %v; want [ts, events, data_parallel_rank]", msg.Frames[2], err)
		}
		if _, ok := batch[0].(float64); !ok {
			t.Fatalf("ts %#v is not a float64", batch[0])
		}
		var blocks []int
		for _, raw := range batch[1].([]any) {
			ev, ok := raw.(map[string]any)
			if !ok || ev["type"] != "BlockRemoved" || ev["medium"] != "STORAGE" || asUint(t, ev["group_idx"]) != 0 {
				t.Fatalf("event %#v: want a BlockRemoved map, medium STORAGE, group_idx 0", raw)
			}
			for _, h := range ev["block_hashes"].([]any) {
				i, ok := byHash[asUint(t, h)]
				if !ok {
					t.Fatalf("removed hash %v names no stored block", h)
				}
				blocks = append(blocks, i)
			}
		}
		return blocks
	}

	// Store past the capacity until events arrive: the first evictions may
	// come before the daemon's connection and the subscription are up.
	var evicted []int
	for i := 0; len(evicted) == 0; i++ {
		if i == 1000 {
			t.Fatal("1000 blocks stored into 4 MiB and no BlockRemoved received")
		}
		store(i)
		select {
		case msg := <-msgs:
			evicted = removedBlocks(msg)
		default:
		}
	}
	for _, i := range evicted {
		if tier.Exists(tier.BlockPath(tierDir, 0, hashOf(i))) {
			t.Fatalf("block %d reported removed but present", i)
		}
	}

	// The engine unlinks the newest block through the mount.
	unlinked := len(byHash) - 1
	if err := os.Remove(tier.BlockPath(tierDir, 0, hashOf(unlinked))); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(30 * time.Second)
	for found := false; !found; {
		select {
		case msg := <-msgs:
			for _, i := range removedBlocks(msg) {
				found = found || i == unlinked
			}
		case <-deadline:
			t.Fatalf("no BlockRemoved for block %d unlinked through the mount", unlinked)
		}
	}
	if c := d.Stats().Counters; c.KVEventsPublished == 0 || c.KVEventsDropped != 0 {
		t.Fatalf("stats: %d published, %d dropped; want some, 0", c.KVEventsPublished, c.KVEventsDropped)
	}
}

// asUint reads a msgpack integer that must be non-negative.
func asUint(t *testing.T, v any) uint64 {
	t.Helper()
	switch x := v.(type) {
	case uint8:
		return uint64(x)
	case uint16:
		return uint64(x)
	case uint32:
		return uint64(x)
	case uint64:
		return x
	case int8:
		if x >= 0 {
			return uint64(x)
		}
	case int16, int32, int64:
		// msgspec writes non-negative integers as positive fixint or uint*.
	}
	t.Fatalf("%#v (%T) is not a msgpack non-negative integer as msgspec writes them", v, v)
	return 0
}
