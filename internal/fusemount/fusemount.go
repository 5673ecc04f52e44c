// Package fusemount holds what the mount (fusefs) and `bench disk`'s store
// floor (integration/diskbench) share of a FUSE server: the options that set
// its requests, permissions and background limit, and the bound on the
// readers it keeps waiting on /dev/fuse. The floor stands for what FUSE's
// round trips alone cost the mount, so both take them from here.
package fusemount

import (
	"fmt"
	"os"
	"runtime"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// MaxBackground is how many background requests (the READs of O_DIRECT
// loads) the kernel may have in flight to the server.
const MaxBackground = 256

// Options returns the mount options that decide a server's requests:
// WRITEs of up to maxWrite bytes and READs of up to maxRead, the kernel's
// permission checks, O_DIRECT reads in flight at once, no splice. The
// caller names the server and sets how it mounts.
func Options(maxWrite, maxRead int) fuse.MountOptions {
	return fuse.MountOptions{
		MaxWrite: maxWrite,
		// The kernel checks permissions from cached attributes instead of
		// sending an ACCESS request for every faccessat lookup.
		Options:       []string{"default_permissions", fmt.Sprintf("max_read=%d", maxRead)},
		DisableSplice: true,
		// No EnableLocks: locks are the kernel's, local to the mount
		// (POSIX and flock semantics alike). Passed to the store file,
		// each waiter held a daemon thread in a blocking lock call,
		// unkillable meanwhile, until the daemon hit Go's thread limit
		// (DESIGN "Threat model").
		ExtraCapabilities: fuse.CAP_ASYNC_DIO,
		// The READs of an O_DIRECT load are background requests: 16
		// loaders' rows in requests of up to 4 MiB (128 KiB on a mirrored
		// mount) need far more than the kernel's default 12 in flight.
		MaxBackground:       MaxBackground,
		CongestionThreshold: MaxBackground * 3 / 4,
	}
}

// idleReaders bounds the goroutines go-fuse keeps blocked in read(2) on
// /dev/fuse between bursts (DESIGN "What the kernel cannot do"). The kernel
// hands a request to the reader that has waited longest (fuse_dev_do_read
// sleeps in an exclusive wait, queued at the tail), so after 16 loaders left
// 17 idle readers, each LOOKUP of a lone lookup batch woke the thread that
// had slept longest, on a CPU long idle. go-fuse takes the bound from
// GOMAXPROCS at NewServer (its least is 2) and has no option for it; requests
// in flight are not bounded by it (a reader that takes the last waiting
// place starts another).
const idleReaders = 2

// NewServer is fuse.NewServer with at most idleReaders+1 idle readers. It
// gives GOMAXPROCS back as it was: the operator's GOMAXPROCS, or the
// runtime's default, which keeps following the CPU limit.
func NewServer(fsys fuse.RawFileSystem, mountpoint string, opts *fuse.MountOptions) (*fuse.Server, error) {
	prev := runtime.GOMAXPROCS(idleReaders)
	defer func() {
		if os.Getenv("GOMAXPROCS") != "" {
			runtime.GOMAXPROCS(prev)
		} else {
			runtime.SetDefaultGOMAXPROCS()
		}
	}()
	return fuse.NewServer(fsys, mountpoint, opts)
}
