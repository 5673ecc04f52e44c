package fusefs

import (
	"context"
	"log/slog"
	"syscall"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
	"github.com/kvtierfs/kvtierfs/tiers/disk"
	"github.com/kvtierfs/kvtierfs/tiers/tier"
)

// TestControlFilesAnswerOnlyTheEngine opens and writes the control files as
// the engine's uid, root and another uid: the daemon itself refuses the
// other uid (EACCES), whatever the kernel's permission checks let through.
func TestControlFilesAnswerOnlyTheEngine(t *testing.T) {
	const engineUID = 4242
	owner := &disk.Owner{UID: engineUID, GID: engineUID}
	if syscall.Geteuid() != 0 {
		owner = nil // only root can give the store away; the daemon's uid is then the engine's
	}
	store, err := disk.Open(disk.Config{Dir: t.TempDir(), Owner: owner})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	f := &FS{store: store, tier: tier.New(tier.Config{Store: store}), logger: slog.New(slog.DiscardHandler)}
	engine := store.Owner().UID
	as := func(uid int) context.Context {
		return fuse.NewContext(context.Background(), &fuse.Caller{Owner: fuse.Owner{Uid: uint32(uid)}})
	}
	match, stats := &matchFile{fsys: f}, &statsFile{fsys: f}
	for _, uid := range []int{engine, 0} {
		h, _, errno := match.Open(as(uid), syscall.O_RDWR)
		if errno != 0 {
			t.Fatalf("uid %d: open match: %v", uid, errno)
		}
		if _, errno := h.(*matchHandle).Write(as(uid), []byte("{}"), 0); errno != 0 {
			t.Fatalf("uid %d: write match: %v", uid, errno)
		}
		h.(*matchHandle).Release(as(uid))
	}
	other := engine + 1
	if _, _, errno := match.Open(as(other), syscall.O_RDWR); errno != syscall.EACCES {
		t.Errorf("another uid: open match: %v, want EACCES", errno)
	}
	if _, _, errno := stats.Open(as(other), syscall.O_RDONLY); errno != syscall.EACCES {
		t.Errorf("another uid: open stats: %v, want EACCES", errno)
	}
	h, _, _ := match.Open(as(engine), syscall.O_RDWR)
	if _, errno := h.(*matchHandle).Write(as(other), []byte("{}"), 0); errno != syscall.EACCES {
		t.Errorf("another uid writing on the engine's descriptor: %v, want EACCES", errno)
	}
	if f.matchBuffered.Load() != 0 {
		t.Errorf("%d match bytes still buffered after release", f.matchBuffered.Load())
	}
}

// TestMatchBufferedBounded fills match descriptors with whole requests: once
// maxMatchBuffered bytes are buffered the next write gets ENOBUFS, and a
// released descriptor gives its bytes back.
func TestMatchBufferedBounded(t *testing.T) {
	store, err := disk.Open(disk.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	f := &FS{store: store, tier: tier.New(tier.Config{Store: store}), logger: slog.New(slog.DiscardHandler)}
	ctx := fuse.NewContext(context.Background(), &fuse.Caller{Owner: fuse.Owner{Uid: uint32(store.Owner().UID)}})
	request := make([]byte, ctlabi.MaxRequestBytes)
	var handles []*matchHandle
	for range maxMatchBuffered / ctlabi.MaxRequestBytes {
		h, _, _ := (&matchFile{fsys: f}).Open(ctx, syscall.O_RDWR)
		if _, errno := h.(*matchHandle).Write(ctx, request, 0); errno != 0 {
			t.Fatalf("write %d: %v", len(handles), errno)
		}
		handles = append(handles, h.(*matchHandle))
	}
	extra, _, _ := (&matchFile{fsys: f}).Open(ctx, syscall.O_RDWR)
	if _, errno := extra.(*matchHandle).Write(ctx, request[:1], 0); errno != syscall.ENOBUFS {
		t.Fatalf("a write past %d buffered bytes: %v, want ENOBUFS", maxMatchBuffered, errno)
	}
	handles[0].Release(ctx)
	if _, errno := extra.(*matchHandle).Write(ctx, request[:1], 0); errno != 0 {
		t.Fatalf("a write after a release: %v", errno)
	}
}
