package multinode_test

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvtierfs/kvtierfs/integration/engineio"
	"github.com/kvtierfs/kvtierfs/integration/mounttest"
	"github.com/kvtierfs/kvtierfs/integration/netns"
	"github.com/kvtierfs/kvtierfs/sync/rowsync"
)

// A TP group of three or four nodes (issues 27 and 28): every daemon gets the
// same flags, one --peer per node of the group, itself included; node 0 is
// the head, which stores and promotes, and every row it loads must land at
// every rank.

// group is the nodes of a TP group and how to start each one's daemon.
type group struct {
	nodes    []*node
	addrs    []string   // each node's --listen address
	wrappers [][]string // each node's daemon wrapper (its network namespace)
	secret   string
}

// newGroup makes a group of len(addrs) nodes with their regions; start mounts them.
func newGroup(t *testing.T, addrs []string, wrappers [][]string) *group {
	g := &group{addrs: addrs, wrappers: wrappers, secret: secretFile(t)}
	for i := range addrs {
		g.nodes = append(g.nodes, &node{region: newRegion(t, strconv.Itoa(i))})
	}
	return g
}

// args are node i's flags: with sync, the group's one peer list.
func (g *group) args(i int, sync bool) []string {
	if !sync {
		return nil
	}
	args := []string{"--listen", g.addrs[i], "--row-bytes", strconv.Itoa(rowBytes), "--secret-file", g.secret}
	for _, a := range g.addrs {
		args = append(args, "--peer", a)
	}
	return args
}

// start mounts node i's daemon from binary (empty: the one the tests built).
func (g *group) start(t *testing.T, i int, sync bool, binary string) {
	t.Helper()
	n := g.nodes[i]
	n.daemon = mounttest.Start(t, mounttest.Options{Store: t.TempDir(), ShmGlob: n.region.Path, Args: g.args(i, sync), Wrapper: g.wrappers[i], Binary: binary})
	tier, err := engineio.OpenTier(n.daemon.Mountpoint)
	if err != nil {
		t.Fatal(err)
	}
	n.tier = tier
}

// startAll mounts every node, peers last so that the head finds them soon.
func (g *group) startAll(t *testing.T, sync bool) {
	t.Helper()
	for i := len(g.nodes) - 1; i >= 0; i-- {
		g.start(t, i, sync, "")
	}
}

// waitUp waits until the head shows itself and every other node up.
func (g *group) waitUp(t *testing.T) {
	t.Helper()
	for start := time.Now(); ; time.Sleep(20 * time.Millisecond) {
		st := g.nodes[0].daemon.Stats()
		states := map[string]int{}
		for _, p := range st.Peers {
			states[p.State]++
		}
		if states[rowsync.StateSelf] == 1 && states[rowsync.StateUp] == len(g.nodes)-1 {
			return
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("the head's peers are %+v after 30 s, want itself and %d up", st.Peers, len(g.nodes)-1)
		}
	}
}

// store has every rank write chunks [0, count) into rows [0, count) of its
// node's region (replicated KV: the same bytes) and the head store each.
func (g *group) store(t *testing.T, count int) {
	t.Helper()
	head := g.nodes[0]
	for i := range count {
		for rank, n := range g.nodes {
			writeKV(n.region.Row(i), i, rank, true)
		}
		if _, err := head.tier.Store(head.tier.BlockPath(tierDir, 0, hashOf(i)), head.region.Row(i)); err != nil {
			t.Fatal(err)
		}
	}
}

// sameEverywhere reports whether row of every node's region equals the head's.
func (g *group) sameEverywhere(row int) bool {
	for _, n := range g.nodes[1:] {
		if !bytes.Equal(n.region.Row(row), g.nodes[0].region.Row(row)) {
			return false
		}
	}
	return true
}

// promoteAll promotes chunks [0, count) into rows [count, 2 count) of the
// head's region and returns how many rows are then the same at every rank.
func (g *group) promoteAll(t *testing.T, count int) int {
	t.Helper()
	same := 0
	for i := range count {
		head := g.nodes[0]
		if err := head.tier.Load(head.tier.BlockPath(tierDir, 0, hashOf(i)), head.region.Row(count+i)); err != nil {
			t.Fatalf("promotion of chunk %d: %v", i, err)
		}
		if g.sameEverywhere(count + i) {
			same++
		}
	}
	return same
}

// netnsGroup puts n nodes in network namespaces of their own on one bridge
// (package netns), removed when the test ends.
func netnsGroup(t *testing.T, n int) (addrs []string, wrappers [][]string) {
	t.Helper()
	g, err := netns.New("kvt", n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	for i := range n {
		addrs = append(addrs, g.IP(i)+":7470")
		wrappers = append(wrappers, g.Wrapper(i))
	}
	return addrs, wrappers
}

// TestOnePeerListForThree: three daemons on loopback given one peer list
// that names all three (a DaemonSet's, issue 27): each skips its own entry,
// no peer is down, nothing blames the secret, and a promotion reaches both
// other ranks.
func TestOnePeerListForThree(t *testing.T) {
	g := newGroup(t, []string{freeAddr(t), freeAddr(t), freeAddr(t)}, make([][]string, 3))
	g.startAll(t, true)
	g.waitUp(t)
	const chunks = rows / 4
	g.store(t, chunks)
	if same := g.promoteAll(t, chunks); same != chunks {
		t.Fatalf("%d of %d promoted rows the same at all three ranks, want all", same, chunks)
	}
	for i, n := range g.nodes {
		st := n.daemon.Stats()
		if st.Counters.AuthFailures != 0 {
			t.Errorf("node %d counted %d authentication failures", i, st.Counters.AuthFailures)
		}
		for _, w := range st.Warnings {
			if w.Code == "peer_down" {
				t.Errorf("node %d warns %s", i, w.Message)
			}
		}
		if out, _ := mounttest.Run("stat", n.daemon.Mountpoint); strings.Contains(out, "shared secret") || !strings.Contains(out, rowsync.StateSelf) {
			t.Errorf("node %d's stat does not show its own entry as self, or blames the secret:\n%s", i, out)
		}
	}
}

// TestFourNodesInNetns: four nodes in network namespaces, TP across them:
// without mirroring the three other ranks hold stale rows after every
// promotion; with it every rank holds the head's row when the read returns.
func TestFourNodesInNetns(t *testing.T) {
	for _, sync := range []bool{false, true} {
		t.Run(fmt.Sprintf("sync=%v", sync), func(t *testing.T) {
			addrs, wrappers := netnsGroup(t, 4)
			g := newGroup(t, addrs, wrappers)
			g.startAll(t, sync)
			if sync {
				g.waitUp(t)
			}
			const chunks = rows / 2
			g.store(t, chunks)
			want := map[bool]int{false: 0, true: chunks}[sync]
			if same := g.promoteAll(t, chunks); same != want {
				t.Fatalf("sync=%v: %d of %d promoted rows the same at all four ranks, want %d", sync, same, chunks, want)
			}
			if !sync {
				return
			}
			st := g.nodes[0].daemon.Stats()
			var sent uint64
			for _, p := range st.Peers {
				sent += p.Bytes
			}
			// writeKV fills half of each row: the head sends that half once to each peer.
			if st.Counters.RowsMirrored != chunks || sent != uint64(3*chunks*rowBytes/2) {
				t.Errorf("head mirrored %d rows, sent %d B; want %d rows, %d B", st.Counters.RowsMirrored, sent, chunks, 3*chunks*rowBytes/2)
			}
		})
	}
}

// TestOneOfThreePeersFails: during a promotion storm on four threads with
// vLLM's C loader (close errors ignored), one of the head's three peers is
// killed, stalled (SIGSTOP) or starts lying (a daemon built to acknowledge
// every row with a wrong CRC32C takes over its address). The loads after
// fail at open or at their read on the head, every load that succeeded left
// the same row at all four ranks, and once the peer is back mirroring
// resumes.
func TestOneOfThreePeersFails(t *testing.T) {
	liar := mounttest.BuildTagged(t, "kvtierfs_liar")
	for _, failure := range []string{"killed", "stalled", "lying"} {
		t.Run(failure, func(t *testing.T) {
			addrs, wrappers := netnsGroup(t, 4)
			g := newGroup(t, addrs, wrappers)
			g.startAll(t, true)
			g.waitUp(t)
			const victim, chunks = 3, rows / 2
			pid := g.nodes[victim].daemon.Pid()
			t.Cleanup(func() { syscall.Kill(pid, syscall.SIGCONT) }) // before the daemon's own cleanup stops it
			g.store(t, chunks)
			head := g.nodes[0]

			failAt := chunks / 4
			okBefore, okAfter, failedAfter := failureStorm(t, head, chunks, g.sameEverywhere, func() {
				switch failure {
				case "killed":
					g.nodes[victim].daemon.Kill9()
				case "stalled":
					syscall.Kill(pid, syscall.SIGSTOP)
				case "lying":
					g.nodes[victim].daemon.Stop()
					g.start(t, victim, true, liar)
					g.waitUp(t) // the head has reached the liar: its next rows are acknowledged wrong
				}
			})
			t.Logf("peer %s: %d loads before, %d succeeded and %d failed after", failure, okBefore, okAfter, failedAfter)
			if okBefore == 0 || failedAfter == 0 {
				t.Fatalf("%d of %d loads succeeded before the peer was %s, %d failed after; want some of each", okBefore, failAt, failure, failedAfter)
			}
			st := head.daemon.Stats()
			if st.Counters.LoadsUnmirrored == 0 && st.Counters.LookupsWithheld == 0 {
				t.Fatalf("loads failed after the peer was %s, but neither at their read nor at a withheld lookup: %+v", failure, st.Counters)
			}
			if failure == "lying" && st.Counters.LoadsUnmirrored == 0 {
				t.Fatalf("no load failed at its read while the peer lied: %+v", st.Counters)
			}

			switch failure {
			case "killed":
				g.start(t, victim, true, "")
			case "stalled":
				syscall.Kill(pid, syscall.SIGCONT)
			case "lying":
				g.nodes[victim].daemon.Stop()
				g.start(t, victim, true, "")
			}
			g.waitUp(t)
			resumeAt := time.Now()
			for {
				err := head.tier.Load(head.tier.BlockPath(tierDir, 0, hashOf(0)), head.region.Row(rows-1))
				if err == nil {
					if !g.sameEverywhere(rows - 1) {
						t.Fatal("after the peer came back: the load succeeded and a rank's row differs")
					}
					break
				}
				if !errors.Is(err, syscall.EIO) && !errors.Is(err, syscall.ENOENT) {
					t.Fatalf("after the peer came back: %v", err)
				}
				if time.Since(resumeAt) > 30*time.Second {
					t.Fatalf("mirroring did not resume within 30 s after the peer came back: %v", err)
				}
				g.store(t, 1) // a failed load may have been the engine's last look at it
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
}
