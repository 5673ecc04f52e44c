package rowsync

import (
	"crypto/sha256"
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
