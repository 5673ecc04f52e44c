package diskbench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/fusefs"
	"github.com/kvtierfs/kvtierfs/integration/daemon"
	"github.com/kvtierfs/kvtierfs/integration/engineio"
	"github.com/kvtierfs/kvtierfs/internal/fusemount"
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
	defer unmountFloor(srv, dir)
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

// storeFloor times the engine's stores through a FUSE server that does
// nothing but pass them to a directory of the same filesystem: go-fuse's
// loopback in this process, with the mount's options that shape a store's
// round trips (default_permissions, the request size, direct I/O for the
// tmp with its O_DIRECT write through a page-aligned bounce buffer, no
// FLUSH at close, as few idle readers, the kernel's entries cached as the
// mount caches them: directories and absences for an hour, a tmp's entry
// not at all), and no checksum, index or record. It runs in rounds against
// stores into a fresh bare directory, so its ratio is what FUSE's round
// trips alone leave of the bare directory's stores (DESIGN "The store").
// Every block stored through it is then read back from its directory and
// compared with its row.
func (r *run) storeFloor(res *Result) error {
	work, err := os.MkdirTemp(r.cfg.Dir, "store-floor-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	backing, mnt := mkdir(work, "store"), mkdir(work, "mnt")
	bufs := &alignedBuffers{free: make(chan []byte, r.cfg.Threads)}
	defer bufs.release()
	root := &fs.LoopbackRoot{Path: backing}
	root.RootNode = &floorNode{LoopbackNode: &fs.LoopbackNode{RootData: root}, bufs: bufs}
	second, hour := time.Second, time.Hour
	opts := &fs.Options{AttrTimeout: &second, NegativeTimeout: &hour,
		MountOptions: fusemount.Options(fusefs.DefaultMaxRequest, fusefs.DefaultMaxRequest)}
	opts.FsName, opts.Name, opts.DirectMount = "kvtierfs-bench-store-floor", "kvtierfs-bench-floor", true
	srv, err := fusemount.NewServer(fs.NewNodeFS(root.RootNode, opts), mnt, &opts.MountOptions)
	if err != nil {
		return fmt.Errorf("mounting the store floor's server: %w", err)
	}
	go srv.Serve()
	defer unmountFloor(srv, mnt)
	if err := srv.WaitMount(); err != nil {
		return err
	}
	floor := &engineio.Tier{Root: mnt, Direct: r.bare.Direct}
	bare := &engineio.Tier{Root: mkdir(work, "bare"), Direct: r.bare.Direct}
	if err := r.compareStores(res, "store: FUSE round trips alone", floor, bare, false); err != nil {
		return err
	}
	onDisk := &engineio.Tier{Root: backing, Direct: r.bare.Direct}
	for i := range r.cfg.Blocks {
		got := r.loadRow(0)
		if err := onDisk.Load(onDisk.BlockPath(tierDir, 0, key(i)), got); err != nil {
			return fmt.Errorf("the store floor's block %d: %w", i, err)
		}
		if !bytes.Equal(got, r.sourceRow(i)) {
			return fmt.Errorf("the store floor's block %d differs from its row", i)
		}
		res.FloorVerified++
	}
	return nil
}

// floorNode is go-fuse's loopback node with the mount's entry lifetimes and
// its direct I/O tmp.
type floorNode struct {
	*fs.LoopbackNode
	bufs *alignedBuffers
}

// WrapChild makes every node below the root a floorNode.
func (n *floorNode) WrapChild(ctx context.Context, ops fs.InodeEmbedder) fs.InodeEmbedder {
	if lb, ok := ops.(*fs.LoopbackNode); ok {
		return &floorNode{LoopbackNode: lb, bufs: n.bufs}
	}
	return ops
}

// cacheDir keeps a directory's entry and attributes for an hour, as the mount does.
func cacheDir(out *fuse.EntryOut, errno syscall.Errno) {
	if errno == 0 && out.Mode&syscall.S_IFMT == syscall.S_IFDIR {
		out.SetEntryTimeout(time.Hour)
		out.SetAttrTimeout(time.Hour)
	}
}

func (n *floorNode) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	child, errno := n.LoopbackNode.Lookup(ctx, name, out)
	cacheDir(out, errno)
	return child, errno
}

func (n *floorNode) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	child, errno := n.LoopbackNode.Mkdir(ctx, name, mode, out)
	cacheDir(out, errno)
	return child, errno
}

func (n *floorNode) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	errno := n.LoopbackNode.Getattr(ctx, f, out)
	if errno == 0 && out.Mode&syscall.S_IFMT == syscall.S_IFDIR && n.EmbeddedInode() != n.Root() {
		out.SetTimeout(time.Hour)
	}
	return errno
}

// Create opens the tmp as the mount does: direct I/O, no FLUSH at close, the
// store file opened with the engine's flags (O_DIRECT included). Its handle
// is not the loopback's, which go-fuse would pass through to the kernel.
func (n *floorNode) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	child, fh, _, errno := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	lf := fh.(*fs.LoopbackFile)
	fd, _ := lf.PassthroughFd() // its descriptor, which it keeps until Release
	f := &floorFile{file: lf, fd: fd, direct: flags&syscall.O_DIRECT != 0, bufs: n.bufs}
	return child, f, fuse.FOPEN_DIRECT_IO | fuse.FOPEN_NOFLUSH, 0
}

// floorFile writes a tmp, an O_DIRECT one from a page-aligned copy of each
// WRITE's payload, which FUSE hands over unaligned.
type floorFile struct {
	file   *fs.LoopbackFile
	fd     int
	direct bool
	bufs   *alignedBuffers
}

func (f *floorFile) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	if !f.direct {
		return f.file.Write(ctx, data, off)
	}
	buf, err := f.bufs.get()
	if err != nil {
		return 0, fs.ToErrno(err)
	}
	defer f.bufs.put(buf)
	n, err := unix.Pwrite(f.fd, buf[:copy(buf, data)], off)
	if err != nil {
		return 0, fs.ToErrno(err)
	}
	return uint32(n), 0
}

func (f *floorFile) Release(ctx context.Context) syscall.Errno { return f.file.Release(ctx) }

// alignedBuffers recycles mapped (page-aligned) buffers of one request.
type alignedBuffers struct{ free chan []byte }

func (b *alignedBuffers) get() ([]byte, error) {
	select {
	case buf := <-b.free:
		return buf, nil
	default:
		return unix.Mmap(-1, 0, fusefs.DefaultMaxRequest, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	}
}

func (b *alignedBuffers) put(buf []byte) {
	select {
	case b.free <- buf:
	default:
		unix.Munmap(buf)
	}
}

// release unmaps the buffers kept.
func (b *alignedBuffers) release() {
	for {
		select {
		case buf := <-b.free:
			unix.Munmap(buf)
		default:
			return
		}
	}
}

// unmountFloor unmounts a floor's server, and detaches its mount lazily
// where go-fuse's unmount gave up (a reader still busy), so that removing
// the bench's directories never walks into a live mount.
func unmountFloor(srv *fuse.Server, mnt string) {
	if err := srv.Unmount(); err != nil {
		daemon.Detach(mnt)
	}
}
