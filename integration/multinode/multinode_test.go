// Package multinode_test runs two kvtierfs "nodes" on one machine — two
// daemons, two stores, two shm regions, two mounts — and replays the engine
// of a tensor-parallel group across them: stores from both workers' regions,
// promotions through the head's mount, rows compared across nodes.
package multinode_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/integration/engineio"
	"github.com/kvtierfs/kvtierfs/integration/mounttest"
	"github.com/kvtierfs/kvtierfs/sync/rowsync"
)

func TestMain(m *testing.M) { mounttest.Main(m) }

const (
	rowBytes = 256 << 10
	rows     = 32
	tierDir  = "MLA_0123456789ab_r0"
)

// node is one machine of the group: its region and, when mounted, its daemon.
type node struct {
	region *engineio.Region
	daemon *mounttest.Daemon
	tier   *engineio.Tier
}

func hashOf(i int) string {
	sum := sha256.Sum256([]byte(fmt.Sprintf("mla-chunk-%d", i)))
	return hex.EncodeToString(sum[:])
}

// writeKV is a worker's GPU→CPU store of chunk i into a row: slot 0 holds the
// KV (rank-dependent unless replicated), the other node's slot stays zero.
func writeKV(row []byte, i, rank int, replicated bool) {
	seed := uint64(i)
	if !replicated {
		seed += uint64(rank+1) << 40
	}
	engineio.FillPattern(row[:len(row)/2], seed)
	clear(row[len(row)/2:])
}

func newRegion(t *testing.T, name string) *engineio.Region {
	t.Helper()
	r, err := engineio.CreateRegion(fmt.Sprintf("/dev/shm/kvtier-test-%s-%s-%d.mmap", filepath.Base(t.Name()), name, os.Getpid()), rows, rowBytes)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func secretFile(t *testing.T) string {
	t.Helper()
	b := make([]byte, 32)
	rand.Read(b)
	p := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(p, []byte(hex.EncodeToString(b)), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// handedOut holds every address freeAddr returned in this test binary: the
// kernel may hand a closed port 0 listener's port out again, and two daemons
// of one group were once given the same --listen port.
var handedOut = struct {
	sync.Mutex
	addrs map[string]bool
}{addrs: map[string]bool{}}

// freeAddr returns a loopback address with a port nothing listens on, never
// one it returned before.
func freeAddr(t *testing.T) string {
	t.Helper()
	handedOut.Lock()
	defer handedOut.Unlock()
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		if !handedOut.addrs[addr] {
			handedOut.addrs[addr] = true
			return addr
		}
	}
}

func (n *node) mount(t *testing.T, store string, wrapper []string, args ...string) {
	t.Helper()
	n.daemon = mounttest.Start(t, mounttest.Options{Store: store, ShmGlob: n.region.Path, Args: args, Wrapper: wrapper})
	tier, err := engineio.OpenTier(n.daemon.Mountpoint)
	if err != nil {
		t.Fatal(err)
	}
	n.tier = tier
}

// storeChunks runs the group's GPU→CPU stores of chunks [0, count) into rows
// [0, count) on both nodes, and the head's disk store of each.
func storeChunks(t *testing.T, head, peer *node, count int, replicated bool) {
	t.Helper()
	for i := 0; i < count; i++ {
		writeKV(head.region.Row(i), i, 0, replicated)
		writeKV(peer.region.Row(i), i, 1, replicated)
		if _, err := head.tier.Store(head.tier.BlockPath(tierDir, 0, hashOf(i)), head.region.Row(i)); err != nil {
			t.Fatal(err)
		}
	}
}

// promote loads chunk i into row of the head's region, as the engine's
// disk→CPU promotion does, and reports whether the peer's row now holds the
// same bytes.
func promote(head, peer *node, i, row int) (identical bool, err error) {
	err = head.tier.Load(head.tier.BlockPath(tierDir, 0, hashOf(i)), head.region.Row(row))
	return bytes.Equal(head.region.Row(row), peer.region.Row(row)), err
}

// twoNodes mounts the head (mirroring to the peer when sync is set) and the
// peer, and returns the secret file they share.
func twoNodes(t *testing.T, sync bool, wrapA, wrapB []string, listen, dial string) (head, peer *node, secret string) {
	head, peer = &node{region: newRegion(t, "A")}, &node{region: newRegion(t, "B")}
	secret = secretFile(t)
	peer.mount(t, t.TempDir(), wrapB, "--listen", listen, "--row-bytes", strconv.Itoa(rowBytes), "--secret-file", secret)
	if sync {
		head.mount(t, t.TempDir(), wrapA, "--peer", dial, "--secret-file", secret)
	} else {
		head.mount(t, t.TempDir(), wrapA)
	}
	return head, peer, secret
}

// TestPromotedRowsMatchAcrossNodes reproduces the field's 0/N identical rows
// without mirroring and checks N/N with it, comparing both regions row by
// row after each close returns.
func TestPromotedRowsMatchAcrossNodes(t *testing.T) {
	const chunks = rows / 2
	for _, sync := range []bool{false, true} {
		t.Run(fmt.Sprintf("sync=%v", sync), func(t *testing.T) {
			addr := freeAddr(t)
			head, peer, _ := twoNodes(t, sync, nil, nil, addr, addr)
			identical := promoteAll(t, head, peer, chunks)
			want := map[bool]int{false: 0, true: chunks}[sync]
			if identical != want {
				t.Fatalf("sync=%v: %d of %d promoted rows identical across nodes, want %d", sync, identical, chunks, want)
			}
			if sync {
				st := head.daemon.Stats()
				if st.Counters.RowsMirrored != chunks || st.Replication == nil || !st.Replication.Allowed || len(st.Peers) != 1 || st.Peers[0].State != "up" {
					t.Fatalf("head stats: mirrored %d, replication %+v, peers %+v", st.Counters.RowsMirrored, st.Replication, st.Peers)
				}
			}
		})
	}
}

// promoteAll stores chunks on both nodes, then promotes each into a fresh row
// of the head's region and counts the rows identical on the peer.
func promoteAll(t *testing.T, head, peer *node, chunks int) int {
	t.Helper()
	storeChunks(t, head, peer, chunks, true)
	identical := 0
	for i := 0; i < chunks; i++ {
		same, err := promote(head, peer, i, chunks+i)
		if err != nil {
			t.Fatalf("promotion of chunk %d: %v", i, err)
		}
		if same {
			identical++
		}
	}
	return identical
}

// TestPeerDeathFailsClosed kills the peer during a promotion storm: every
// close after the death fails, no load ever reports success with the peer's
// row stale, lookups answer absent, and mirroring resumes once the peer is
// back on its address.
func TestPeerDeathFailsClosed(t *testing.T) {
	addr := freeAddr(t)
	head, peer, secret := twoNodes(t, true, nil, nil, addr, addr)
	storeChunks(t, head, peer, rows/2, true)

	for i := 0; i < rows/2; i++ {
		if i == rows/4 {
			peer.daemon.Stop()
		}
		same, err := promote(head, peer, i, rows/2+i)
		if err == nil && !same {
			t.Fatalf("chunk %d: the load succeeded while the peer's row is stale", i)
		}
		if i >= rows/4 && err == nil {
			t.Fatalf("chunk %d: the load succeeded after the peer died", i)
		}
		if i >= rows/4 && !errors.Is(err, syscall.EIO) && !errors.Is(err, syscall.ENOENT) {
			t.Fatalf("chunk %d after the peer died: %v, want ENOENT (withheld) or EIO at close", i, err)
		}
	}
	// The kernel may answer from its entry cache for up to its lifetime (1 s);
	// every lookup that reaches the daemon answers absent.
	present := head.tier.BlockPath(tierDir, 0, hashOf(rows/4-1))
	for start := time.Now(); head.tier.Exists(present); time.Sleep(50 * time.Millisecond) {
		if time.Since(start) > 3*time.Second {
			t.Fatal("a lookup still answers present 3 s after the peer went down")
		}
	}
	if st := head.daemon.Stats(); st.Counters.LookupsWithheld == 0 {
		t.Fatal("no lookup was withheld while the peer was down")
	}

	peer.mount(t, t.TempDir(), nil, "--listen", addr, "--row-bytes", strconv.Itoa(rowBytes), "--secret-file", secret)
	// Chunks whose loads failed were deleted by the engine: store them again.
	storeChunks(t, head, peer, rows/2, true)
	deadline := time.Now().Add(30 * time.Second)
	for {
		same, err := promote(head, peer, 0, rows-1)
		if err == nil {
			if !same {
				t.Fatal("after recovery: the load succeeded with the peer's row stale")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("mirroring did not resume within 30 s after the peer came back: %v", err)
		}
		storeChunks(t, head, peer, 1, true)
		time.Sleep(200 * time.Millisecond)
	}
}

// TestWrongSecretIsRefused mounts a head whose secret differs from the peer's:
// the connection is refused and counted, and the head serves no loads.
func TestWrongSecretIsRefused(t *testing.T) {
	addr := freeAddr(t)
	head, peer := &node{region: newRegion(t, "A")}, &node{region: newRegion(t, "B")}
	peer.mount(t, t.TempDir(), nil, "--listen", addr, "--row-bytes", strconv.Itoa(rowBytes), "--secret-file", secretFile(t))
	head.mount(t, t.TempDir(), nil, "--peer", addr, "--secret-file", secretFile(t), "--replicated-kv", "on")
	writeKV(head.region.Row(0), 0, 0, true)
	path := head.tier.BlockPath(tierDir, 0, hashOf(0))
	if _, err := head.tier.Store(path, head.region.Row(0)); err != nil {
		t.Fatal(err)
	}
	_, err := promote(head, peer, 0, 1)
	if !errors.Is(err, syscall.EIO) && !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("load with an unauthenticated peer: %v, want ENOENT (withheld) or EIO", err)
	}
	if st := peer.daemon.Stats(); st.Counters.AuthFailures == 0 {
		t.Fatalf("peer counted no authentication failure: %+v", st.Counters)
	}
	if st := head.daemon.Stats(); len(st.Peers) != 1 || st.Peers[0].State == "up" {
		t.Fatalf("head peers %+v, want the peer not up", st.Peers)
	}
}

// TestNonReplicatedKVDisablesMirroring stores rows that differ across nodes
// (head-sharded KV): auto mode turns mirroring off, says why in stat, and the
// head stops offering blocks the other ranks could not load.
func TestNonReplicatedKVDisablesMirroring(t *testing.T) {
	addr := freeAddr(t)
	head, peer, _ := twoNodes(t, true, nil, nil, addr, addr)
	storeChunks(t, head, peer, 4, false)
	st := head.daemon.Stats()
	if st.Replication == nil || st.Replication.Allowed || st.Replication.Mismatches == 0 {
		t.Fatalf("replication %+v, want mirroring off after mismatching samples", st.Replication)
	}
	found := false
	for _, w := range st.Warnings {
		found = found || w.Code == "mirroring_off"
	}
	if !found {
		t.Fatalf("warnings %+v, want mirroring_off", st.Warnings)
	}
	if head.tier.Exists(head.tier.BlockPath(tierDir, 0, hashOf(0))) {
		t.Fatal("a block answered present although no other rank could load it")
	}
	if out, _ := mounttest.Run("stat", head.daemon.Mountpoint); !strings.Contains(out, "mirroring_off") {
		t.Fatalf("kvtierfs stat does not show why mirroring is off:\n%s", out)
	}
}

// TestMirrorOverVeth runs the promotion check with each node in its own
// network namespace joined by a veth pair, so rows cross a real link. Then
// the link is cut on the peer's side, so the peer goes silent without
// closing anything: the head must find it down while idle (keepalive) and
// withhold its lookups, rather than wait for a load to fail.
func TestMirrorOverVeth(t *testing.T) {
	for _, tool := range []string{"ip", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed (iproute2, util-linux): run make deps", tool)
		}
	}
	nsA, nsB := fmt.Sprintf("kvtA%d", os.Getpid()), fmt.Sprintf("kvtB%d", os.Getpid())
	ip := func(args ...string) error {
		out, err := exec.Command("ip", args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	if err := ip("netns", "add", nsA); err != nil {
		t.Fatalf("network namespaces unavailable: %v", err)
	}
	t.Cleanup(func() { ip("netns", "del", nsA) })
	if err := ip("netns", "add", nsB); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ip("netns", "del", nsB) })
	vethA, vethB := fmt.Sprintf("kva%d", os.Getpid()%100000), fmt.Sprintf("kvb%d", os.Getpid()%100000)
	for _, args := range [][]string{
		{"link", "add", vethA, "type", "veth", "peer", "name", vethB},
		{"link", "set", vethA, "netns", nsA},
		{"link", "set", vethB, "netns", nsB},
		{"-n", nsA, "addr", "add", "10.213.7.1/24", "dev", vethA},
		{"-n", nsB, "addr", "add", "10.213.7.2/24", "dev", vethB},
		{"-n", nsA, "link", "set", vethA, "up"},
		{"-n", nsB, "link", "set", vethB, "up"},
		{"-n", nsA, "link", "set", "lo", "up"},
		{"-n", nsB, "link", "set", "lo", "up"},
	} {
		if err := ip(args...); err != nil {
			t.Fatal(err)
		}
	}
	// nsenter enters only the network namespace; `ip netns exec` would also
	// give the daemon a private mount namespace and hide its mount.
	head, peer, _ := twoNodes(t, true, []string{"nsenter", "--net=/var/run/netns/" + nsA}, []string{"nsenter", "--net=/var/run/netns/" + nsB},
		"10.213.7.2:7470", "10.213.7.2:7470")
	const chunks = rows / 2
	if identical := promoteAll(t, head, peer, chunks); identical != chunks {
		t.Fatalf("over veth: %d of %d promoted rows identical, want all", identical, chunks)
	}

	if err := ip("-n", nsB, "link", "set", vethB, "down"); err != nil {
		t.Fatal(err)
	}
	for start := time.Now(); ; time.Sleep(100 * time.Millisecond) {
		st := head.daemon.Stats()
		if len(st.Peers) == 1 && st.Peers[0].State == rowsync.StateDown {
			break
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("the peer behind a cut link is still %+v after 30 s", st.Peers)
		}
	}
	present := head.tier.BlockPath(tierDir, 0, hashOf(0))
	for start := time.Now(); head.tier.Exists(present); time.Sleep(50 * time.Millisecond) {
		if time.Since(start) > 3*time.Second {
			t.Fatal("a lookup still answers present 3 s after the silent peer was found down")
		}
	}
}

// TestSignalsDuringCloseDoNotFailLoads promotes rows from a thread that keeps
// receiving signals (as any engine thread may): the kernel interrupts the
// FLUSH, but mirroring completes and every load succeeds with identical rows.
func TestSignalsDuringCloseDoNotFailLoads(t *testing.T) {
	addr := freeAddr(t)
	head, peer, _ := twoNodes(t, true, nil, nil, addr, addr)
	const chunks = rows / 2
	storeChunks(t, head, peer, chunks, true)

	tids := make(chan int, 1)
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		tids <- unix.Gettid()
		for i := 0; i < chunks; i++ {
			same, err := promote(head, peer, i, chunks+i)
			if err == nil && !same {
				err = fmt.Errorf("chunk %d: peer row stale after a successful load", i)
			}
			if err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	tid := <-tids
	for {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			return
		default:
			unix.Tgkill(os.Getpid(), tid, unix.SIGURG)
			time.Sleep(200 * time.Microsecond)
		}
	}
}

// failureStorm promotes the chunks stored blocks into rows chunks… of the
// head's region from four threads with vLLM's C loader (close errors
// ignored), and calls fail once the first quarter of the loads has
// finished. A load that succeeds must leave its row the same at every rank
// (same). It returns the loads that succeeded before the failure, and those
// that succeeded and failed after it.
func failureStorm(t *testing.T, head *node, chunks int, same func(row int) bool, fail func()) (okBefore, okAfter, failedAfter int) {
	const threads = 4
	results := make(chan error, chunks)
	next := make(chan int)
	for range threads {
		go engineio.OnSignalFreeThread(func() {
			for i := range next {
				err := head.tier.LoadIgnoringClose(head.tier.BlockPath(tierDir, 0, hashOf(i)), head.region.Row(chunks+i))
				if err == nil && !same(chunks+i) {
					err = fmt.Errorf("chunk %d: the load succeeded and a rank's row differs", i)
					t.Error(err)
				}
				results <- err
			}
		})
	}
	failAt := chunks / 4
	for i := range chunks {
		if i == failAt {
			for range failAt { // the loads before the failure finish first
				if <-results == nil {
					okBefore++
				}
			}
			fail()
		}
		next <- i
	}
	close(next)
	for range chunks - failAt {
		if err := <-results; err == nil {
			okAfter++
		} else {
			failedAfter++
		}
	}
	return okBefore, okAfter, failedAfter
}

// TestPeerFailureFailsTheRead promotes rows from four threads with vLLM's C
// loader, which ignores close errors, while the peer is stalled (SIGSTOP)
// or killed: the loads after the failure fail at open or at their read, and
// every load that succeeded left the peer's row identical to the head's.
func TestPeerFailureFailsTheRead(t *testing.T) {
	for _, failure := range []string{"stalled", "killed"} {
		t.Run(failure, func(t *testing.T) {
			addr := freeAddr(t)
			head, peer := &node{region: newRegion(t, "A")}, &node{region: newRegion(t, "B")}
			secret := secretFile(t)
			peer.mount(t, t.TempDir(), nil, "--listen", addr, "--row-bytes", strconv.Itoa(rowBytes), "--secret-file", secret)
			head.mount(t, t.TempDir(), nil, "--peer", addr, "--secret-file", secret, "--sync-deadline", "300ms")
			pid := peer.daemon.Pid()
			t.Cleanup(func() { syscall.Kill(pid, syscall.SIGCONT) }) // before the daemon's own cleanup stops it
			const chunks = rows / 2
			storeChunks(t, head, peer, chunks, true)

			okBefore, okAfter, failedAfter := failureStorm(t, head, chunks, func(row int) bool {
				return bytes.Equal(head.region.Row(row), peer.region.Row(row))
			}, func() {
				if failure == "stalled" {
					syscall.Kill(pid, syscall.SIGSTOP)
				} else {
					peer.daemon.Kill9()
				}
			})
			if okBefore == 0 || failedAfter == 0 {
				t.Fatalf("%d loads succeeded before the peer %s, %d failed after; want some of each", okBefore, failure, failedAfter)
			}
			if st := head.daemon.Stats(); st.Counters.LoadsUnmirrored == 0 && st.Counters.LookupsWithheld == 0 {
				t.Fatalf("loads failed after the peer %s, but neither at their read nor at a withheld lookup: %+v", failure, st.Counters)
			}
			t.Logf("peer %s: %d loads before, %d succeeded and %d failed after", failure, okBefore, okAfter, failedAfter)
		})
	}
}

// TestPeerCannotFixTheRowSize: a peer holding the secret sends the receiving
// daemon a row of another size before the head mirrors anything (issue 24
// item 8: at aea8194 that first row fixed the receiver's row size, and every
// real mirrored load failed after it). The receiver keeps its own size
// (--row-bytes): the stray row is refused, the region untouched, and the
// head's promotions then mirror as usual.
func TestPeerCannotFixTheRowSize(t *testing.T) {
	addr := freeAddr(t)
	head, peer, secretPath := twoNodes(t, true, nil, nil, addr, addr)
	secret, err := rowsync.ReadSecretFile(secretPath)
	if err != nil {
		t.Fatal(err)
	}
	stray, err := rowsync.NewMirror(rowsync.MirrorConfig{Peers: []string{addr}, Secret: secret, Logf: func(string, ...any) {}})
	if err != nil {
		t.Fatal(err)
	}
	defer stray.Close()
	for start := time.Now(); !stray.Healthy(); time.Sleep(10 * time.Millisecond) {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("the stray sender never connected: %+v", stray.Stats())
		}
	}
	pageRows := rows * rowBytes / engineio.PageSize // the same region as rows of one page
	pages, err := rowsync.NewRegion(make([]byte, rows*rowBytes), engineio.PageSize)
	if err != nil {
		t.Fatal(err)
	}
	copy(pages.Row(pageRows-1), "a stray page")
	before := bytes.Clone(peer.region.Bytes())
	err = stray.MirrorRow(context.Background(), pages, pageRows-1, bytes.Clone(pages.Row(pageRows-1)))
	if err == nil || !strings.Contains(err.Error(), "geometry mismatch") {
		t.Fatalf("a row of one page = %v, want refused as a geometry mismatch", err)
	}
	if !bytes.Equal(before, peer.region.Bytes()) {
		t.Fatal("the stray row changed the receiver's region")
	}
	const chunks = rows / 2
	if identical := promoteAll(t, head, peer, chunks); identical != chunks {
		t.Fatalf("after a stray row: %d of %d promoted rows identical across nodes, want all", identical, chunks)
	}
}
