package fusefs

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// heldRename is a filesystem whose RENAME lasts until release is closed.
type heldRename struct {
	fuse.RawFileSystem
	renaming, release chan struct{}
	renamed           atomic.Bool
	// lookedUpEarly is set by a LOOKUP that ran while the RENAME did.
	lookedUpEarly atomic.Bool
}

func (h *heldRename) Rename(cancel <-chan struct{}, input *fuse.RenameIn, oldName string, newName string) fuse.Status {
	close(h.renaming)
	<-h.release
	h.renamed.Store(true)
	return fuse.OK
}

func (h *heldRename) Lookup(cancel <-chan struct{}, header *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	if !h.renamed.Load() {
		h.lookedUpEarly.Store(true)
	}
	return fuse.OK
}

// refs is how many requests hold or wait for a name's lock.
func (o *nameOrder) refs(n dirName) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	if l := o.names[n]; l != nil {
		return l.refs
	}
	return 0
}

// A LOOKUP of a name being renamed, from or to, runs after the RENAME (its
// tree update included); lookups of other names and of other directories do
// not wait for it.
func TestNameOrderLookupWaitsForRename(t *testing.T) {
	for _, name := range []string{"a.bin_7.tmp", "a.bin"} {
		h := &heldRename{RawFileSystem: fuse.NewDefaultRawFileSystem(), renaming: make(chan struct{}), release: make(chan struct{})}
		o := newNameOrder(h)
		var wg sync.WaitGroup
		wg.Go(func() {
			o.Rename(nil, &fuse.RenameIn{InHeader: fuse.InHeader{NodeId: 5}, Newdir: 5}, "a.bin_7.tmp", "a.bin")
		})
		<-h.renaming
		var out fuse.EntryOut
		o.Lookup(nil, &fuse.InHeader{NodeId: 5}, "b.bin", &out)
		o.Lookup(nil, &fuse.InHeader{NodeId: 6}, name, &out)
		if !h.lookedUpEarly.Swap(false) {
			t.Fatal("lookups of other names did not reach the filesystem")
		}
		looked := make(chan struct{})
		wg.Go(func() {
			defer close(looked)
			o.Lookup(nil, &fuse.InHeader{NodeId: 5}, name, &out)
		})
	wait:
		for o.refs(dirName{5, name}) < 2 {
			select {
			case <-looked:
				break wait
			default:
				runtime.Gosched()
			}
		}
		// The lookup holds its reference: it waits for the lock.
		close(h.release)
		wg.Wait()
		if h.lookedUpEarly.Load() {
			t.Errorf("a lookup of %s ran during its rename", name)
		}
		if len(o.names) != 0 {
			t.Errorf("%d name locks left", len(o.names))
		}
	}
}

// Renames that cross (a→b, b→a) take their names' locks in one order.
func TestNameOrderCrossingRenames(t *testing.T) {
	o := newNameOrder(fuse.NewDefaultRawFileSystem())
	var wg sync.WaitGroup
	for i := range 2 {
		names := []string{"a", "b"}
		wg.Go(func() {
			for range 1000 {
				o.Rename(nil, &fuse.RenameIn{InHeader: fuse.InHeader{NodeId: 5}, Newdir: 5}, names[i], names[1-i])
				o.Unlink(nil, &fuse.InHeader{NodeId: 5}, names[i])
			}
		})
	}
	wg.Wait()
	if len(o.names) != 0 {
		t.Errorf("%d name locks left", len(o.names))
	}
}
