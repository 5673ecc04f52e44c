package fusefs

import (
	"sync"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// nameOrder keeps go-fuse's node tree naming each node by the name the
// store gives its file. The tree has the last word on what a node is: every
// operation on a node works on the store path the tree gives it (node.self),
// and a block's OPEN becomes a load only when that path is a block name.
//
// go-fuse's LOOKUP stats the store and files the node it found under the
// name after that (rawBridge.Lookup, outside the node's Lookup); RENAME and
// UNLINK change the store, then move or drop the name in the tree. The kernel
// sends a LOOKUP that revalidates a cached entry without its directory's lock,
// so such a LOOKUP can run beside a RENAME or UNLINK of the same name: it
// stats a tmp name just before its publish renames it, and files the block's
// node under the tmp name again once the RENAME has moved it to the block
// name. The node then has two names, the newest the tmp's, and a load of the
// block opened the file that next took the tmp name (DESIGN.md "Lookups and
// the kernel's caches"). So a LOOKUP of a name, tree update included, never
// overlaps a RENAME or UNLINK of that name: lookups of one name run side by
// side, the changes of it one at a time between them.
type nameOrder struct {
	fuse.RawFileSystem

	mu    sync.Mutex
	names map[dirName]*nameLock
}

// dirName is a name in a directory, by the directory's node id.
type dirName struct {
	dir  uint64
	name string
}

// nameLock orders the LOOKUPs (readers) and changes (writers) of one name;
// refs counts the requests holding or waiting for it.
type nameLock struct {
	sync.RWMutex
	refs int
}

func newNameOrder(raw fuse.RawFileSystem) *nameOrder {
	return &nameOrder{RawFileSystem: raw, names: map[dirName]*nameLock{}}
}

// hold returns name's lock, counted as held until release.
func (o *nameOrder) hold(n dirName) *nameLock {
	o.mu.Lock()
	defer o.mu.Unlock()
	l := o.names[n]
	if l == nil {
		l = &nameLock{}
		o.names[n] = l
	}
	l.refs++
	return l
}

func (o *nameOrder) release(n dirName) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if l := o.names[n]; l != nil {
		if l.refs--; l.refs == 0 {
			delete(o.names, n)
		}
	}
}

// changing locks names for a change of each (distinct names only, in one
// order, so two renames of the same two names cannot deadlock) and returns
// the unlock.
func (o *nameOrder) changing(names ...dirName) func() {
	if len(names) == 2 {
		a, b := names[0], names[1]
		switch {
		case a == b:
			names = names[:1]
		case b.dir < a.dir || b.dir == a.dir && b.name < a.name:
			names = []dirName{b, a}
		}
	}
	locks := make([]*nameLock, len(names))
	for i, n := range names {
		locks[i] = o.hold(n)
		locks[i].Lock()
	}
	return func() {
		for i, n := range names {
			locks[i].Unlock()
			o.release(n)
		}
	}
}

func (o *nameOrder) Lookup(cancel <-chan struct{}, header *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	if name == "." || name == ".." {
		return o.RawFileSystem.Lookup(cancel, header, name, out)
	}
	n := dirName{header.NodeId, name}
	l := o.hold(n)
	l.RLock()
	defer o.release(n)
	defer l.RUnlock()
	return o.RawFileSystem.Lookup(cancel, header, name, out)
}

func (o *nameOrder) Rename(cancel <-chan struct{}, input *fuse.RenameIn, oldName string, newName string) fuse.Status {
	defer o.changing(dirName{input.NodeId, oldName}, dirName{input.Newdir, newName})()
	return o.RawFileSystem.Rename(cancel, input, oldName, newName)
}

func (o *nameOrder) Unlink(cancel <-chan struct{}, header *fuse.InHeader, name string) fuse.Status {
	defer o.changing(dirName{header.NodeId, name})()
	return o.RawFileSystem.Unlink(cancel, header, name)
}
