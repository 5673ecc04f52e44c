package diskbench

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/integration/daemon"
)

// lookupFloor times the FUSE round trip that the first lookup of an absent
// key in a directory that exists cannot avoid (the kernel makes no negative
// entry without asking): a server in this process that answers every LOOKUP
// absent, with a cached negative entry, and does nothing else. It is
// reported beside the bare directory's first lookups of that class, so its
// ratio is the best any FUSE mount can reach on this machine: once fresh,
// once after a burst of the engine's thread count left the server's readers
// waiting (DESIGN "What the kernel cannot do").
func (r *run) lookupFloor(res *Result, keys int, bare float64) error {
	dir, err := os.MkdirTemp(r.cfg.Dir, "lookup-floor-")
	if err != nil {
		return err
	}
	defer os.Remove(dir)
	srv, err := fuse.NewServer(absentServer{fuse.NewDefaultRawFileSystem()}, dir, &fuse.MountOptions{
		FsName: "kvtierfs-bench-floor", Name: "kvtierfs-bench-floor", DirectMount: true,
		Options: []string{"default_permissions"}, DisableSplice: true})
	if err != nil {
		return fmt.Errorf("mounting the lookup floor's server: %w", err)
	}
	go srv.Serve()
	defer srv.Unmount()
	if err := srv.WaitMount(); err != nil {
		return err
	}
	fresh, err := floorPass(dir, "fresh-", keys)
	if err != nil {
		return err
	}
	r.report(res, Measurement{Phase: "lookup, first, absent: FUSE round trip alone", Unit: "µs/key", Mount: fresh, Direct: bare, Ratio: bare / fresh})
	// The mount meets its lookups after the loaders' bursts, which leave
	// go-fuse's readers waiting: the same server once a burst of as many
	// threads left its own.
	var burst errgroup.Group
	for t := range r.cfg.Threads {
		burst.Go(func() error {
			_, err := floorPass(dir, fmt.Sprintf("burst-%d-", t), 64)
			return err
		})
	}
	if err := burst.Wait(); err != nil {
		return err
	}
	readers, err := daemon.FuseReaders(os.Getpid())
	if err != nil {
		return err
	}
	fmt.Fprintf(r.cfg.Progress, "lookup floor: %d idle FUSE readers after a burst of %d threads\n", readers, r.cfg.Threads)
	after, err := floorPass(dir, "after-", keys)
	if err != nil {
		return err
	}
	r.report(res, Measurement{Phase: "lookup, first, absent: FUSE round trip after a burst", Unit: "µs/key", Mount: after, Direct: bare, Ratio: bare / after})
	return nil
}

// floorPass looks up keys new names under dir one after the other and
// returns the µs each took.
func floorPass(dir, prefix string, keys int) (float64, error) {
	start := time.Now()
	for i := range keys {
		name := filepath.Join(dir, fmt.Sprintf("%s%064x.bin", prefix, i))
		if err := unix.Faccessat(unix.AT_FDCWD, name, unix.F_OK, 0); err != unix.ENOENT {
			return 0, fmt.Errorf("lookup floor: %s answered %v, want ENOENT", name, err)
		}
	}
	return time.Since(start).Seconds() * 1e6 / float64(keys), nil
}

// absentServer answers every name absent, cached for an hour.
type absentServer struct{ fuse.RawFileSystem }

func (absentServer) Lookup(cancel <-chan struct{}, header *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	out.NodeId = 0
	out.SetEntryTimeout(time.Hour)
	return fuse.OK
}

func (absentServer) GetAttr(cancel <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	out.Mode = syscall.S_IFDIR | 0o755
	out.Ino = fuse.FUSE_ROOT_ID
	out.Nlink = 2
	out.SetTimeout(time.Hour)
	return fuse.OK
}
