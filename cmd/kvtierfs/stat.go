package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
	"github.com/kvtierfs/kvtierfs/tiers/shm"
)

func runStat(args []string) error {
	fl := newFlagSet("stat")
	asJSON := fl.Bool("json", false, "print the raw JSON snapshot for tools")
	watch := fl.Bool("watch", false, "redraw a live view (occupancy, rates, peers, warnings) until Ctrl-C; one line per snapshot when stdout is not a terminal")
	interval := fl.Duration("interval", 2*time.Second, "time between snapshots with --watch")
	glob := fl.String("shm-glob", shm.DefaultGlob, "glob of the engine's shared offload regions, for the orphaned ones")
	timeout := addTimeoutFlag(fl)
	mnt, err := parseArgs(fl, args)
	if err != nil {
		return err
	}
	if err := checkTimeout(*timeout); err != nil {
		return err
	}
	if *watch {
		if *asJSON {
			return usageError{fmt.Errorf("--json and --watch: choose one (--watch prints one line per snapshot into a pipe)")}
		}
		if *interval < 100*time.Millisecond {
			return usageError{fmt.Errorf("--interval %s: want at least 100ms", *interval)}
		}
		return watchStats(os.Stdout, mnt, *interval, *timeout, isTerminal(os.Stdout))
	}
	if fl.Changed("interval") {
		return usageError{fmt.Errorf("--interval applies only with --watch")}
	}
	if *asJSON {
		raw, err := readStatsFile(mnt, *timeout)
		if err != nil {
			return err
		}
		_, err = os.Stdout.Write(raw)
		return err
	}
	st, err := readStats(mnt, *timeout)
	if err != nil {
		return err
	}
	engine, err := engineUIDOf(mnt, *timeout)
	if err != nil {
		return err
	}
	printStats(os.Stdout, st)
	scan, err := scanRegionsWithin(*glob, shm.RegionOwners(engine), *timeout)
	if err != nil {
		return err
	}
	printOrphans(os.Stdout, scan)
	return nil
}

// readStatsFile reads the stats file of a mount, within timeout.
func readStatsFile(mnt string, timeout time.Duration) ([]byte, error) {
	raw, err := onMount(mnt, timeout, func() ([]byte, error) {
		return os.ReadFile(filepath.Join(mnt, ctlabi.Dir, ctlabi.StatsFile))
	})
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%s is not a kvtierfs mount (no %s/%s)", mnt, ctlabi.Dir, ctlabi.StatsFile)
	}
	if errors.Is(err, fs.ErrPermission) {
		return nil, fmt.Errorf("%s: permission denied: a kvtierfs mount is private to the engine's uid (--engine-uid) and root; run stat as one of them", mnt)
	}
	return raw, err
}

// engineUIDOf is the engine's uid of the mount at mnt: its control files
// belong to it (mount --engine-uid, which also picks the regions it maps).
func engineUIDOf(mnt string, timeout time.Duration) (uint32, error) {
	return onMount(mnt, timeout, func() (uint32, error) {
		var st unix.Stat_t
		err := unix.Stat(filepath.Join(mnt, ctlabi.Dir, ctlabi.StatsFile), &st)
		return st.Uid, err
	})
}

// readStats reads and decodes the stats snapshot of a mount, within timeout.
func readStats(mnt string, timeout time.Duration) (ctlabi.Stats, error) {
	var st ctlabi.Stats
	raw, err := readStatsFile(mnt, timeout)
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		return st, fmt.Errorf("decoding stats of %s: %w", mnt, err)
	}
	return st, nil
}

// printStats renders a stats snapshot as a table an operator reads in seconds.
func printStats(w io.Writer, st ctlabi.Stats) {
	t := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	d := st.Disk
	used := 0.0
	if d.CapacityBytes > 0 {
		used = 100 * float64(d.PhysicalBytes) / float64(d.CapacityBytes)
	}
	fmt.Fprintf(t, "mount\t%s\n", st.Mountpoint)
	fmt.Fprintf(t, "store\t%s\n", d.Store)
	fmt.Fprintf(t, "disk\t%s, %s logical, %s on disk of %s capacity (%.1f%%), %s free, %s\n",
		plural(d.Blocks, "block"), formatBytes(d.LogicalBytes), formatBytes(d.PhysicalBytes), formatBytes(d.CapacityBytes), used,
		formatBytes(d.FreeBytes), plural(d.Evictions, "eviction"))
	groups := make([]string, 0, len(st.Groups))
	for g := range st.Groups {
		groups = append(groups, g)
	}
	sort.Strings(groups)
	for _, g := range groups {
		fmt.Fprintf(t, "  group %s\t%s, %s\n", ctlabi.Printable(g), plural(st.Groups[g].Blocks, "block"), formatBytes(st.Groups[g].Bytes))
	}
	if len(st.Primary.Regions) == 0 {
		fmt.Fprintf(t, "primary\tno shm region found\n")
	}
	for _, r := range st.Primary.Regions {
		geometry := fmt.Sprintf("%d rows × %s", r.Rows, formatBytes(r.RowBytes))
		if r.RowBytes == 0 {
			geometry = r.Warning
		}
		fmt.Fprintf(t, "primary\t%s: %s, %s\n", ctlabi.Printable(r.Path), formatBytes(r.Size), geometry)
	}
	if fds := st.Descriptors; fds.Limit > 0 {
		fmt.Fprintf(t, "descriptors\t%d open of %d allowed, %d kept for the daemon's own work, %s through the mount refused\n",
			fds.Open, fds.Limit, fds.Kept, plural(st.Counters.OpensRefused, "open"))
	}
	c := st.Counters
	hitRate := 0.0
	if c.Lookups > 0 {
		hitRate = 100 * float64(c.LookupHits) / float64(c.Lookups)
	}
	fmt.Fprintf(t, "lookups\t%d (%d hits, %.1f%%)\n", c.Lookups, c.LookupHits, hitRate)
	if c.TiersPrimed > 0 {
		fmt.Fprintf(t, "  primed\t%s looked up ahead of the engine, %s primed\n", plural(c.NamesPrimed, "name"), plural(c.TiersPrimed, "tier"))
	}
	fmt.Fprintf(t, "reads\t%d, %s\n", c.Reads, formatBytes(c.ReadBytes))
	fmt.Fprintf(t, "writes\t%d, %s\n", c.Writes, formatBytes(c.WriteBytes))
	fmt.Fprintf(t, "checksum failures\t%d\n", c.ChecksumFailures)
	if c.BlocksChangedOutside > 0 {
		fmt.Fprintf(t, "changed outside\t%s failed their checksum after their files were changed in the store tree, outside the daemon\n",
			plural(c.BlocksChangedOutside, "block"))
	}
	fmt.Fprintf(t, "loads verified\t%d read from the store, %d staged, %d from a row that still held the block; %d refused, %d failed mirroring\n",
		c.LoadsFromStore, c.LoadsFromStaging, c.LoadsFromRow, c.LoadsRefused, c.LoadsUnmirrored)
	if c.LoadsInPlace > 0 {
		fmt.Fprintf(t, "  in place\t%d served from the store's mapped pages, %d of them kept mapped by an earlier load or their store, %d proven by their store\n", c.LoadsInPlace, c.LoadsRemapped, c.LoadsProvenAtStore)
	}
	if sg := st.Staging; sg != nil {
		fmt.Fprintf(t, "staging\t%s staged of %s, %s streaming, %s, %d loads served from memory, %d not staged (%d queued, too late), %s wasted\n",
			formatBytes(sg.Bytes), formatBytes(sg.BudgetBytes), plural(int64(sg.Chains), "chain"), plural(sg.Waves, "wave"), sg.Hits, sg.Misses, sg.Late, formatBytes(sg.WastedBytes))
	}
	if c.Matches > 0 {
		fmt.Fprintf(t, "matches\t%d batched match requests\n", c.Matches)
	}
	if c.BudgetChainsCapped > 0 {
		fmt.Fprintf(t, "lookup budget\t%d chains capped at the primary tier's rows, %d present keys withheld\n",
			c.BudgetChainsCapped, c.BudgetKeysWithheld)
	}
	if r := st.Replication; r != nil {
		fmt.Fprintf(t, "replication\t--replicated-kv %s, mirroring %s (%s; %d samples, %d mismatches), %d rows mirrored, %d lookups withheld\n",
			r.Mode, map[bool]string{true: "on", false: "off"}[r.Allowed], r.DecidedBy, r.Samples, r.Mismatches, c.RowsMirrored, c.LookupsWithheld)
	}
	if sh := st.Shared; sh != nil {
		printShared(t, sh)
	}
	for _, p := range st.Peers {
		fmt.Fprintf(t, "  peer %s\t%s, %d rows sent (%d verified), %d received, %s", p.Addr, p.State, p.RowsSent, p.Verified, p.RowsReceived, formatBytes(int64(p.Bytes)))
		if p.LastError != "" {
			fmt.Fprintf(t, ", last error: %s", ctlabi.Printable(p.LastError))
		}
		fmt.Fprintln(t)
	}
	t.Flush()
	if len(st.Warnings) == 0 {
		fmt.Fprintln(w, "warnings: none")
		return
	}
	fmt.Fprintln(w, "warnings:")
	for _, warn := range st.Warnings {
		fmt.Fprintf(w, "  [%s] %s\n", warn.Code, ctlabi.Printable(warn.Message))
	}
}
