package main

import (
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/spf13/pflag"

	"github.com/kvtierfs/kvtierfs/fusefs"
	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
	"github.com/kvtierfs/kvtierfs/sync/rowsync"
	"github.com/kvtierfs/kvtierfs/tiers/disk"
	"github.com/kvtierfs/kvtierfs/tiers/shared"
)

// sharedFlags are the --shared-* flags of `kvtierfs mount` (DESIGN.md "The shared level").
type sharedFlags struct {
	dir, keyFile                string
	capacity, rate, queue       string
	admit                       string
	negativeTTL, timeout, lease time.Duration
}

func addSharedFlags(fl *pflag.FlagSet) *sharedFlags {
	s := &sharedFlags{}
	fl.StringVar(&s.dir, "shared", "", "directory on a distributed filesystem (mounted by its own client) shared by the nodes: a second level behind the store; empty disables it")
	fl.StringVar(&s.keyFile, "shared-key-file", "", "file holding the key every replica sharing --shared holds (at least 16 bytes, mode 0600 or 0400): blocks, names and the eviction lease in the shared directory are authenticated with it; required with --shared")
	fl.StringVar(&s.capacity, "shared-capacity", "0", "bytes of blocks the shared store may hold, e.g. 10TiB; only the node holding the eviction lease evicts (0: no eviction)")
	fl.StringVar(&s.admit, "shared-admit", "all", "which published blocks are written behind to the shared store: all, or looked-up (once a lookup found them)")
	fl.StringVar(&s.rate, "shared-rate", "256MiB", "write-behind byte budget per second")
	fl.StringVar(&s.queue, "shared-queue", "1GiB", "bound on the bytes waiting to be written behind; beyond it the oldest are dropped and counted")
	fl.DurationVar(&s.negativeTTL, "shared-negative-ttl", shared.DefaultNegativeTTL, "how long an absent answer from the shared store is trusted, the kernel's negative entries included: a block another node stores is visible within this bound once written behind")
	fl.DurationVar(&s.timeout, "shared-timeout", shared.DefaultTimeout, "bound on any one shared-store operation (a block's fetch: on each 4 MiB chunk read, so a large block on a slow but answering store still arrives); past it the level is unreachable and lookups answer absent at once until a probe succeeds")
	fl.DurationVar(&s.lease, "shared-lease-ttl", shared.DefaultLeaseTTL, "eviction lease lifetime, renewed at a third of it; the holder walks the shared layout this often and spares blocks used within it (10s at most)")
	return s
}

// config checks the flags and turns them into the level's configuration and
// the kernel's negative entry lifetime: an absent answer is trusted for
// --shared-negative-ttl in all, half of it in the kernel's cache and the rest
// in the level's.
func (s *sharedFlags) config() (cfg shared.Config, kernelNegative time.Duration, err error) {
	cfg = shared.Config{Dir: s.dir, Timeout: s.timeout, LeaseTTL: s.lease}
	if s.dir == "" {
		return cfg, 0, nil
	}
	if s.keyFile == "" {
		return cfg, 0, fmt.Errorf("--shared needs --shared-key-file: whoever can write %s could otherwise serve KV to every replica", s.dir)
	}
	if cfg.Key, err = rowsync.ReadSecretFile(s.keyFile); err != nil {
		return cfg, 0, fmt.Errorf("--shared-key-file: %w", err)
	}
	if s.capacity != "0" {
		if cfg.Capacity, err = parseSize("shared-capacity", s.capacity); err != nil {
			return cfg, 0, err
		}
	}
	if cfg.Rate, err = parseSize("shared-rate", s.rate); err != nil {
		return cfg, 0, err
	}
	if cfg.QueueBytes, err = parseSize("shared-queue", s.queue); err != nil {
		return cfg, 0, err
	}
	if cfg.Admit, err = shared.ParseAdmission(s.admit); err != nil {
		return cfg, 0, err
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"shared-negative-ttl", s.negativeTTL}, {"shared-timeout", s.timeout}, {"shared-lease-ttl", s.lease}} {
		if d.v <= 0 {
			return cfg, 0, fmt.Errorf("--%s %s: want a positive duration such as 2s", d.flag, d.v)
		}
	}
	// The evictor spares blocks used within a lease lifetime, 10 s at most.
	cfg.Protect = min(shared.DefaultProtect, s.lease)
	kernelNegative = max(time.Nanosecond, min(fusefs.DefaultNegativeTimeout, s.negativeTTL/2))
	cfg.NegativeTTL = max(time.Nanosecond, s.negativeTTL-kernelNegative)
	return cfg, kernelNegative, nil
}

// startShared starts the shared level over the store (the mount's tier tells
// it the blocks to write behind, tiers/tier); nil without --shared.
func startShared(cfg shared.Config, store *disk.Store, logger *slog.Logger) (*shared.Level, error) {
	if cfg.Dir == "" {
		return nil, nil
	}
	cfg.Local, cfg.Logger = store, logger
	level, err := shared.New(cfg)
	if err != nil {
		return nil, err
	}
	logger.Info("shared level", "dir", cfg.Dir, "capacity", formatBytes(cfg.Capacity), "rate", formatBytes(cfg.Rate),
		"negative_ttl", cfg.NegativeTTL, "timeout", cfg.Timeout)
	return level, nil
}

// printShared renders stat's "shared" section.
func printShared(w io.Writer, sh *ctlabi.Shared) {
	state := "reachable"
	if !sh.Reachable {
		state = "UNREACHABLE"
	}
	capacity := "no capacity bound"
	if sh.CapacityBytes > 0 {
		capacity = fmt.Sprintf("%s used of %s (as last scanned by the lease holder)", formatBytes(sh.UsedBytes), formatBytes(sh.CapacityBytes))
	}
	lease := "no holder"
	switch {
	case sh.LeaseHeld:
		lease = "held by this node"
	case sh.LeaseHolder != "":
		lease = "held by " + sh.LeaseHolder
	}
	fmt.Fprintf(w, "shared\t%s, %s, %d timeouts\n", sh.Dir, state, sh.Timeouts)
	fmt.Fprintf(w, "  write-behind\t%d blocks (%s) queued, %s behind, %d written (%s), %d dropped\n",
		sh.QueueBlocks, formatBytes(sh.QueueBytes), formatBytes(sh.BytesBehind), sh.WrittenBlocks, formatBytes(sh.WrittenBytes), sh.DroppedBlocks)
	fmt.Fprintf(w, "  read-through\t%d lookups (%d hits, %d answered by the negative cache), %d fetched (%s, %.3fs each), %d corrupt dropped\n",
		sh.Lookups, sh.LookupHits, sh.NegativeHits, sh.FetchedBlocks, formatBytes(sh.FetchedBytes), sh.FetchSecondsAvg, sh.CorruptDropped)
	fmt.Fprintf(w, "  eviction\t%s; lease %s; %d evicted\n", capacity, lease, sh.EvictedBlocks)
}

// checkSharedDisjoint refuses a --shared directory that contains or lies
// within the mountpoint or the store: blocks would be written behind into
// the tier they come from.
func checkSharedDisjoint(sharedDir, mountpoint, store string) error {
	if sharedDir == "" {
		return nil
	}
	for _, other := range []struct{ flag, dir string }{{"mountpoint", mountpoint}, {"--store", store}} {
		if err := checkDisjoint(sharedDir, other.dir); err != nil {
			return fmt.Errorf("--shared %s and %s %s must not contain each other", sharedDir, other.flag, other.dir)
		}
	}
	return nil
}
