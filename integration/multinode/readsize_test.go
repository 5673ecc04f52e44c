package multinode_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kvtierfs/kvtierfs/fusefs/mountinfo"
	"github.com/kvtierfs/kvtierfs/integration/engineio"
	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

// TestMirroredMountReadsHalfARow: a mount that mirrors loads takes READs of
// at most half its row (--row-bytes), so a row arrives in two READs or more
// and its destination is found before the last returns, but in few: with a
// fixed 128 KiB a row of 8,601,600 bytes took 66 READs, against 3 on a
// single node. The kernel's max_read, in the mount's options, says.
func TestMirroredMountReadsHalfARow(t *testing.T) {
	secret := secretFile(t)
	peer := []string{"--listen", freeAddr(t), "--peer", freeAddr(t), "--secret-file", secret}
	cases := []struct {
		name string
		args []string
		want int
	}{
		{"single node", nil, 4 << 20},
		{"mirrored, 8,601,600-byte rows", append([]string{"--row-bytes", "8601600"}, peer...), 4 << 20},
		{"mirrored, 8,601,600-byte rows, 8 MiB requests", append([]string{"--row-bytes", "8601600", "--max-request", "8MiB"}, peer...), 4300800},
		{"mirrored, 2 MiB rows", append([]string{"--row-bytes", "2MiB"}, peer...), 1 << 20},
		{"mirrored, 64 KiB rows", append([]string{"--row-bytes", "64KiB"}, peer...), 32 << 10},
		{"mirrored, row size unknown", peer, 128 << 10},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n := &node{region: newRegion(t, "r")}
			d := mounttest.Start(t, mounttest.Options{Store: t.TempDir(), ShmGlob: n.region.Path, Args: c.args})
			mounts, err := mountinfo.Read("self")
			if err != nil {
				t.Fatal(err)
			}
			at := mountinfo.At(mounts, d.Mountpoint)
			if len(at) == 0 {
				t.Fatalf("%s is not in mountinfo", d.Mountpoint)
			}
			opts := "," + at[len(at)-1].SuperOptions + ","
			if want := fmt.Sprintf(",max_read=%d,", c.want); !strings.Contains(opts, want) {
				t.Errorf("mount options %s, want max_read=%d", opts, c.want)
			}
		})
	}
}

// TestFieldRowsAtFourNodes: four nodes in network namespaces, rows of the
// field's 8,601,600 bytes, one slot of a quarter row holding the KV (TP 4,
// one GPU per node). The head reads each row in READs of up to 4 MiB, finds
// its row from the first and mirrors it; each peer's row, stale in the slot
// and in a page past it, ends up the head's.
func TestFieldRowsAtFourNodes(t *testing.T) {
	const fieldRow, count = 8601600, 2
	slot := fieldRow / 4 / engineio.PageSize * engineio.PageSize
	addrs, wrappers := netnsGroup(t, 4)
	secret := secretFile(t)
	nodes := make([]*node, 4)
	for i := range nodes {
		nodes[i] = &node{region: newRegionSized(t, strconv.Itoa(i), 2*count, fieldRow)}
	}
	for i := len(nodes) - 1; i >= 0; i-- {
		args := []string{"--listen", addrs[i], "--row-bytes", strconv.Itoa(fieldRow), "--secret-file", secret}
		for _, a := range addrs {
			args = append(args, "--peer", a)
		}
		nodes[i].mount(t, t.TempDir(), wrappers[i], args...)
	}
	g := &group{nodes: nodes}
	g.waitUp(t)
	head := nodes[0]
	for i := range count {
		for _, n := range nodes {
			row := n.region.Row(i)
			engineio.FillPattern(row[:slot], uint64(i))
			clear(row[slot:])
		}
		if _, err := head.tier.Store(head.tier.BlockPath(tierDir, 0, hashOf(i)), head.region.Row(i)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range count {
		for _, n := range nodes[1:] { // stale: another block's KV, and a byte past the slot
			engineio.FillPattern(n.region.Row(count + i)[:slot], uint64(100+i))
			n.region.Row(count + i)[slot+engineio.PageSize+7] = 0xee
		}
		if err := head.tier.Load(head.tier.BlockPath(tierDir, 0, hashOf(i)), head.region.Row(count+i)); err != nil {
			t.Fatalf("promotion of chunk %d: %v", i, err)
		}
		if !g.sameEverywhere(count + i) {
			t.Errorf("chunk %d: a rank's row differs from the head's after the load returned", i)
		}
	}
	st := head.daemon.Stats()
	var sent uint64
	for _, p := range st.Peers {
		sent += p.Bytes
	}
	if st.Counters.RowsMirrored != count || sent != uint64(3*count*slot) {
		t.Errorf("head mirrored %d rows, sent %d B; want %d rows, %d B (one slot to each peer)", st.Counters.RowsMirrored, sent, count, 3*count*slot)
	}
}

// newRegionSized creates a region of n rows of size bytes, removed at the end.
func newRegionSized(t *testing.T, name string, n, size int) *engineio.Region {
	t.Helper()
	r, err := engineio.CreateRegion(filepath.Join("/dev/shm", "kvtier-test-"+filepath.Base(t.Name())+"-"+name+"-"+strconv.Itoa(os.Getpid())+".mmap"), n, size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}
