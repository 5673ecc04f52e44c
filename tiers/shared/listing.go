package shared

import (
	"errors"
	"io/fs"
	"strings"
	"syscall"
	"time"
)

// Cold lookups are answered from listings of the layout's directories
// (DESIGN.md "The shared level"): one bounded readdir of a directory answers
// every name under it for NegativeTTL, and an absent directory answers all
// the keys below it absent, so N mostly-absent keys cost one call per
// directory, not one stat each.

// maxListing bounds the names one listing keeps; a larger directory is not
// cached and its keys are stat'ed one by one.
const maxListing = 1 << 16

// errListingTooLarge is a directory with more than maxListing names.
var errListingTooLarge = errors.New("shared store directory too large to list")

// listing is what one directory of the shared store held when listed.
type listing struct {
	at time.Time
	// absent is set when the directory itself did not exist.
	absent bool
	// names maps each entry's name to its type bits.
	names map[string]fs.FileMode
}

// listCall is a listing in flight, which a second lookup under the same directory waits for.
type listCall struct {
	done chan struct{}
	ls   listing
	err  error
}

// listed returns a fresh listing of dir, listing it under the bound if none
// is cached; called reports whether the shared store was asked.
func (l *Level) listed(dir string, now time.Time) (ls listing, called bool, err error) {
	r := &l.reads
	r.mu.Lock()
	if ls, ok := r.listings[dir]; ok && now.Sub(ls.at) < l.cfg.NegativeTTL {
		r.mu.Unlock()
		return ls, false, nil
	}
	if c := r.listing[dir]; c != nil {
		r.mu.Unlock()
		<-c.done
		return c.ls, true, c.err
	}
	c := &listCall{done: make(chan struct{})}
	r.listing[dir] = c
	r.mu.Unlock()

	c.ls, c.err = l.list(dir, now)
	r.mu.Lock()
	delete(r.listing, dir)
	if c.err == nil {
		r.keepListing(dir, c.ls, now, l.cfg.NegativeTTL)
	}
	r.mu.Unlock()
	close(c.done)
	return c.ls, true, c.err
}

// list reads dir under the bound; its time is taken before the call, so a
// name created after it is seen within NegativeTTL of its creation.
func (l *Level) list(dir string, now time.Time) (listing, error) {
	entries, err := call(l.bound, func() ([]fs.DirEntry, error) { return l.dir.ReadDir(dir, maxListing, nil) })
	switch {
	case errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ENOTDIR) || errors.Is(err, syscall.ELOOP):
		// A link where a directory of the layout belongs is never followed.
		return listing{at: now, absent: true}, nil
	case errors.Is(err, errTooLarge):
		return listing{}, errListingTooLarge
	case err != nil:
		return listing{}, err
	}
	ls := listing{at: now, names: make(map[string]fs.FileMode, len(entries))}
	for _, e := range entries {
		ls.names[e.Name()] = e.Type()
	}
	return ls, nil
}

// keepListing caches a listing; past maxCached names in all (a listing
// counts one more than its names, so absent directories count too) it
// forgets the expired listings, then others until half remain. r.mu is held.
func (r *readThrough) keepListing(dir string, ls listing, now time.Time, ttl time.Duration) {
	if old, ok := r.listings[dir]; ok {
		r.listedNames -= len(old.names) + 1
	}
	if r.listedNames+len(ls.names)+1 > maxCached {
		for k, old := range r.listings {
			if now.Sub(old.at) >= ttl {
				r.listedNames -= len(old.names) + 1
				delete(r.listings, k)
			}
		}
		for k, old := range r.listings {
			if r.listedNames+len(ls.names)+1 <= maxCached/2 {
				break
			}
			r.listedNames -= len(old.names) + 1
			delete(r.listings, k)
		}
	}
	r.listings[dir] = ls
	r.listedNames += len(ls.names) + 1
}

// fromListings answers whether rel may be in the shared store from the
// listings of its directories, top down: false if a directory on its path
// or rel itself is not listed; true (worth a stat) otherwise, with whether
// it is listed as a directory. errListingTooLarge means only a stat can tell.
func (l *Level) fromListings(rel string, now time.Time) (present, isDir, called bool, err error) {
	parts := strings.Split(rel, "/")
	for i, name := range parts {
		dir := "."
		if i > 0 {
			dir = strings.Join(parts[:i], "/")
		}
		ls, asked, err := l.listed(dir, now)
		called = called || asked
		if err != nil {
			return false, false, called, err
		}
		if ls.absent {
			return false, false, called, nil
		}
		mode, ok := ls.names[name]
		if !ok || i < len(parts)-1 && !mode.IsDir() {
			return false, false, called, nil
		}
		isDir = mode.IsDir()
	}
	return true, isDir, called, nil
}
