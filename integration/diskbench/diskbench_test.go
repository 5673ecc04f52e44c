package diskbench_test

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kvtierfs/kvtierfs/fusefs/mountinfo"
	"github.com/kvtierfs/kvtierfs/integration/daemon"
	"github.com/kvtierfs/kvtierfs/integration/diskbench"
	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

func TestMain(m *testing.M) { mounttest.Main(m) }

// TestRunSmall runs the benchmark at CI size, in rounds of uneven sizes,
// with every row passed through and with every row through the daemon:
// every phase reports both sides, every block loaded back through the
// mount equals what was stored, and only the passthrough stores' renames
// read probe pages.
func TestRunSmall(t *testing.T) {
	for _, path := range []struct {
		minRow string
		probes bool
	}{{"0", true}, {"1TiB", false}} {
		cfg := diskbench.Config{Binary: mounttest.Binary(), Dir: t.TempDir(), RowBytes: 64 << 10, Blocks: 48,
			Threads: 4, LookupKeys: 96, Rounds: 5, PassthroughMinRow: path.minRow, Progress: os.Stderr}
		res, err := diskbench.Run(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if res.VerifiedLoads != cfg.Blocks {
			t.Fatalf("%d loads verified, want %d", res.VerifiedLoads, cfg.Blocks)
		}
		if res.FloorVerified != cfg.Blocks {
			t.Fatalf("%d of the store floor's blocks verified, want %d", res.FloorVerified, cfg.Blocks)
		}
		// Five store and load phases, the store's open and rename at p50 and
		// p99, the same four and the stores through the store floor, then
		// each lookup class first and repeated, and the FUSE round trip
		// alone, fresh and after a burst, beside the bare directory's absent keys; besides them, the
		// daemon's own phases of the stores, which the bare directory has not.
		compared, daemon, floor := 0, map[string]bool{}, map[string]bool{}
		for _, m := range res.Measurements {
			if name, ok := strings.CutPrefix(m.Phase, "daemon "); ok {
				if !(m.Mount > 0) || m.Direct != 0 {
					t.Fatalf("daemon phase %q: %+v, want a duration of the mount's alone", m.Phase, m)
				}
				daemon[name] = true
				continue
			}
			compared++
			if !(m.Mount > 0 && m.Direct > 0 && m.Ratio > 0) {
				t.Fatalf("phase %q has an empty side: %+v", m.Phase, m)
			}
			if name, ok := strings.CutSuffix(m.Phase, ": FUSE round trips alone"); ok {
				floor[name] = true
				if m.DaemonCPUPerGB != 0 {
					t.Fatalf("phase %q counts the daemon's CPU: %+v", m.Phase, m)
				}
			}
		}
		if compared != 22 {
			t.Fatalf("%d measurements of both sides, want 22: %+v", compared, res.Measurements)
		}
		for _, name := range []string{"store", "store open p50", "store rename p50", "store open p99", "store rename p99"} {
			if !floor[name] {
				t.Errorf("no store floor phase %q among %v", name, floor)
			}
		}
		for _, name := range []string{"create p50", "create p99", "rename p50", "rename_record p99"} {
			if !daemon[name] {
				t.Errorf("no daemon phase %q among %v", name, daemon)
			}
		}
		if daemon["rename_probe_read p50"] != path.probes {
			t.Errorf("--passthrough-min-row %s: probe reads timed %v, want %v", path.minRow, daemon["rename_probe_read p50"], path.probes)
		}
		left, _ := os.ReadDir(cfg.Dir)
		if len(left) != 0 {
			t.Fatalf("the benchmark left %d entries in its work directory", len(left))
		}
	}
}

// TestConfigErrorsNameTheFlag checks the messages of bad sizes.
func TestConfigErrorsNameTheFlag(t *testing.T) {
	base := diskbench.Config{Binary: "kvtierfs", Dir: "/tmp", RowBytes: 4096, Blocks: 1, Threads: 1, LookupKeys: 1, Rounds: 1}
	for flag, mutate := range map[string]func(*diskbench.Config){
		"--row-bytes": func(c *diskbench.Config) { c.RowBytes = 1000 },
		"--blocks":    func(c *diskbench.Config) { c.Blocks = 0 },
		"--threads":   func(c *diskbench.Config) { c.Threads = 0 },
		"--lookups":   func(c *diskbench.Config) { c.LookupKeys = 0 },
		"--rounds":    func(c *diskbench.Config) { c.Rounds = 2 },
	} {
		c := base
		mutate(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), flag) {
			t.Errorf("%s: error %v does not name the flag", flag, err)
		}
	}
}

// TestRunChainSmall runs the staging benchmark at CI size, with half-zero
// rows, in two rounds: every phase measures in each, staging serves loads
// from memory, the batched match finds the whole chain, and loads verify.
func TestRunChainSmall(t *testing.T) {
	cfg := diskbench.ChainConfig{Binary: mounttest.Binary(), Dir: t.TempDir(), RowBytes: 64 << 10, Blocks: 40,
		Threads: 4, HalfZero: true, StagingBytes: 1 << 20, MatchKeys: 200, Rounds: 2, Progress: os.Stderr}
	res, err := diskbench.RunChain(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !(res.StagingOff > 0 && res.StagingOn > 0 && res.Direct > 0 && res.StagedLoadMillis > 0 && res.MatchMillis > 0) {
		t.Fatalf("a phase did not measure: %+v", res)
	}
	if res.StagingHits == 0 {
		t.Fatalf("no load was served from staging: %+v", res)
	}
	if res.VerifiedLoads != 2*cfg.Rounds*cfg.Blocks || len(res.StagingOnRatios) != cfg.Rounds {
		t.Fatalf("%d loads verified and %d round ratios, want %d and %d", res.VerifiedLoads, len(res.StagingOnRatios),
			2*cfg.Rounds*cfg.Blocks, cfg.Rounds)
	}
	left, _ := os.ReadDir(cfg.Dir)
	if len(left) != 0 {
		t.Fatalf("the benchmark left %d entries in its work directory", len(left))
	}
}

// A bench whose output is closed (`kvtierfs bench disk … | head -c 1`) still
// unmounts and removes everything it created before it exits.
func TestBenchCleansUpWhenItsOutputCloses(t *testing.T) {
	dir := t.TempDir()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(mounttest.Binary(), "bench", "disk", "--dir", dir, "--blocks", "16",
		"--row-bytes", "64KiB", "--threads", "2", "--lookups", "32", "--drop-caches=false")
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeLeftovers(t, dir, cmd.Process.Pid) })
	w.Close()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	if _, err := r.Read(make([]byte, 1)); err != nil {
		t.Fatalf("no output from the bench: %v", err)
	}
	r.Close()
	select {
	case <-exited:
	case <-time.After(2 * time.Minute):
		cmd.Process.Kill()
		t.Fatal("the bench did not end within 2 minutes of its output closing")
	}
	mounts, err := mountinfo.Read("self")
	if err != nil {
		t.Fatal(err)
	}
	if left := mountinfo.Under(mounts, dir); len(left) != 0 {
		t.Fatalf("the bench left mounts after its output closed: %v", left)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Fatalf("the bench left %d entries in its work directory after its output closed", len(left))
	}
}

// removeLeftovers lazily unmounts what a failed bench (process pid) left
// mounted under dir, its daemons ending with their connections, and removes
// its shm region.
func removeLeftovers(t *testing.T, dir string, pid int) {
	mounts, err := mountinfo.Read("self")
	if err != nil {
		t.Error(err)
	}
	for _, m := range mountinfo.Under(mounts, dir) {
		daemon.Detach(m)
	}
	os.Remove(fmt.Sprintf("/dev/shm/vllm_offload_kvtierbench_%d.mmap", pid))
}
