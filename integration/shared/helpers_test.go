// Package shared_test runs kvtierfs's shared second level (--shared) on a
// real distributed filesystem: a GlusterFS volume (integration/gluster)
// mounted by two "nodes", network namespaces with their own FUSE clients,
// each with its own kvtierfs daemon whose --shared is a directory on its
// node's mount. Replicas on different nodes reuse each other's blocks; the
// volume's brick is stopped and the nodes' links cut under them.
package shared_test

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
	"github.com/kvtierfs/kvtierfs/integration/engineio"
	"github.com/kvtierfs/kvtierfs/integration/gluster"
	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

func TestMain(m *testing.M) { mounttest.Main(m) }

// rowBytes is the CI-size row: 256 pages.
const rowBytes = 1 << 20

// tierDir is the engine's per-model directory used by these tests.
const tierDir = "SharedModel_0123456789ab_r0"

// hashOf is the chunk hash of block i.
func hashOf(i int) string {
	sum := sha256.Sum256([]byte(fmt.Sprintf("shared-chunk-%d", i)))
	return hex.EncodeToString(sum[:])
}

// expectedRow is the content of block i.
func expectedRow(i int) []byte {
	row := make([]byte, rowBytes)
	engineio.FillPattern(row, uint64(i)+1)
	return row
}

// replica is one engine replica on one node: its kvtierfs daemon (running
// in the node's network namespace, its --shared on the node's own client
// mount), the engine's view of the mount and a region for its rows.
type replica struct {
	node *gluster.Node
	// sub is the --shared directory relative to the volume's root.
	sub    string
	daemon *mounttest.Daemon
	tier   *engineio.Tier
	region *engineio.Region
}

// startReplica mounts a daemon for node with --shared on the node's mount
// (the volume's directory sub), a short bound on shared calls and extra
// flags.
func startReplica(t *testing.T, node *gluster.Node, sub string, extra ...string) *replica {
	t.Helper()
	dir := filepath.Join(node.Mount, sub)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"--shared", dir, "--shared-key-file", sharedKeyFile(t), "--shared-timeout", "2s", "--shared-negative-ttl", "1s"}, extra...)
	region, err := engineio.CreateRegion(fmt.Sprintf("/dev/shm/kvtier-test-%s-%s-%d.mmap", filepath.Base(t.Name()), node.Name, os.Getpid()), 4, rowBytes)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { region.Close() })
	d := mounttest.Start(t, mounttest.Options{Args: args, Wrapper: node.Wrapper(), ShmGlob: region.Path})
	tier, err := engineio.OpenTier(d.Mountpoint)
	if err != nil {
		t.Fatal(err)
	}
	if !tier.Direct {
		t.Fatal("O_DIRECT probe failed on the mount")
	}
	return &replica{node: node, sub: sub, daemon: d, tier: tier, region: region}
}

// keyFiles are the --shared-key-file of each test, made when it starts its
// first replica: the replicas one test starts share the key.
var keyFiles sync.Map

func sharedKeyFile(t *testing.T) string {
	t.Helper()
	if path, ok := keyFiles.Load(t.Name()); ok {
		return path.(string)
	}
	path, _ := keyFiles.LoadOrStore(t.Name(), mounttest.SharedKeyFile(t))
	return path.(string)
}

// path is block i's path on the replica's mount.
func (r *replica) path(i int) string { return r.tier.BlockPath(tierDir, 0, hashOf(i)) }

// rel is block i's path relative to a tier root (and to the shared directory).
func (r *replica) rel(i int) string {
	rel, err := filepath.Rel(r.tier.Root, r.path(i))
	if err != nil {
		panic(err)
	}
	return rel
}

// store stores block i as the engine does, from row 0 of the region.
func (r *replica) store(t *testing.T, i int) {
	t.Helper()
	row := r.region.Row(0)
	copy(row, expectedRow(i))
	if stored, err := r.tier.Store(r.path(i), row); err != nil || !stored {
		t.Fatalf("%s storing block %d: stored %v, %v", r.node.Name, i, stored, err)
	}
}

// load loads block i into row 1 with the loader that ignores close errors,
// and reports whether the bytes are block i's.
func (r *replica) load(i int) (exact bool, err error) {
	row := r.region.Row(1)
	clear(row)
	if err := r.tier.LoadIgnoringClose(r.path(i), row); err != nil {
		return false, err
	}
	return string(row) == string(expectedRow(i)), nil
}

// stats is the replica's "shared" stats object.
func (r *replica) stats(t *testing.T) ctlabi.Shared {
	t.Helper()
	sh := r.daemon.Stats().Shared
	if sh == nil {
		t.Fatalf("%s: stats.json has no \"shared\" object with --shared", r.node.Name)
	}
	return *sh
}

// waitStats polls the replica's shared stats until ok accepts them.
func (r *replica) waitStats(t *testing.T, within time.Duration, what string, ok func(ctlabi.Shared) bool) ctlabi.Shared {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		st := r.stats(t)
		if ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s not reached within %s: %+v", r.node.Name, what, within, st)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitWrittenBehind waits until the write-behind queue is empty and at least
// n blocks were written (the contract's wait).
func (r *replica) waitWrittenBehind(t *testing.T, n int64, within time.Duration) ctlabi.Shared {
	t.Helper()
	return r.waitStats(t, within, fmt.Sprintf("write-behind of %d blocks", n), func(st ctlabi.Shared) bool {
		return st.QueueBlocks == 0 && st.WrittenBlocks >= n
	})
}

// blockFiles lists the block files (.bin) under a tier root on the brick,
// with their sizes.
func blockFiles(t *testing.T, root string) map[string]int64 {
	t.Helper()
	files := map[string]int64{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == ".glusterfs" {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".bin") {
			info, err := d.Info()
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, p)
			files[rel] = info.Size()
		}
		return nil
	})
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return files
}

// shared is block i's path in the shared directory through the node's mount.
func (r *replica) shared(i int) string { return filepath.Join(r.node.Mount, r.sub, r.rel(i)) }

// onBrick is block i's path in the shared directory on the brick.
func (r *replica) onBrick(c *gluster.Cluster, i int) string {
	return filepath.Join(c.Brick(), r.sub, r.rel(i))
}

// timed runs fn and returns how long it took.
func timed(fn func()) time.Duration {
	began := time.Now()
	fn()
	return time.Since(began)
}
