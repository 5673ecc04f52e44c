package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
	"github.com/kvtierfs/kvtierfs/tiers/shm"
)

// defaultGCGrace is how long a quarantined region waits before the processes
// are scanned again.
const defaultGCGrace = time.Second

// quarantinePrefix starts the hidden name an orphan is renamed aside to:
// quarantinePrefix, 16 random hex digits, "-", its name.
const quarantinePrefix = ".kvtierfs-gc-"

// asideGlob matches the names the regions of glob are renamed aside to.
func asideGlob(glob string) string {
	dir, base := filepath.Split(glob)
	return filepath.Join(dir, quarantinePrefix+"*-"+base)
}

// maxOrphansListed bounds the orphaned regions stat lists one by one, and
// the other users' files gc-regions lists.
const maxOrphansListed = 20

func runGCRegions(args []string) error {
	fl := newFlagSet("gc-regions")
	glob := fl.String("shm-glob", shm.DefaultGlob, "glob of the engine's shared offload regions")
	dryRun := fl.Bool("dry-run", false, "list the orphaned regions without removing them")
	engineUID := fl.Int("engine-uid", os.Getuid(), "uid of the engine (as mount's --engine-uid): only files under the glob owned by it or root are its regions; other users' are left (default: the user running gc-regions)")
	timeout := fl.Duration("timeout", defaultMountTimeout, "give up when a scan of the regions and the processes' mappings takes longer (a process stuck in the kernel holding its mappings); bounds the scan before the grace and the one after")
	grace := fl.Duration("grace", defaultGCGrace, "how long an orphaned region stays renamed aside before processes are scanned again and it is removed")
	if err := parseFlags(fl, args); err != nil {
		return err
	}
	if err := checkTimeout(*timeout); err != nil {
		return err
	}
	if fl.NArg() != 0 {
		return usageError{fmt.Errorf("expected no arguments, got %q (run 'kvtierfs gc-regions --help')", fl.Args())}
	}
	if *grace <= 0 {
		return usageError{fmt.Errorf("--grace %s: want a positive duration such as 1s", *grace)}
	}
	if *engineUID < 0 || *engineUID > math.MaxUint32-1 {
		return usageError{fmt.Errorf("--engine-uid %d: want a uid, 0 to %d", *engineUID, math.MaxUint32-1)}
	}
	scan, err := scanRegionsWithin(*glob, shm.RegionOwners(uint32(*engineUID)), *timeout)
	if err != nil {
		return err
	}
	return gcRegions(os.Stdout, scan, *dryRun, *grace, *timeout)
}

// gcRegions removes (or with dryRun lists) the orphaned regions of scan.
// An engine may open an orphan by its name at any moment (vLLM's workers
// join an existing region file), so each is first renamed aside in its
// directory, where no engine looks for it; after grace the processes are
// scanned again, within timeout: an orphan some process opened or mapped
// meanwhile gets its name back, the others are removed; every one gets it
// back when the scan does not finish.
func gcRegions(w io.Writer, scan regionScan, dryRun bool, grace, timeout time.Duration) error {
	for i, r := range scan.others {
		if i == maxOrphansListed { // any local user can put as many there as /dev/shm holds
			fmt.Fprintf(w, "and %d more files not the engine's: left\n", len(scan.others)-i)
			break
		}
		fmt.Fprintf(w, "not the engine's (uid %d): left %s (%s)\n", r.uid, ctlabi.Printable(r.path), formatBytes(r.size))
	}
	if len(scan.unreadable) > 0 {
		for _, r := range scan.orphans {
			fmt.Fprintf(w, "not proven orphaned %s (%s)\n", ctlabi.Printable(r.path), formatBytes(r.size))
		}
		return fmt.Errorf("cannot read the mappings of processes %s, so no region is proven orphaned: nothing removed (run as root, in the host's PID namespace)",
			describeProcesses(scan.unreadable))
	}
	for _, r := range scan.inUse {
		fmt.Fprintf(w, "in use %s (%s)\n", ctlabi.Printable(r.path), formatBytes(r.size))
	}
	if dryRun {
		for _, r := range scan.orphans {
			fmt.Fprintf(w, "would remove %s (%s)\n", ctlabi.Printable(r.path), formatBytes(r.size))
		}
		return nil
	}
	failed := 0
	var aside []*quarantined
	dirs := map[string]*os.File{}
	defer func() {
		for _, d := range dirs {
			d.Close()
		}
	}()
	for _, r := range scan.orphans {
		q, err := quarantine(r, dirs)
		if err != nil {
			fmt.Fprintf(w, "kept %s: %v\n", ctlabi.Printable(r.path), err)
			failed++
			continue
		}
		aside = append(aside, q)
	}
	removed := 0
	var freed int64
	if len(aside) > 0 {
		time.Sleep(grace)
		wanted := map[fileID]bool{}
		for _, q := range aside {
			wanted[q.r.id] = true
		}
		used, err := filesInUseWithin(wanted, timeout) // the caller decided whether unreadable processes allow removal
		for _, q := range aside {
			switch {
			case err != nil:
				fmt.Fprintf(w, "kept %s: %v%s\n", ctlabi.Printable(q.r.path), err, q.restore())
				failed++
			case used[q.r.id]:
				fmt.Fprintf(w, "kept %s: a process opened or mapped it since the scan%s\n", ctlabi.Printable(q.r.path), q.restore())
				failed++
			default:
				if err := q.remove(); err != nil {
					fmt.Fprintf(w, "kept %s: %v\n", ctlabi.Printable(q.r.path), err)
					failed++
					continue
				}
				removed++
				freed += q.r.size
				fmt.Fprintf(w, "removed %s (%s)\n", ctlabi.Printable(q.r.path), formatBytes(q.r.size))
			}
		}
	}
	fmt.Fprintf(w, "%d orphaned regions removed, %s freed\n", removed, formatBytes(freed))
	if failed > 0 {
		return fmt.Errorf("%d orphaned regions could not be removed", failed)
	}
	return nil
}

// quarantined is an orphaned region renamed aside in its directory (dir,
// shared by the regions in it).
type quarantined struct {
	r     regionFile
	dir   *os.File
	name  string
	aside string
}

// quarantine renames an orphaned region aside, if its name still holds the
// file scanned, to a hidden name no glob of regions matches. dirs holds the
// directories opened so far, by path.
func quarantine(r regionFile, dirs map[string]*os.File) (*quarantined, error) {
	dirPath, name := filepath.Split(r.path)
	dirPath = filepath.Clean(dirPath)
	dir := dirs[dirPath]
	if dir == nil {
		dfd, err := unix.Open(dirPath, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("opening its directory: %w", err)
		}
		dir = os.NewFile(uintptr(dfd), dirPath)
		dirs[dirPath] = dir
	}
	q := &quarantined{r: r, dir: dir, name: name}
	if !q.holds(name) {
		return nil, errors.New("replaced since the scan")
	}
	random := make([]byte, 8)
	rand.Read(random)
	q.aside = quarantinePrefix + hex.EncodeToString(random) + "-" + name
	if err := unix.Renameat2(int(dir.Fd()), name, int(dir.Fd()), q.aside, unix.RENAME_NOREPLACE); err != nil {
		return nil, fmt.Errorf("renaming it aside: %w", err)
	}
	if !q.holds(q.aside) {
		// Replaced between the check and the rename: give the new file
		// its name back.
		return nil, errors.New("replaced since the scan" + q.restore())
	}
	return q, nil
}

// holds tells whether name in the region's directory is the scanned file,
// asking nothing mounted on the name since the scan (shm.EntryAt).
func (q *quarantined) holds(name string) bool {
	e, err := shm.EntryAt(int(q.dir.Fd()), name)
	return err == nil && e.Reason == "" && regionID(e.ID) == q.r.id
}

// restore gives the quarantined file its name back; it returns what to add
// to the report when it cannot.
func (q *quarantined) restore() string {
	err := unix.Renameat2(int(q.dir.Fd()), q.aside, int(q.dir.Fd()), q.name, unix.RENAME_NOREPLACE)
	if err == nil {
		return " (name given back)"
	}
	return fmt.Sprintf(" (its name could not be given back: %v; it is %s)", err,
		ctlabi.Printable(filepath.Join(q.dir.Name(), q.aside)))
}

// remove unlinks the quarantined file if its hidden name still holds it.
func (q *quarantined) remove() error {
	if !q.holds(q.aside) {
		return fmt.Errorf("replaced while renamed aside as %s", ctlabi.Printable(filepath.Join(q.dir.Name(), q.aside)))
	}
	return unix.Unlinkat(int(q.dir.Fd()), q.aside, 0)
}

// printOrphans adds the orphaned regions to stat's report, the first
// maxOrphansListed one by one, and counts the other users' files apart.
func printOrphans(w io.Writer, scan regionScan) {
	if len(scan.others) > 0 {
		var bytes int64
		for _, r := range scan.others {
			bytes += r.size
		}
		fmt.Fprintf(w, "other users' files under the glob: %d (%s), not the engine's regions: gc-regions leaves them\n", len(scan.others), formatBytes(bytes))
	}
	if len(scan.orphans) == 0 {
		fmt.Fprintln(w, "orphaned regions: none")
		return
	}
	fmt.Fprintf(w, "orphaned regions: %d mapped by no process ('kvtierfs gc-regions' removes them):\n", len(scan.orphans))
	for i, r := range scan.orphans {
		if i == maxOrphansListed {
			fmt.Fprintf(w, "  and %d more\n", len(scan.orphans)-i)
			break
		}
		fmt.Fprintf(w, "  %s  %s\n", ctlabi.Printable(r.path), formatBytes(r.size))
	}
	if len(scan.unreadable) > 0 {
		fmt.Fprintf(w, "  (not proven: the mappings of processes %s are unreadable)\n", describeProcesses(scan.unreadable))
	}
}
