package multinode_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kvtierfs/kvtierfs/fusefs/mountinfo"
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
