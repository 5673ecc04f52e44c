package shared_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/integration/engineio"
	"github.com/kvtierfs/kvtierfs/integration/gluster"
)

// Cross-replica benchmark defaults: the long-prefix prompt (348,000 tokens,
// 2048 tokens per block) as a chain of 8 MiB blocks, loaded by 8 engine
// threads; 12,434 lookups of which 512 are present.
const (
	benchRowBytes      = 8 << 20
	benchTokensPerRow  = 2048
	benchPromptTokens  = 348_000
	benchThreads       = 8
	benchLookupKeys    = 12_434
	benchLookupPresent = 512
	// benchPrefillRate is the assumed re-prefill rate of one replica, in
	// tokens per second, for the estimate the table compares against.
	benchPrefillRate = 20_000
	benchLookupTier  = "LookupModel_0123456789ab_r0"
)

// envInt reads a positive integer from the environment, or def.
func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// TestCrossReplicaBench measures cross-replica reuse over the GlusterFS
// volume and prints a table; it runs only with KVTIERFS_SHARED_BENCH=1:
//
//	KVTIERFS_SHARED_BENCH=1 go test -count=1 -v -run TestCrossReplicaBench ./integration/shared/
//
// Replica A on node 1 stores the long prefix; replica B on node 2 looks it
// up and loads it (through kvtierfs and the shared store), against the same
// chain read vLLM-style straight from B's volume mount and a re-prefill
// estimate; then B loads it again (from its own store) against a bare local
// directory; last, 12,434 lookups (512 present) through kvtierfs and
// straight on the volume, twice each.
func TestCrossReplicaBench(t *testing.T) {
	if os.Getenv("KVTIERFS_SHARED_BENCH") != "1" {
		t.Skip("set KVTIERFS_SHARED_BENCH=1 to run the cross-replica benchmark")
	}
	blocks := envInt("KVTIERFS_SHARED_BENCH_BLOCKS", (benchPromptTokens+benchTokensPerRow-1)/benchTokensPerRow)
	prefillRate := envInt("KVTIERFS_SHARED_BENCH_PREFILL_TPS", benchPrefillRate)
	c := gluster.Start(t, gluster.Options{})
	const sub, vllmSub = "kv", "vllm"
	// Write-behind unthrottled, absent answers trusted for a minute, and a
	// bound on one shared call (an 8 MiB block's copy included) that a busy
	// machine's parallel fetches stay under.
	flags := []string{"--shared-rate", "8GiB", "--shared-queue", "8GiB", "--shared-negative-ttl", "60s", "--shared-timeout", "10s"}
	a, b := startReplica(t, c.Nodes[0], sub, flags...), startReplica(t, c.Nodes[1], sub, flags...)
	region := benchRegion(t, "bench")

	// A prefills and stores the prompt; the same bytes go vLLM-style straight
	// to the volume for the baseline, and to a bare local directory.
	vllmA, err := engineio.OpenTier(filepath.Join(a.node.Mount, vllmSub))
	if err != nil {
		t.Fatal(err)
	}
	bare, err := engineio.OpenTier(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	row := region.Row(0)
	storeAll := func(tiers ...*engineio.Tier) {
		for i := range blocks {
			engineio.FillPattern(row, uint64(i)+1)
			for _, tier := range tiers {
				if _, err := tier.Store(tier.BlockPath(tierDir, 0, hashOf(i)), row); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	storeAll(vllmA, bare)
	storeTime := timed(func() {
		storeAll(a.tier)
		a.waitWrittenBehind(t, int64(blocks), 10*time.Minute)
	})

	// Lookup keys: 512 present (small blocks, stored on A, written behind,
	// and straight on the volume), the rest absent.
	// Page-aligned, as the engine's rows are: O_DIRECT writes of an unaligned
	// buffer fail with EINVAL on the bare directory and through the mount alike.
	small, err := unix.Mmap(-1, 0, 64<<10, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(small)
	for i := range benchLookupPresent {
		engineio.FillPattern(small, uint64(i))
		for _, tier := range []*engineio.Tier{a.tier, vllmA} {
			if _, err := tier.Store(tier.BlockPath(benchLookupTier, 0, hashOf(1_000_000+i)), small); err != nil {
				t.Fatal(err)
			}
		}
	}
	a.waitWrittenBehind(t, int64(blocks+benchLookupPresent), 10*time.Minute)

	// CPU of B's daemon and of B's volume client during each load phase.
	cpu := func(load func() time.Duration) (took time.Duration, daemonCPU, clientCPU time.Duration) {
		d0, c0 := cpuTime(b.daemon.Pid()), cpuTime(b.node.ClientPid())
		took = load()
		return took, cpuTime(b.daemon.Pid()) - d0, cpuTime(b.node.ClientPid()) - c0
	}
	found := 0
	coverageTime := timed(func() {
		for i := range blocks {
			if b.tier.Exists(b.path(i)) {
				found++
			}
		}
	})
	first, firstDaemon, firstClient := cpu(func() time.Duration { return loadChain(t, b.tier, region, blocks) })
	vllmB := &engineio.Tier{Root: filepath.Join(b.node.Mount, vllmSub), Direct: vllmA.Direct}
	straight, _, straightClient := cpu(func() time.Duration { return loadChain(t, vllmB, region, blocks) })
	second, secondDaemon, secondClient := cpu(func() time.Duration { return loadChain(t, b.tier, region, blocks) })
	bareLoad := loadChain(t, bare, region, blocks)
	if st := b.stats(t); st.FetchedBlocks != int64(blocks) {
		t.Fatalf("B fetched %d blocks from the shared store, want %d", st.FetchedBlocks, blocks)
	}

	viaMount := lookupPasses(t, b.tier, 2)
	viaVolume := lookupPasses(t, vllmB, 2)

	chainBytes := float64(blocks) * benchRowBytes
	gbps := func(d time.Duration) string { return fmt.Sprintf("%.2f GB/s", chainBytes/d.Seconds()/1e9) }
	perGB := func(daemon, client time.Duration) string {
		return fmt.Sprintf("CPU s/GB: kvtierfs %.2f, volume client %.2f", daemon.Seconds()/(chainBytes/1e9), client.Seconds()/(chainBytes/1e9))
	}
	prefill := time.Duration(float64(blocks*benchTokensPerRow) / float64(prefillRate) * float64(time.Second))
	w := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintf(w, "\ncross-replica reuse over GlusterFS: %d blocks of 8 MiB (%d tokens), %d load threads, volume up in %s\n",
		blocks, blocks*benchTokensPerRow, benchThreads, c.SetupTime.Round(time.Millisecond))
	fmt.Fprintf(w, "A: stores through kvtierfs until written behind\t%s\t%s\n", storeTime.Round(time.Millisecond), gbps(storeTime))
	fmt.Fprintf(w, "B: coverage (found / stored)\t%d / %d (%.1f %%)\t%s for the lookups\n", found, blocks, 100*float64(found)/float64(blocks), coverageTime.Round(time.Millisecond))
	fmt.Fprintf(w, "B: first load, kvtierfs + shared store\t%s\t%s\t%s\n", first.Round(time.Millisecond), gbps(first), perGB(firstDaemon, firstClient))
	fmt.Fprintf(w, "B: vLLM-style load straight on the volume (O_DIRECT %v)\t%s\t%s\t%s\n", vllmB.Direct, straight.Round(time.Millisecond), gbps(straight), perGB(0, straightClient))
	fmt.Fprintf(w, "B: re-prefill estimate at %d tokens/s\t%s\t\n", prefillRate, prefill.Round(time.Millisecond))
	fmt.Fprintf(w, "B: second load, kvtierfs (own store)\t%s\t%s\t%s\n", second.Round(time.Millisecond), gbps(second), perGB(secondDaemon, secondClient))
	fmt.Fprintf(w, "B: same loads from a bare local directory\t%s\t%s\n", bareLoad.Round(time.Millisecond), gbps(bareLoad))
	fmt.Fprintf(w, "ratios: first load vs straight %.2fx, vs re-prefill %.1fx faster; second load / bare %.2f\n",
		straight.Seconds()/first.Seconds(), prefill.Seconds()/first.Seconds(), bareLoad.Seconds()/second.Seconds())
	fmt.Fprintf(w, "lookups of %d keys (%d present)\tthrough kvtierfs\tstraight on the volume\tratio\n", benchLookupKeys, benchLookupPresent)
	for p := range viaMount {
		fmt.Fprintf(w, "pass %d\t%s (%.1f µs/key)\t%s (%.1f µs/key)\t%.1fx\n", p+1,
			viaMount[p].Round(time.Millisecond), perKey(viaMount[p]), viaVolume[p].Round(time.Millisecond), perKey(viaVolume[p]),
			viaVolume[p].Seconds()/viaMount[p].Seconds())
	}
	w.Flush()
}

// cpuTime is the CPU time (user + system) a process has used so far; 0 if
// it cannot be read.
func cpuTime(pid int) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command name (which may hold spaces) start after ") ".
	fields := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+1:]))
	if len(fields) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / clockTicks
}

// clockTicks is the kernel's USER_HZ, the unit of /proc/PID/stat CPU times.
const clockTicks = 100

func perKey(d time.Duration) float64 { return float64(d.Microseconds()) / benchLookupKeys }

// benchRegion is a region of one 8 MiB row per load thread.
func benchRegion(t *testing.T, name string) *engineio.Region {
	t.Helper()
	r, err := engineio.CreateRegion(fmt.Sprintf("/dev/shm/kvtier-test-%s-%d.mmap", name, os.Getpid()), benchThreads, benchRowBytes)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// loadChain loads blocks [0, n) of the chain as the engine does — threads
// each with a row, one readv per block, close errors ignored — checks every
// block's bytes and returns the wall time of the loads.
func loadChain(t *testing.T, tier *engineio.Tier, region *engineio.Region, n int) time.Duration {
	t.Helper()
	var next atomic.Int64
	var wrong atomic.Int64
	var firstErr error
	var mu sync.Mutex
	var wg sync.WaitGroup
	began := time.Now()
	for th := range benchThreads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			engineio.OwnSignalFreeThread()
			row := region.Row(th)
			want := make([]byte, benchRowBytes)
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := tier.LoadIgnoringClose(tier.BlockPath(tierDir, 0, hashOf(i)), row); err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
					return
				}
				engineio.FillPattern(want, uint64(i)+1)
				if string(row) != string(want) {
					wrong.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	took := time.Since(began)
	if firstErr != nil || wrong.Load() != 0 {
		t.Fatalf("loading the chain from %s: %d blocks wrong, %v", tier.Root, wrong.Load(), firstErr)
	}
	return took
}

// lookupPasses runs the engine's lookups of the benchmark's keys (the 512
// present ones first, then the absent ones) passes times on one thread and
// returns each pass's time; every pass must find exactly the present keys.
func lookupPasses(t *testing.T, tier *engineio.Tier, passes int) []time.Duration {
	t.Helper()
	paths := make([]string, benchLookupKeys)
	for i := range paths {
		paths[i] = tier.BlockPath(benchLookupTier, 0, hashOf(1_000_000+i))
	}
	var times []time.Duration
	for range passes {
		found := 0
		var took time.Duration
		engineio.OnSignalFreeThread(func() {
			began := time.Now()
			for _, p := range paths {
				if tier.Exists(p) {
					found++
				}
			}
			took = time.Since(began)
		})
		if found != benchLookupPresent {
			t.Fatalf("lookups on %s found %d keys, want %d", tier.Root, found, benchLookupPresent)
		}
		times = append(times, took)
	}
	return times
}
