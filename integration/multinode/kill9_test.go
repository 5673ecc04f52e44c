package multinode_test

import (
	"bytes"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvtierfs/kvtierfs/fusefs/mountinfo"
	"github.com/kvtierfs/kvtierfs/integration/engineio"
	"github.com/kvtierfs/kvtierfs/integration/mounttest"
	"github.com/kvtierfs/kvtierfs/sync/rowsync"
)

// Kill9RoundsEnv sets how many kill -9 rounds TestKill9RoundsTwoNodes runs;
// CI runs defaultKill9Rounds, RELIABILITY.md records a run of 50.
const Kill9RoundsEnv = "KVTIERFS_KILL9_ROUNDS"

const defaultKill9Rounds = 5

// Storm shape: store threads write rows [0, storers) of both regions and
// store them through the head; load threads promote acknowledged blocks into
// rows [storers, storers+loaders) of the head, mirrored to the peer.
const (
	storers    = 3
	loaders    = 3
	auditRow   = storers + loaders
	stormRows  = auditRow + 1
	earlierTry = 16 // blocks of earlier rounds loaded again after each round
)

// stormTally is what one round's storm saw.
type stormTally struct {
	mu        sync.Mutex
	acked     []int // chunks whose store returned success
	issued    []int // every chunk a store was started for
	loads     int
	loadsFail int
	failLive  int // loads that failed while the head was still alive
	wrong     int // successful loads with wrong bytes in the head's row
	stale     int // successful loads whose peer row differs
}

// TestKill9RoundsTwoNodes runs a mixed store/load/mirror storm through a head
// mirroring to a peer, kills the head with SIGKILL at a random point, leaves
// its dead mount in place and mounts the same store again over it. After each
// round: no stale mount, no tmp file in the store, every block of the round
// acknowledged to a store is present and byte-exact, every block issued is
// byte-exact or absent, and every load that succeeded during the storm left the
// peer's row identical to the head's. Loads use vLLM's C loader (close errors
// ignored), so only the read can refuse wrong bytes.
func TestKill9RoundsTwoNodes(t *testing.T) {
	rounds := defaultKill9Rounds
	if v := os.Getenv(Kill9RoundsEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive number of rounds", Kill9RoundsEnv, v)
		}
		rounds = n
	}
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 0))
	t.Logf("%d rounds, seed %d", rounds, seed)

	head := &node{region: newRegionRows(t, "A", stormRows)}
	peer := &node{region: newRegionRows(t, "B", stormRows)}
	addr, secret, store := freeAddr(t), secretFile(t), t.TempDir()
	peer.mount(t, t.TempDir(), nil, "--listen", addr, "--row-bytes", strconv.Itoa(rowBytes), "--secret-file", secret)
	headArgs := []string{"--peer", addr, "--secret-file", secret, "--replicated-kv", "on", "--sync-deadline", "2s"}
	head.daemon = mounttest.Start(t, mounttest.Options{Store: store, ShmGlob: head.region.Path, Args: headArgs})
	mnt := head.daemon.Mountpoint

	var acked []int // every acknowledged chunk of earlier rounds
	next := 0
	var totals struct{ loads, loadsFail, failLive, audited, stale, wrong int }
	for round := range rounds {
		openHeadTier(t, head)
		waitPeerUp(t, head)
		tally := storm(t, head, peer, &next, acked, time.Duration(20+rng.IntN(400))*time.Millisecond)

		// The crash leaves the dead mount where it is, as in the field; the
		// next mount must detach it by itself.
		head.daemon = mounttest.Start(t, mounttest.Options{Store: store, Mountpoint: mnt, ShmGlob: head.region.Path, Args: headArgs})
		openHeadTier(t, head)
		if n := mountsAt(t, mnt); n != 1 {
			t.Fatalf("round %d: %d mounts at %s after the remount, want 1", round, n, mnt)
		}
		if tmps := tmpFiles(t, store); len(tmps) != 0 {
			t.Fatalf("round %d: tmp files in the store after the remount: %v", round, tmps)
		}
		waitPeerUp(t, head)

		ackedNow := map[int]bool{}
		for _, i := range tally.acked {
			ackedNow[i] = true
		}
		audit := func(i int, mustExist bool) {
			path := head.tier.BlockPath(tierDir, 0, hashOf(i))
			if !head.tier.Exists(path) {
				if mustExist {
					t.Errorf("round %d: acknowledged block %d is gone after kill -9", round, i)
				}
				return
			}
			row := head.region.Row(auditRow)
			engineio.FillPattern(row, rng.Uint64())
			engineio.FillPattern(peer.region.Row(auditRow), rng.Uint64())
			if err := head.tier.LoadIgnoringClose(path, row); err != nil {
				t.Errorf("round %d: block %d answers present but does not load: %v", round, i, err)
				return
			}
			totals.audited++
			if !bytes.Equal(row, chunkBytes(i)) {
				totals.wrong++
				t.Errorf("round %d: block %d loaded with wrong bytes", round, i)
			}
			if !bytes.Equal(row, peer.region.Row(auditRow)) {
				totals.stale++
				t.Errorf("round %d: block %d loaded but the peer's row differs", round, i)
			}
		}
		for _, i := range tally.issued {
			audit(i, ackedNow[i])
		}
		for _, i := range acked {
			if !head.tier.Exists(head.tier.BlockPath(tierDir, 0, hashOf(i))) {
				t.Errorf("round %d: block %d acknowledged in an earlier round is gone", round, i)
			}
		}
		for range min(earlierTry, len(acked)) {
			audit(acked[rng.IntN(len(acked))], true)
		}
		if t.Failed() {
			t.FailNow()
		}
		acked = append(acked, tally.acked...)
		totals.loads += tally.loads
		totals.loadsFail += tally.loadsFail
		totals.failLive += tally.failLive
		totals.wrong += tally.wrong
		totals.stale += tally.stale
		t.Logf("round %d: %d stores acknowledged of %d issued, %d storm loads (%d failed), %d blocks acknowledged so far",
			round, len(tally.acked), len(tally.issued), tally.loads, tally.loadsFail, len(acked))
	}
	t.Logf("kill9 rounds=%d acknowledged=%d storm_loads=%d storm_loads_failed=%d (with the head alive: %d) audited_loads=%d wrong_bytes=%d stale_peer_rows=%d lost=0",
		rounds, len(acked), totals.loads, totals.loadsFail, totals.failLive, totals.audited, totals.wrong, totals.stale)
}

// storm stores and loads through the head until the kill, then kills the head
// with SIGKILL (leaving its mount dead) and waits for every thread to stop.
// Loads are of blocks acknowledged earlier or during this storm.
func storm(t *testing.T, head, peer *node, next *int, earlier []int, killAfter time.Duration) *stormTally {
	t.Helper()
	tally := &stormTally{}
	loadable := append([]int(nil), earlier...)
	var killed atomic.Bool
	var wg sync.WaitGroup
	first := *next
	var issued atomic.Int64
	for w := range storers {
		wg.Add(1)
		go engineio.OnSignalFreeThread(func() {
			defer wg.Done()
			for !killed.Load() {
				i := first + int(issued.Add(1)) - 1
				tally.mu.Lock()
				tally.issued = append(tally.issued, i)
				tally.mu.Unlock()
				writeKV(head.region.Row(w), i, 0, true)
				writeKV(peer.region.Row(w), i, 1, true)
				if _, err := head.tier.Store(head.tier.BlockPath(tierDir, 0, hashOf(i)), head.region.Row(w)); err != nil {
					return // the mount died
				}
				tally.mu.Lock()
				tally.acked = append(tally.acked, i)
				loadable = append(loadable, i)
				tally.mu.Unlock()
			}
		})
	}
	for w := range loaders {
		wg.Add(1)
		go engineio.OnSignalFreeThread(func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(first)))
			row := storers + w
			for !killed.Load() {
				tally.mu.Lock()
				var i = -1
				// Each loader takes its own residue class, so no two loads of
				// one block run at once (an engine loads a block into one row).
				if n := len(loadable); n > 0 {
					for range 8 {
						if c := loadable[rng.IntN(n)]; c%loaders == w {
							i = c
							break
						}
					}
				}
				tally.mu.Unlock()
				if i < 0 {
					time.Sleep(time.Millisecond)
					continue
				}
				engineio.FillPattern(head.region.Row(row), rng.Uint64())
				engineio.FillPattern(peer.region.Row(row), rng.Uint64())
				err := head.tier.LoadIgnoringClose(head.tier.BlockPath(tierDir, 0, hashOf(i)), head.region.Row(row))
				dead := killed.Load()
				tally.mu.Lock()
				tally.loads++
				switch {
				case err != nil:
					tally.loadsFail++
					if !dead {
						tally.failLive++
						t.Logf("block %d: load failed with the head alive: %v", i, err)
					}
				case !bytes.Equal(head.region.Row(row), chunkBytes(i)):
					tally.wrong++
					t.Errorf("block %d loaded with wrong bytes during the storm", i)
				case !bytes.Equal(head.region.Row(row), peer.region.Row(row)):
					tally.stale++
					t.Errorf("block %d loaded while the peer's row differs (the head was killed: %v)", i, dead)
				}
				tally.mu.Unlock()
			}
		})
	}
	time.Sleep(killAfter)
	killed.Store(true)
	head.daemon.Crash()
	wg.Wait()
	*next = first + int(issued.Load())
	return tally
}

// chunkBytes is the row chunk i is stored from (replicated KV).
func chunkBytes(i int) []byte {
	row := make([]byte, rowBytes)
	writeKV(row, i, 0, true)
	return row
}

func newRegionRows(t *testing.T, name string, n int) *engineio.Region {
	t.Helper()
	r, err := engineio.CreateRegion(filepath.Join("/dev/shm", "kvtier-test-"+filepath.Base(t.Name())+"-"+name+"-"+strconv.Itoa(os.Getpid())+".mmap"), n, rowBytes)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func openHeadTier(t *testing.T, head *node) {
	t.Helper()
	tier, err := engineio.OpenTier(head.daemon.Mountpoint)
	if err != nil {
		t.Fatal(err)
	}
	head.tier = tier
}

// waitPeerUp waits until the head's peer connection is up.
func waitPeerUp(t *testing.T, head *node) {
	t.Helper()
	for start := time.Now(); ; time.Sleep(20 * time.Millisecond) {
		st := head.daemon.Stats()
		if len(st.Peers) == 1 && st.Peers[0].State == rowsync.StateUp {
			return
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("the peer is %+v 30 s after the head mounted", st.Peers)
		}
	}
}

// mountsAt counts the mounts at mnt in this mount namespace.
func mountsAt(t *testing.T, mnt string) int {
	t.Helper()
	mounts, err := mountinfo.Read("self")
	if err != nil {
		t.Fatal(err)
	}
	return len(mountinfo.At(mounts, mnt))
}

// tmpFiles lists the *.tmp files under the store directory.
func tmpFiles(t *testing.T, store string) []string {
	t.Helper()
	var tmps []string
	err := filepath.WalkDir(store, func(p string, d fs.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, ".tmp") {
			tmps = append(tmps, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return tmps
}
