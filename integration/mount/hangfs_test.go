package mount_test

import (
	"context"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// hangFS is a loopback FUSE mount whose requests hang while it is hung, as
// the client of a distributed filesystem whose servers vanished does: the
// calls block in the kernel, not in the caller.
type hangFS struct {
	mu     sync.Mutex
	open   chan struct{} // closed while requests are answered
	server *fuse.Server
}

// mountHangFS mounts a loopback of a new directory at mnt; cleanup resumes
// and unmounts it.
func mountHangFS(t *testing.T, mnt string) *hangFS {
	t.Helper()
	back := t.TempDir()
	h := &hangFS{open: make(chan struct{})}
	close(h.open)
	root := &fs.LoopbackRoot{Path: back}
	rootNode := &hangNode{LoopbackNode: &fs.LoopbackNode{RootData: root}, h: h}
	root.RootNode = rootNode
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	zero := time.Duration(0)
	server, err := fs.Mount(mnt, rootNode, &fs.Options{EntryTimeout: &zero, AttrTimeout: &zero, NegativeTimeout: &zero,
		MountOptions: fuse.MountOptions{FsName: "hangfs", DirectMount: true}})
	if err != nil {
		t.Fatal(err)
	}
	h.server = server
	t.Cleanup(func() {
		h.resume()
		for range 50 {
			if server.Unmount() == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		syscall.Unmount(mnt, syscall.MNT_DETACH)
	})
	return h
}

// hang makes every later request wait until resume.
func (h *hangFS) hang() {
	h.mu.Lock()
	defer h.mu.Unlock()
	select {
	case <-h.open:
		h.open = make(chan struct{})
	default:
	}
}

// resume answers the waiting requests and every later one.
func (h *hangFS) resume() {
	h.mu.Lock()
	defer h.mu.Unlock()
	select {
	case <-h.open:
	default:
		close(h.open)
	}
}

func (h *hangFS) wait() {
	h.mu.Lock()
	c := h.open
	h.mu.Unlock()
	<-c
}

// hangNode is a loopback node whose metadata requests wait while hung.
type hangNode struct {
	*fs.LoopbackNode
	h *hangFS
}

// WrapChild makes every node the loopback creates a hangNode.
func (n *hangNode) WrapChild(ctx context.Context, ops fs.InodeEmbedder) fs.InodeEmbedder {
	if lb, ok := ops.(*fs.LoopbackNode); ok {
		return &hangNode{LoopbackNode: lb, h: n.h}
	}
	return ops
}

func (n *hangNode) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	n.h.wait()
	return n.LoopbackNode.Lookup(ctx, name, out)
}

func (n *hangNode) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	n.h.wait()
	return n.LoopbackNode.Getattr(ctx, f, out)
}

func (n *hangNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	n.h.wait()
	return n.LoopbackNode.Open(ctx, flags)
}

func (n *hangNode) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	n.h.wait()
	return n.LoopbackNode.Create(ctx, name, flags, mode, out)
}

func (n *hangNode) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	n.h.wait()
	return n.LoopbackNode.Mkdir(ctx, name, mode, out)
}

func (n *hangNode) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	n.h.wait()
	return n.LoopbackNode.Rename(ctx, name, newParent, newName, flags)
}

func (n *hangNode) Unlink(ctx context.Context, name string) syscall.Errno {
	n.h.wait()
	return n.LoopbackNode.Unlink(ctx, name)
}

func (n *hangNode) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	n.h.wait()
	return n.LoopbackNode.Setxattr(ctx, attr, data, flags)
}

func (n *hangNode) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	n.h.wait()
	return n.LoopbackNode.Getxattr(ctx, attr, dest)
}
