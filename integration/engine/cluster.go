package engine

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
	"github.com/kvtierfs/kvtierfs/fusefs/mountinfo"
	"github.com/kvtierfs/kvtierfs/integration/daemon"
	"github.com/kvtierfs/kvtierfs/integration/engineio"
	"github.com/kvtierfs/kvtierfs/integration/netns"
	"github.com/kvtierfs/kvtierfs/sync/rowsync"
)

// ErrSyncUnavailable is returned by Run for --sync on when the kvtierfs binary's
// `mount` has no --peer flag (row mirroring is not built in).
var ErrSyncUnavailable = errors.New("row mirroring is not available: this kvtierfs binary's `mount` has no --peer flag")

// RegionPath is the shm region file of a node: /dev/shm/vllm_offload_<id>_<node>.mmap.
func RegionPath(id string, node int) string {
	return fmt.Sprintf("/dev/shm/vllm_offload_%s_%d.mmap", id, node)
}

// node is one machine of the cluster: a kvtierfs daemon with its store and
// mount, and the node's shm region.
type node struct {
	index      int
	mountpoint string
	store      string
	region     *engineio.Region
	daemon     *daemon.Daemon
	log        daemon.LogBuffer
	metrics    string // host:port of its metrics and pprof endpoint, with Config.Profile
}

// cluster is the nodes of a run and the temporary directory holding their
// stores and mountpoints.
type cluster struct {
	dir   string
	nodes []*node
	netns *netns.Group // with Config.Netns
}

// startCluster creates every node's region and starts its daemon. On error it
// cleans up whatever it started.
func startCluster(ctx context.Context, cfg Config) (_ *cluster, err error) {
	if cfg.Sync {
		if err := CheckSync(cfg.Binary); err != nil {
			return nil, err
		}
	}
	dir, err := os.MkdirTemp(cfg.Dir, "kvtierbench-")
	if err != nil {
		return nil, err
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return nil, err
	}
	c := &cluster{dir: dir}
	defer func() {
		if err != nil {
			c.close()
		}
	}()
	for i := 0; i < cfg.Nodes; i++ {
		path := RegionPath(cfg.RegionID, i)
		if _, err := os.Lstat(path); err == nil {
			return nil, fmt.Errorf("region %s already exists: another run is using this id", path)
		}
		region, err := engineio.CreateRegion(path, cfg.Rows, cfg.RowBytes)
		if err != nil {
			return nil, fmt.Errorf("node %d region: %w", i, err)
		}
		c.nodes = append(c.nodes, &node{
			index:      i,
			region:     region,
			store:      filepath.Join(dir, fmt.Sprintf("store%d", i)),
			mountpoint: filepath.Join(dir, fmt.Sprintf("mnt%d", i)),
		})
	}
	if cfg.Netns {
		if c.netns, err = netns.New("kvtb", cfg.Nodes); err != nil {
			return nil, err
		}
	}
	peerArgs, err := c.syncArgs(cfg)
	if err != nil {
		return nil, err
	}
	for _, n := range c.nodes {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if err := os.Mkdir(n.store, 0o755); err != nil {
			return nil, err
		}
		args := peerArgs[n.index]
		if cfg.Capacity != "" {
			args = append(args, "--capacity", cfg.Capacity)
		}
		if !cfg.Staging {
			args = append(args, "--staging-bytes", "0")
		}
		args = append(args, "--lookup-budget", budgetMode(cfg.LookupBudget))
		if cfg.Profile != "" {
			port, err := freeLoopbackPort()
			if err != nil {
				return nil, err
			}
			n.metrics = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
			args = append(args, "--debug", "--metrics-addr", n.metrics) // --debug serves pprof
		}
		var wrapper []string
		if c.netns != nil {
			wrapper = c.netns.Wrapper(n.index)
		}
		n.daemon, err = daemon.Start(daemon.Options{Binary: cfg.Binary, Mountpoint: n.mountpoint, Store: n.store,
			ShmGlob: n.region.Path, Args: args, Wrapper: wrapper, Log: &n.log})
		if err != nil {
			return nil, fmt.Errorf("node %d: %w\n%s", n.index, err, n.log.String())
		}
	}
	if cfg.Sync {
		if err := c.waitPeersUp(ctx); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// peersUpTimeout bounds the wait for the head's peers at start.
const peersUpTimeout = 30 * time.Second

// waitPeersUp waits until the head's stat shows every other node up, so
// that the run's first stores are sampled and its loads mirrored.
func (c *cluster) waitPeersUp(ctx context.Context) error {
	head := c.nodes[0]
	deadline := time.Now().Add(peersUpTimeout)
	for {
		raw, err := head.stats()
		if err != nil {
			return err
		}
		var st ctlabi.Stats
		if err := json.Unmarshal(raw, &st); err != nil {
			return fmt.Errorf("node 0 stats: %w", err)
		}
		up := 0
		for _, p := range st.Peers {
			if p.State == rowsync.StateUp {
				up++
			}
		}
		if up == len(c.nodes)-1 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the head's peers are not all up after %s: %+v\n%s", peersUpTimeout, st.Peers, head.log.String())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// CheckSync returns an error wrapping ErrSyncUnavailable unless `binary mount
// --help` lists --peer, i.e. unless the binary can mirror rows.
func CheckSync(binary string) error {
	out, _ := exec.Command(binary, "mount", "--help").CombinedOutput()
	if !bytes.Contains(out, []byte("--peer")) {
		return fmt.Errorf("--sync on: %w (%s); run with --sync off", ErrSyncUnavailable, binary)
	}
	return nil
}

// syncArgs returns each node's mirroring flags: with Sync, every node listens
// on a loopback port (with Netns, on its namespace's address), knows its row size and gets the same peer list, every
// node's address (each skips its own), sharing a new secret file; without,
// none.
func (c *cluster) syncArgs(cfg Config) ([][]string, error) {
	args := make([][]string, len(c.nodes))
	if !cfg.Sync {
		return args, nil
	}
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return nil, err
	}
	secretFile := filepath.Join(c.dir, "secret")
	if err := os.WriteFile(secretFile, []byte(hex.EncodeToString(secret)+"\n"), 0o600); err != nil {
		return nil, err
	}
	addrs := make([]string, len(c.nodes))
	for i := range addrs {
		if c.netns != nil {
			addrs[i] = net.JoinHostPort(c.netns.IP(i), "7470")
			continue
		}
		port, err := freeLoopbackPort()
		if err != nil {
			return nil, err
		}
		addrs[i] = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	}
	for i := range c.nodes {
		args[i] = []string{"--listen", addrs[i], "--secret-file", secretFile, "--replicated-kv", cfg.ReplicatedKV,
			"--row-bytes", strconv.Itoa(cfg.RowBytes)}
		for _, addr := range addrs { // one list for the whole group, as a DaemonSet gives it
			args[i] = append(args[i], "--peer", addr)
		}
	}
	return args, nil
}

// freeLoopbackPort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freeLoopbackPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// stats returns the raw `kvtierfs stat --json` snapshot of the node's mount.
func (n *node) stats() (json.RawMessage, error) {
	raw, err := os.ReadFile(filepath.Join(n.mountpoint, ctlabi.Dir, ctlabi.StatsFile))
	if err != nil {
		return nil, fmt.Errorf("node %d stats: %w", n.index, err)
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, raw); err != nil {
		return nil, fmt.Errorf("node %d stats: %w", n.index, err)
	}
	return compact.Bytes(), nil
}

// close stops every daemon, removes the regions and the temporary directory.
// It returns the first error and the logs of daemons that failed.
func (c *cluster) close() error {
	var errs []error
	for _, n := range c.nodes {
		if n.daemon != nil {
			if err := n.daemon.Stop(); err != nil {
				errs = append(errs, fmt.Errorf("node %d: kvtierfs mount: %v\n%s", n.index, err, n.log.String()))
			}
		}
		if err := n.region.Close(); err != nil {
			errs = append(errs, fmt.Errorf("node %d region: %w", n.index, err))
		}
	}
	if c.netns != nil {
		if err := c.netns.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if mounted, err := mountedUnder(c.dir); err != nil || len(mounted) > 0 {
		errs = append(errs, fmt.Errorf("not removing %s: still mounted below it: %v %v", c.dir, mounted, err))
	} else if err := os.RemoveAll(c.dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// mountedUnder lists the mount points at or below dir.
func mountedUnder(dir string) ([]string, error) {
	mounts, err := mountinfo.Read("self")
	if err != nil {
		return nil, err
	}
	return mountinfo.Under(mounts, dir), nil
}
