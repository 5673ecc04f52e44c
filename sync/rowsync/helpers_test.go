package rowsync

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

var testSecret = []byte("kvtier-test-secret-0123456789")

// discard is a Logf for tests: background goroutines may log after a test ends.
func discard(string, ...any) {}

// shmFile creates a zeroed file /dev/shm/kvtier-test-* of size bytes,
// removed when the test ends.
func shmFile(tb testing.TB, size int) string {
	tb.Helper()
	f, err := os.CreateTemp("/dev/shm", "kvtier-test-*.mmap")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.Remove(f.Name()) })
	err = f.Truncate(int64(size))
	f.Close()
	if err != nil {
		tb.Fatal(err)
	}
	return f.Name()
}

// openRegion maps path, unmapped when the test ends.
func openRegion(tb testing.TB, path string, rowBytes int) *Region {
	tb.Helper()
	r, err := OpenRegion(path, rowBytes)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { r.Close() })
	watchRegion(tb, r, path)
	return r
}

// shmRegion maps a new zeroed region file of rows rows.
func shmRegion(tb testing.TB, rows, rowBytes int) *Region {
	return openRegion(tb, shmFile(tb, rows*rowBytes), rowBytes)
}

// fillHalf makes row look like a one-GPU-per-node row: the first half (slot
// 0) pseudo-random from seed, with its second page zero, the rest zero.
func fillHalf(row []byte, seed uint64) {
	clear(row)
	var s [32]byte
	s[0], s[1], s[2], s[3] = byte(seed), byte(seed>>8), byte(seed>>16), byte(seed>>24)
	rand.NewChaCha8(s).Read(row[:len(row)/2])
	if len(row) >= 4*block.PageSize {
		clear(row[block.PageSize : 2*block.PageSize])
	}
}

// rowHashes returns the SHA-256 of every row.
func rowHashes(r *Region) [][32]byte {
	h := make([][32]byte, r.Rows())
	for i := range h {
		h[i] = sha256.Sum256(r.Row(i))
	}
	return h
}

// waitFor polls cond until it holds; the deadline only turns a hang into a
// failure.
func waitFor(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for %s", what)
		}
	}
}

// written returns what ch writes while do runs, instead of writing it.
func written(ch *channel, do func() error) ([]byte, error) {
	conn := ch.conn
	defer func() { ch.conn = conn }()
	var out bytes.Buffer
	ch.conn = scriptConn{Writer: &out}
	err := do()
	return out.Bytes(), err
}

// sealRow returns ch's next frame, w (its bulk sealed under w.Key), as its
// lane records and its bulk records.
func sealRow(tb testing.TB, ch *channel, w *RowWrite) (lane, bulk []byte) {
	tb.Helper()
	b, err := sealBulk(w.Key, w.Extents, sealWorkers, 1)
	if err != nil {
		tb.Fatal(err)
	}
	defer b.written()
	out, err := written(ch, func() error { return ch.writeRow(w, b) })
	if err != nil {
		tb.Fatal(err)
	}
	n := len(*b.out)
	return out[:len(out)-n], out[len(out)-n:]
}

// readMessage reads ch's next frame as a Server does, a RowWrite's bulk
// included. A RowWrite of more than limit bytes (or any other frame) is
// refused: it is returned without its extents.
func readMessage(ch *channel, limit int) (Message, error) {
	var head [5]byte
	if _, err := io.ReadFull(ch, head[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(head[:4])
	if head[4] != typeRowWrite || n == 0 {
		frame, err := ReadFrame(io.MultiReader(bytes.NewReader(head[:]), ch), nil, limit)
		if err == nil {
			err = ch.endFrame()
		}
		if err != nil {
			return nil, err
		}
		return Decode(frame)
	}
	w, _, _, err := receiveRow(ch, n-1, func(w *RowWrite) ([]byte, error) {
		if w.RowBytes > uint64(limit) {
			return nil, errors.New("too large")
		}
		return make([]byte, w.RowBytes), nil
	}, nil, ch.bulk)
	return w, err
}

// freshKey returns a new row key (newBulkKey).
func freshKey(tb testing.TB) [BulkKeyBytes]byte {
	key, err := newBulkKey()
	if err != nil {
		tb.Fatal(err)
	}
	return key
}

// neverLate is the CommitBy of rows a test sends by hand: a Server's clock
// never reaches it.
const neverLate = ^uint64(0)
