package diskbench

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// lookupFloor times the FUSE round trip that the first lookup of an absent
// key in a directory that exists cannot avoid (the kernel makes no negative
// entry without asking): a server in this process that answers every LOOKUP
// absent, with a cached negative entry, and does nothing else. It is
// reported beside the bare directory's first lookups of that class, so its
// ratio is the best any FUSE mount can reach on this machine.
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
	start := time.Now()
	for i := range keys {
		name := filepath.Join(dir, fmt.Sprintf("%064x.bin", i))
		if err := unix.Faccessat(unix.AT_FDCWD, name, unix.F_OK, 0); err != unix.ENOENT {
			return fmt.Errorf("lookup floor: %s answered %v, want ENOENT", name, err)
		}
	}
	floor := time.Since(start).Seconds() * 1e6 / float64(keys)
	r.report(res, Measurement{Phase: "lookup, first, absent: FUSE round trip alone", Unit: "µs/key", Mount: floor, Direct: bare, Ratio: bare / floor})
	return nil
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
