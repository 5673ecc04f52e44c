package mount_test

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/kvtierfs/kvtierfs/fusefs"
	"github.com/kvtierfs/kvtierfs/fusefs/prime"
	"github.com/kvtierfs/kvtierfs/integration/daemon"
	"github.com/kvtierfs/kvtierfs/integration/engineio"
	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

// The kernel caches absent names of the block layout (a block, or one of its
// two directories) for an hour, and the daemon answers those levels from
// memory. Every change made through the mount must still show at the next
// lookup: a block stored where its directories did not exist, a block stored
// beside a name looked up absent, a block unlinked, directories made,
// renamed and removed.
func TestLookupsSeeTheLayoutChange(t *testing.T) {
	d := mounttest.Start(t, mounttest.Options{})
	tier := openTier(t, d)
	region := newRegion(t, 1)
	exists := func(i int) bool { return tier.Exists(tier.BlockPath(tierDir, 0, hashOf(i))) }
	expect := func(what string, i int, want bool) {
		t.Helper()
		if got := exists(i); got != want {
			t.Fatalf("%s: block %d present=%v, want %v", what, i, got, want)
		}
	}

	// Absent at the tier, then at the prefix directory, then at the block.
	expect("before anything is stored", 0, false)
	storeBlock(t, tier, region.Row(0), 0)
	expect("after its store", 0, true)
	for i := 1; i < 40; i++ {
		expect("never stored", i, false)
	}
	for i := 1; i < 40; i++ {
		storeBlock(t, tier, region.Row(0), i)
		expect("after its store", i, true)
	}

	// A block stored beside one looked up absent in the same directory.
	h := hashOf(0)
	sibling := h[:60] + "abcd"
	if sibling == h {
		sibling = h[:60] + "dcba"
	}
	siblingPath := filepath.Join(filepath.Dir(tier.BlockPath(tierDir, 0, h)), sibling+".bin")
	if tier.Exists(siblingPath) {
		t.Fatal("a block never stored answers present")
	}
	fillRow(region.Row(0), 1000)
	if _, err := tier.Store(siblingPath, region.Row(0)); err != nil {
		t.Fatal(err)
	}
	if !tier.Exists(siblingPath) {
		t.Fatal("a block looked up absent, then stored, answers absent")
	}

	// Unlinked through the mount: absent at once, present again once stored.
	if err := os.Remove(tier.BlockPath(tierDir, 0, hashOf(1))); err != nil {
		t.Fatal(err)
	}
	expect("after its unlink", 1, false)
	storeBlock(t, tier, region.Row(0), 1)
	expect("stored again", 1, true)

	// Directories of the layout made, renamed and removed through the mount.
	var unused []string
	for i := 0; len(unused) < 2; i++ {
		if p := d.Path(tierDir, hashOf(1000 + i)[:3]); !tier.Exists(p) && (len(unused) == 0 || unused[0] != p) {
			unused = append(unused, p)
		}
	}
	free, moved := unused[0], unused[1]
	group := filepath.Join(free, "00_g0")
	if tier.Exists(group) {
		t.Fatal("a group directory under a missing prefix answers present")
	}
	if err := os.MkdirAll(group, 0o700); err != nil {
		t.Fatal(err)
	}
	if !tier.Exists(free) || !tier.Exists(group) {
		t.Fatal("directories made through the mount answer absent")
	}
	if err := os.Rename(free, moved); err != nil {
		t.Fatal(err)
	}
	if tier.Exists(free) || tier.Exists(group) {
		t.Fatal("a prefix directory renamed away still answers present")
	}
	if !tier.Exists(filepath.Join(moved, "00_g0")) {
		t.Fatal("a prefix directory renamed into place answers absent")
	}
	if err := os.Remove(filepath.Join(moved, "00_g0")); err != nil {
		t.Fatal(err)
	}
	if tier.Exists(filepath.Join(moved, "00_g0")) {
		t.Fatal("a removed group directory answers present")
	}

	// The same answers from a new mount of the store, whose index is read
	// from the disk.
	store := d.Store
	d.Stop()
	d = mounttest.Start(t, mounttest.Options{Store: store})
	tier = openTier(t, d)
	for i := 0; i < 40; i++ {
		expect("after a remount", i, true)
	}
	for i := 40; i < 80; i++ {
		expect("never stored, after a remount", i, false)
	}
	moved = d.Path(tierDir, filepath.Base(moved))
	if !tier.Exists(moved) || tier.Exists(filepath.Join(moved, "00_g0")) {
		t.Fatal("the layout's directories answer differently after a remount")
	}
}

// A layout directory made in the store itself after the mount looked it up
// absent (an operator's mkdir, a restore) does not keep the engine's stores
// under it failing with ENOENT: the engine's makedirs gets EEXIST from the
// store, and then the directory is found and the block stored.
func TestDirectoryMadeInTheStore(t *testing.T) {
	d := mounttest.Start(t, mounttest.Options{})
	tier := openTier(t, d)
	region := newRegion(t, 1)
	storeBlock(t, tier, region.Row(0), 10) // the tier exists: lookups reach the layout
	for i := range 2 {
		block := tier.BlockPath(tierDir, 0, hashOf(i))
		if tier.Exists(block) {
			t.Fatalf("block %d present before it was stored", i)
		}
		dir := filepath.Dir(block)
		if i == 1 {
			dir = filepath.Dir(dir) // the prefix directory only
		}
		storeDir := filepath.Join(d.Store, strings.TrimPrefix(dir, d.Mountpoint))
		if err := os.MkdirAll(storeDir, 0o700); err != nil {
			t.Fatal(err)
		}
		storeBlock(t, tier, region.Row(0), i)
		if !tier.Exists(block) {
			t.Fatalf("block %d absent after its store", i)
		}
	}
}

// The lookup helper lives and dies with its daemon. A daemon stopped with
// SIGTERM right after priming unmounts at once (the helper holds nothing in
// the mount between batches and is stopped first); one killed with SIGKILL
// takes its helper with it.
func TestLookupHelperEndsWithTheDaemon(t *testing.T) {
	for _, crash := range []bool{false, true} {
		t.Run(map[bool]string{false: "SIGTERM", true: "SIGKILL"}[crash], func(t *testing.T) {
			d := primedDaemon(t)
			helper := lookupHelperOf(t, d.Pid())
			if crash {
				d.Crash()
			} else if err := d.Stop(); err != nil {
				t.Fatalf("stopping the daemon: %v", err)
			}
			deadline := time.Now().Add(time.Minute)
			for helperAlive(helper) {
				if time.Now().After(deadline) {
					t.Fatalf("the lookup helper %d outlived its daemon", helper)
				}
				time.Sleep(20 * time.Millisecond)
			}
			if !crash && strings.Contains(d.Log(), "detaching lazily") {
				t.Errorf("the daemon found its mount busy at SIGTERM:\n%s", d.Log())
			}
		})
	}
}

// primedDaemon mounts a store holding a tier the new daemon's kernel has
// never seen, and looks a name of it up: the daemon primes the tier.
func primedDaemon(t *testing.T, args ...string) *mounttest.Daemon {
	t.Helper()
	store := t.TempDir()
	first := mounttest.Start(t, mounttest.Options{Store: store})
	if err := os.Mkdir(first.Path(tierName), 0o700); err != nil {
		t.Fatal(err)
	}
	first.Stop()
	d := mounttest.Start(t, mounttest.Options{Store: store, Args: append([]string{"--debug"}, args...)})
	if _, err := os.Stat(d.Path(tierName, "abc")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("lookup of an absent prefix: %v", err)
	}
	if !d.WaitLog("priming a tier's lookups") {
		t.Fatalf("the daemon did not prime the tier it was asked for:\n%s", d.Log())
	}
	return d
}

// tierName is a tier directory's name as vLLM makes it.
const tierName = "DeepSeek-V4-Flash_0123456789ab_r0"

// lookupHelperOf finds the lookup helper among a daemon's children.
func lookupHelperOf(t *testing.T, daemon int) int {
	t.Helper()
	// A child is listed under the thread that started it, which for the
	// helper (started from a locked thread) is seldom the main one.
	lists, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", daemon))
	if err != nil || len(lists) == 0 {
		t.Fatalf("threads of daemon %d: %v", daemon, err)
	}
	var raw []byte
	for _, l := range lists {
		children, _ := os.ReadFile(l)
		raw = append(raw, children...)
	}
	for _, f := range strings.Fields(string(raw)) {
		pid, _ := strconv.Atoi(f)
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if bytes.Contains(cmdline, []byte(prime.HelperCommand)) {
			return pid
		}
	}
	t.Fatalf("daemon %d has no lookup helper among its children %q", daemon, raw)
	return 0
}

// helperAlive reports whether pid is a lookup helper that has not exited.
func helperAlive(pid int) bool {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !bytes.Contains(cmdline, []byte(prime.HelperCommand)) {
		return false
	}
	fields := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z" && fields[0] != "X"
}

// The daemon never sends a request to its own mount: one killed while its
// own request is being answered could never exit (the request waits on the
// daemon). Not at start-up either (go-fuse's probe of a new mount opens and
// polls a file of it), nor when its tiers are primed (the helper does that).
func TestDaemonSendsNoRequestToItsOwnMount(t *testing.T) {
	d := primedDaemon(t, "--debug-fuse")
	threads, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", d.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	daemonThread := map[string]bool{}
	for _, th := range threads {
		daemonThread[th.Name()] = true
	}
	requests := 0
	for _, line := range strings.Split(d.Log(), "\n") {
		if !strings.Contains(line, `msg="rx `) {
			continue
		}
		requests++
		fields := strings.Fields(strings.TrimSuffix(line[:strings.LastIndex(line, `"`)], `"`))
		if caller := fields[len(fields)-1]; daemonThread[strings.TrimPrefix(caller, "p")] {
			t.Errorf("the daemon sent a request to its own mount: %s", line)
		}
	}
	if requests == 0 {
		t.Fatalf("no request in the daemon's --debug-fuse log:\n%s", d.Log())
	}
}

// An absent key in a leaf directory that holds blocks (most of a long
// prompt's absent keys once the store is full) reaches the daemon once: its
// answer is a negative entry the kernel keeps, so the engine's next lookup
// of it, at the next step, is the kernel's alone. bench disk's repeats of
// these keys once cost a round trip each only because the other side's cache
// drop had emptied the mount's dentries too.
func TestAbsentKeysAreAskedOnce(t *testing.T) {
	d := mounttest.Start(t, mounttest.Options{})
	tier := openTier(t, d)
	region := newRegion(t, 1)
	const keys = 16
	absent := make([]string, keys)
	for i := range keys {
		storeBlock(t, tier, region.Row(0), i)
		absent[i] = hashOf(i)[:5] + hashOf(-1 - i)[5:] // block i's leaf, another name
	}
	lookups := func() int64 { return d.Stats().Counters.Lookups }
	lookUp := func() {
		t.Helper()
		for _, h := range absent {
			if tier.Exists(tier.BlockPath(tierDir, 0, h)) {
				t.Fatalf("key %s present, never stored", h)
			}
		}
	}
	before := lookups()
	lookUp()
	first := lookups()
	lookUp()
	repeat := lookups()
	if first-before != keys {
		t.Errorf("first lookups of %d absent keys reached the daemon %d times, want once each", keys, first-before)
	}
	if repeat != first {
		t.Errorf("repeated lookups of %d absent keys reached the daemon %d times, want none (the kernel's negative entries)", keys, repeat-first)
	}
}

// A present block's entry stays in the kernel while nothing needs to see its
// lookups (--lookup-budget off, one node): the engine's repeated lookups of a
// stored chain are the kernel's alone, and the entry stays true when the
// block leaves, through the mount (unlink) or behind it (a file removed from
// the store, which its next load finds: the daemon tells the kernel). Under
// the lookup budget every repeated lookup reaches the daemon, which decides
// each batch afresh.
func TestPresentKeysStayInTheKernel(t *testing.T) {
	const keys = 16
	setup := func(t *testing.T, args ...string) (*mounttest.Daemon, *engineio.Tier, *engineio.Region, []string, func() int64) {
		d := mounttest.Start(t, mounttest.Options{Args: args})
		tier := openTier(t, d)
		region := newRegion(t, 1)
		paths := make([]string, keys)
		for i := range keys {
			paths[i] = storeBlock(t, tier, region.Row(0), i)
		}
		return d, tier, region, paths, func() int64 { return d.Stats().Counters.Lookups }
	}
	lookUp := func(t *testing.T, tier *engineio.Tier, paths []string) {
		t.Helper()
		for _, p := range paths {
			if !tier.Exists(p) {
				t.Fatalf("stored block %s answers absent", p)
			}
		}
	}

	t.Run("budget off", func(t *testing.T) {
		d, tier, region, paths, lookups := setup(t, "--lookup-budget", "off")
		before := lookups()
		lookUp(t, tier, paths)
		first := lookups()
		lookUp(t, tier, paths)
		// And again once the mount's general entry timeout has lapsed.
		time.Sleep(fusefs.DefaultEntryTimeout + 500*time.Millisecond)
		lookUp(t, tier, paths)
		if first-before != keys || lookups() != first {
			t.Fatalf("%d present keys looked up three times reached the daemon %d, then %d times; want %d, then 0",
				keys, first-before, lookups()-first, keys)
		}

		if err := os.Remove(paths[0]); err != nil {
			t.Fatal(err)
		}
		if tier.Exists(paths[0]) {
			t.Fatal("a block unlinked through the mount answers present")
		}

		if err := os.Remove(filepath.Join(d.Store, strings.TrimPrefix(paths[1], d.Mountpoint))); err != nil {
			t.Fatal(err)
		}
		if err := tier.Load(paths[1], region.Row(0)); err == nil {
			t.Fatal("a block removed from the store behind the daemon loaded")
		}
		deadline := time.Now().Add(30 * time.Second)
		for tier.Exists(paths[1]) {
			if time.Now().After(deadline) {
				t.Fatal("the kernel still answers present for a block the store found gone at its load")
			}
			time.Sleep(10 * time.Millisecond)
		}
		lookUp(t, tier, paths[2:])
	})

	t.Run("budget on", func(t *testing.T) {
		_, tier, _, paths, lookups := setup(t, "--lookup-budget", "auto")
		for pass := range 2 {
			before := lookups()
			lookUp(t, tier, paths)
			if got := lookups() - before; got != keys {
				t.Fatalf("pass %d: %d present keys reached the daemon %d times under the lookup budget, want each", pass, keys, got)
			}
		}
	})
}

// The leaf directories an engine's lookup batch walks cost the daemon nothing
// once their attributes are known: a GETATTR's answer for a directory lives as
// long as its entry, so the permission checks of later lookups (the mount uses
// default_permissions) stay in the kernel, also after the mount's 1 s entry
// timeout. Each absent key is then one LOOKUP and nothing else (but the
// root's attributes, asked again once a second).
func TestLeafDirectoriesStayInTheKernel(t *testing.T) {
	d := mounttest.Start(t, mounttest.Options{Args: []string{"--debug-fuse"}})
	tier := openTier(t, d)
	region := newRegion(t, 1)
	const leaves = 8
	for i := range leaves {
		storeBlock(t, tier, region.Row(0), i)
	}
	absentIn := func(i, round int) string {
		return tier.BlockPath(tierDir, 0, hashOf(i)[:5]+hashOf(-1 - i - leaves*round)[5:])
	}
	lookUp := func(round int) {
		t.Helper()
		for i := range leaves {
			if tier.Exists(absentIn(i, round)) {
				t.Fatalf("round %d: an absent key of leaf %d answers present", round, i)
			}
		}
	}
	lookUp(0)
	time.Sleep(fusefs.DefaultEntryTimeout + 500*time.Millisecond)
	mark := len(d.Log())
	lookUp(1)
	// The log is written after each request: wait for the last LOOKUP's line
	// (any other request of these walks came before it).
	var requests map[string]int
	for deadline := time.Now().Add(30 * time.Second); requests["LOOKUP"] < leaves && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		requests = map[string]int{}
		for _, line := range strings.Split(d.Log()[mark:], "\n") {
			if _, rx, ok := strings.Cut(line, `msg="rx `); ok {
				// The root's attributes live 1 s (fusefs node.Getattr).
				if fields := strings.Fields(rx); len(fields) > 2 && !(fields[1] == "GETATTR" && fields[2] == "n1") {
					requests[fields[1]]++
				}
			}
		}
	}
	if requests["LOOKUP"] != leaves || len(requests) != 1 {
		t.Fatalf("new absent keys in %d known leaves sent %v, want %d LOOKUPs and nothing else", leaves, requests, leaves)
	}
}

// A burst of concurrent requests leaves few of the daemon's threads waiting
// on /dev/fuse: the kernel hands each request to the reader that has waited
// longest, so every reader left over would make each lookup of the engine's
// next batch (one thread, one key after the other) wake a thread that slept
// through the others' turns. The daemon runs with GOMAXPROCS 16, which
// go-fuse's own bound on its idle readers follows (16 + 1 of them).
func TestBurstsLeaveFewReaders(t *testing.T) {
	d := mounttest.Start(t, mounttest.Options{Wrapper: []string{"env", "GOMAXPROCS=16"}})
	tier := openTier(t, d)
	region := newRegion(t, 1)
	const threads, keys = 32, 64
	for i := range threads {
		storeBlock(t, tier, region.Row(0), i)
	}
	before := d.Stats().Counters.Lookups
	var burst errgroup.Group
	for th := range threads {
		burst.Go(func() error {
			for k := range keys {
				// Block th's leaf, another name: one LOOKUP each.
				if p := tier.BlockPath(tierDir, 0, hashOf(th)[:5]+hashOf(-1 - th - threads*k)[5:]); tier.Exists(p) {
					return fmt.Errorf("%s present, never stored", p)
				}
			}
			return nil
		})
	}
	if err := burst.Wait(); err != nil {
		t.Fatal(err)
	}
	if got := d.Stats().Counters.Lookups - before; got != threads*keys {
		t.Fatalf("%d absent keys reached the daemon %d times, want once each", threads*keys, got)
	}
	// go-fuse's least bound is 2 idle readers, and one more may be reading.
	// A reader between its reply and its next read is not counted, so the
	// count is sampled until it settles; 32 idle readers never settle there.
	var readers int
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var err error
		if readers, err = daemon.FuseReaders(d.Pid()); err != nil {
			t.Fatal(err)
		}
		if readers >= 1 && readers <= 3 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a burst of %d threads %d daemon threads wait on /dev/fuse for 10 s, want 1 to 3", threads, readers)
		}
	}
}

// A store into a leaf directory it makes reaches the daemon's lookups three
// times: the engine's existence check, which ends at the missing leaf, the
// kernel's own lookup of the leaf inside the mkdir (a cached absence is asked
// again before a create) and of the block's name inside the rename. vLLM renames
// with rename(2) alone, and engineio replays it so: Go's os.Rename first
// lstats the destination, a fourth lookup (a FUSE round trip) vLLM never sends.
func TestStoreLooksItsNameUpOnceInItsRename(t *testing.T) {
	d := mounttest.Start(t, mounttest.Options{})
	tier := openTier(t, d)
	region := newRegion(t, 1)
	first := hashOf(0)
	storeBlock(t, tier, region.Row(0), 0)
	// Block 0's prefix directory, another leaf.
	leaf := "00"
	if first[3:5] == leaf {
		leaf = "01"
	}
	path := tier.BlockPath(tierDir, 0, first[:3]+leaf+hashOf(1)[5:])
	lookups := func() int64 { return d.Stats().Counters.Lookups }
	before := lookups()
	if _, err := tier.Store(path, region.Row(0)); err != nil {
		t.Fatal(err)
	}
	if n := lookups() - before; n != 3 {
		t.Fatalf("a store into a new leaf reached the daemon's lookups %d times, want 3 (its existence check, the mkdir's and the rename's own)", n)
	}
}
