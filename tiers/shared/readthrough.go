package shared

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"path"
	"sync"
	"syscall"
	"time"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// readThrough caches the shared store's answers and coalesces fetches.
type readThrough struct {
	mu sync.Mutex
	// answers are lookup answers with when they were given (bounded by maxCached).
	answers map[string]answer
	// recent are keys looked up, fetched or written lately, which the evictor spares.
	recent map[string]time.Time
	// fetching are the fetches in flight, which a second fetch of the same block waits for.
	fetching map[string]*fetchCall
	// listings are the layout's directories as last listed, listedNames
	// their names in all (bounded by maxCached); listing are the listings in
	// flight (listing.go).
	listings    map[string]listing
	listedNames int
	listing     map[string]*listCall
}

type answer struct {
	present bool
	isDir   bool
	size    int64
	at      time.Time
}

type fetchCall struct {
	done chan struct{}
	err  error
}

func (r *readThrough) init() {
	r.answers = make(map[string]answer)
	r.recent = make(map[string]time.Time)
	r.fetching = make(map[string]*fetchCall)
	r.listings = make(map[string]listing)
	r.listing = make(map[string]*listCall)
}

// remember caches an answer; a full cache forgets half of its answers first.
func (r *readThrough) remember(rel string, present bool, now time.Time) {
	r.rememberEntry(rel, answer{present: present, at: now})
}

func (r *readThrough) rememberEntry(rel string, a answer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.answers) >= maxCached {
		for k := range r.answers {
			if len(r.answers) < maxCached/2 {
				break
			}
			delete(r.answers, k)
		}
	}
	r.answers[rel] = a
}

// cached returns a fresh cached answer.
func (l *Level) cached(rel string, now time.Time) (answer, bool) {
	r := &l.reads
	r.mu.Lock()
	defer r.mu.Unlock()
	a, ok := r.answers[rel]
	if !ok {
		return a, false
	}
	ttl := l.cfg.NegativeTTL
	if a.present {
		ttl = l.cfg.PositiveTTL
	}
	if now.Sub(a.at) >= ttl {
		delete(r.answers, rel)
		return a, false
	}
	return a, true
}

// noteRecent marks a key as used now, sparing it from the shared evictor.
func (l *Level) noteRecent(rel string) {
	r := &l.reads
	now := l.cfg.Clock.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.recent) >= maxRecent {
		for k, at := range r.recent {
			if now.Sub(at) >= l.cfg.Protect || len(r.recent) > maxRecent*3/4 {
				delete(r.recent, k)
			}
		}
	}
	r.recent[rel] = now
}

// Lookup answers whether the shared store holds a block (or, for a path of
// the layout's directories, that directory), for a key missing locally.
// Answers are cached (absent ones for NegativeTTL, through the listings of
// the layout's directories: listing.go); while the store is unreachable
// every lookup answers absent at once.
func (l *Level) Lookup(rel string) bool {
	kind, name := block.Parse(rel)
	isBlock := kind == block.File
	if isBlock {
		l.c.lookups.Add(1)
	}
	if !l.Reachable() {
		return false
	}
	now := l.cfg.Clock.Now()
	if a, ok := l.cached(rel, now); ok {
		if isBlock && a.present {
			l.c.lookupHits.Add(1)
			l.noteRecent(rel)
		} else if isBlock {
			l.c.negativeHits.Add(1)
		}
		return a.present && a.isDir != isBlock
	}
	// The names journal answers from memory (journal.go); where it cannot,
	// the listings of rel's directories answer most cold keys absent, and a
	// name they hold is stat'ed for its size and type.
	if present, size, ok := l.fromJournal(rel, isBlock, now); ok {
		switch {
		case present:
			l.reads.rememberEntry(rel, answer{present: true, isDir: !isBlock, size: size, at: now})
			if isBlock {
				l.c.lookupHits.Add(1)
				l.noteRecent(rel)
			}
		case isBlock:
			l.c.negativeHits.Add(1)
		}
		return present
	}
	l.c.journalFallbacks.Add(1)
	listed, listedDir, called, err := l.fromListings(rel, now)
	switch {
	case err == nil && !listed:
		if isBlock && !called {
			l.c.negativeHits.Add(1)
		}
		return false
	case err == nil && listedDir:
		l.reads.rememberEntry(rel, answer{present: true, isDir: true, at: now})
		return !isBlock
	case err != nil && !errors.Is(err, errListingTooLarge):
		// Unreachable or failing: absent, and not cached (the store may be back soon).
		return false
	}
	// A block answers present only with a record the key authenticates,
	// of its size: nobody without the key makes a replica answer present.
	info, err := call(l.bound, func() (FileInfo, error) {
		info, err := l.dir.Stat(rel)
		if err != nil || !isBlock || !info.IsFile {
			return info, err
		}
		sealed, ok, err := l.readRecord(rel)
		if err != nil || !ok {
			return FileInfo{}, err
		}
		if d, _, err := l.openRecord(rel, name, sealed); err != nil || d.Size != info.Size {
			return FileInfo{}, nil
		}
		return info, nil
	})
	switch {
	case err == nil:
	case errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ENOTDIR) || errors.Is(err, syscall.ELOOP):
		l.reads.remember(rel, false, now)
		return false
	default:
		// Unreachable or failing: absent, and not cached (the store may be back soon).
		return false
	}
	present := info.IsDir != isBlock && (info.IsDir || info.IsFile)
	l.reads.rememberEntry(rel, answer{present: present, isDir: info.IsDir, size: info.Size, at: now})
	if isBlock && present {
		l.c.lookupHits.Add(1)
		l.noteRecent(rel)
	}
	return present
}

// Size is the size of a block the shared store was last found holding.
func (l *Level) Size(rel string) (int64, bool) {
	a, ok := l.cached(rel, l.cfg.Clock.Now())
	return a.size, ok && a.present && !a.isDir
}

// Fetch reads a block from the shared store, checks it against its digest
// record and publishes it in the local store. A block the shared store does
// not hold (or no longer: removed by another node mid-read) is ENOENT; so is
// one that fails its digest, which is removed from the shared store if the
// bytes read are still what its name holds. It returns the verified bytes,
// which the caller owns (a load serves them without reading the store
// again). Concurrent fetches of one block share one read: the others get
// nil bytes and read the store.
func (l *Level) Fetch(rel string) ([]byte, error) {
	kind, name := block.Parse(rel)
	if kind != block.File {
		return nil, syscall.EINVAL
	}
	r := &l.reads
	r.mu.Lock()
	if c := r.fetching[rel]; c != nil {
		r.mu.Unlock()
		<-c.done
		return nil, c.err
	}
	c := &fetchCall{done: make(chan struct{})}
	r.fetching[rel] = c
	r.mu.Unlock()
	data, err := l.fetch(rel, name)
	c.err = err
	r.mu.Lock()
	delete(r.fetching, rel)
	r.mu.Unlock()
	close(c.done)
	return data, err
}

func (l *Level) fetch(rel string, name block.Name) ([]byte, error) {
	if !l.Reachable() {
		return nil, fmt.Errorf("fetch %s: %w (%w)", rel, syscall.ENOENT, ErrUnreachable)
	}
	start := l.cfg.Clock.Now()
	// One bounded call reads, verifies, and then touches the block (the
	// evictor reads the modification time as its last use) or drops it. Its
	// bound applies to progress: each chunk read starts it again, so a large
	// block on a slow but answering store is fetched whole, and the open
	// waiting for it waits at most one bound past the last chunk.
	type read struct {
		data      []byte
		hasRecord bool
		// unproven is a record the key does not authenticate; corrupt is a
		// block whose bytes fail their authenticated record.
		unproven, corrupt error
		dropped           bool
	}
	got, err := callProgressing(l.bound, func(progress func()) (r read, err error) {
		before, err := l.dir.Stat(rel)
		if err != nil {
			return r, err
		}
		// The record comes first: it tells the only size the block may have.
		sealed, hasRecord, err := l.readRecord(rel)
		if r.hasRecord = hasRecord; err != nil || !hasRecord {
			return r, err
		}
		// A record that does not verify under the key is refused and left
		// alone: a replica holding another key must not remove our blocks.
		d, want, err := l.openRecord(rel, name, sealed)
		if r.unproven = err; err != nil {
			return r, nil
		}
		// The digests are computed as the chunks arrive, while they are in cache.
		var crc uint32
		sum := sha256.New()
		r.data, err = l.dir.ReadBlock(rel, d.Size, func(chunk []byte) {
			crc = block.UpdateCRC32C(crc, chunk)
			sum.Write(chunk)
			progress()
		})
		switch {
		case errors.Is(err, errWrongSize) || errors.Is(err, errNotRegular):
			r.corrupt = err
		case err != nil:
			return r, err
		default:
			r.corrupt = verify(d, int64(len(r.data)), crc, sum.Sum(nil), want)
		}
		if r.corrupt == nil {
			l.dir.Touch(rel, l.cfg.Clock.Now())
			return r, nil
		}
		r.data = nil
		// Removed only if the name still holds the file read: another node
		// may have replaced it meanwhile.
		if now, err := l.dir.Stat(rel); err != nil || !now.sameFile(before) {
			return r, nil
		}
		if err := l.dir.Remove(rel); err != nil {
			return r, nil
		}
		l.dir.Remove(rel + sidecarSuffix)
		l.journalRemove(rel)
		r.dropped = true
		return r, nil
	})
	switch {
	case errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ESTALE):
		l.reads.remember(rel, false, start)
		l.journalForget(rel)
		return nil, fmt.Errorf("fetch %s: gone from the shared store: %w", rel, syscall.ENOENT)
	case err != nil:
		return nil, fmt.Errorf("fetch %s: %v: %w", rel, err, syscall.ENOENT)
	case !got.hasRecord:
		// Not written by a kvtierfs (an engine writing straight to the
		// shared directory): nothing proves its bytes; leave it there.
		l.reads.remember(rel, false, start)
		l.journalForget(rel)
		return nil, fmt.Errorf("fetch %s: no digest record: %w", rel, syscall.ENOENT)
	case got.unproven != nil:
		l.reads.remember(rel, false, start)
		l.journalForget(rel)
		l.cfg.Logger.Warn("block in the shared store not authenticated by the shared key: refused", "path", path.Join(l.cfg.Dir, rel), "reason", got.unproven)
		return nil, fmt.Errorf("fetch %s: %v: %w", rel, got.unproven, syscall.ENOENT)
	case got.corrupt != nil:
		l.reads.remember(rel, false, start)
		l.journalForget(rel)
		if got.dropped {
			l.c.corruptDropped.Add(1)
		}
		l.cfg.Logger.Error("corrupt block in the shared store refused", "path", path.Join(l.cfg.Dir, rel),
			"reason", got.corrupt, "removed", got.dropped)
		return nil, fmt.Errorf("fetch %s: %v: %w", rel, got.corrupt, syscall.ENOENT)
	}
	if err := l.cfg.Local.Import(rel, got.data); err != nil {
		// No room here (every local block protected): a miss, not an error.
		l.cfg.Logger.Warn("block fetched from the shared store could not be kept locally", "path", rel, "err", err)
		return nil, fmt.Errorf("fetch %s: keeping it locally: %v: %w", rel, err, syscall.ENOENT)
	}
	l.noteRecent(rel)
	l.wb.markAdmitted(rel)
	l.c.fetched.Add(1)
	l.c.fetchedBytes.Add(int64(len(got.data)))
	l.c.fetchNanos.Add(int64(l.cfg.Clock.Now().Sub(start)))
	return got.data, nil
}
