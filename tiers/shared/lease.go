package shared

import (
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// leaseFile is the eviction lease: "<holder> <expiry, Unix ns> <tag>", the
// tag authenticating the rest (auth.go). It is taken by linking a complete
// tmp file to its name (fails if it exists), renewed by its holder at a
// third of its lifetime, and taken over only once expired. A lease that is
// not a regular file of at most maxLeaseBytes, does not verify, or expires
// more than maxLeaseAhead lease lifetimes from now counts as expired.
const leaseFile = controlDir + "/evict.lease"

const (
	maxLeaseBytes = 512
	maxLeaseAhead = 2
)

// lease is this node's view of the eviction lease.
type lease struct {
	// op serialises this node's attempts to take or renew the lease.
	op sync.Mutex
	// mu guards the fields below.
	mu sync.Mutex
	// held is true while this node holds the lease, until expiry (its clock).
	held   bool
	expiry time.Time
	// content is the lease file as this node wrote it last.
	content []byte
	// seen is the holder the lease file named when last read.
	seen string
}

// parseLease reads a lease file's content, checking its tag and that it
// expires within maxLeaseAhead lifetimes of now.
func (l *Level) parseLease(b []byte, now time.Time) (holder string, expiry time.Time, err error) {
	fields := strings.Fields(string(b))
	if len(fields) != 3 {
		return "", time.Time{}, fmt.Errorf("lease %q: want holder, expiry and tag", b)
	}
	ns, err := strconv.ParseInt(fields[1], 10, 64)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("lease %q: %w", b, err)
	}
	if fields[2] != hex.EncodeToString(l.tag(domainLease, []byte(fields[0]), []byte(fields[1]))) {
		return "", time.Time{}, fmt.Errorf("lease of %q: %w", fields[0], errForged)
	}
	expiry = time.Unix(0, ns)
	if expiry.Sub(now) > maxLeaseAhead*l.cfg.LeaseTTL {
		return "", time.Time{}, fmt.Errorf("lease of %q expires at %s, more than %d lease lifetimes ahead", fields[0], expiry, maxLeaseAhead)
	}
	return fields[0], expiry, nil
}

// holding reports whether this node may evict now: it holds the lease and
// its expiry is not reached. A renewal that fails lets it lapse.
func (l *Level) holding() bool {
	l.lease.mu.Lock()
	defer l.lease.mu.Unlock()
	return l.lease.held && l.cfg.Clock.Now().Before(l.lease.expiry)
}

// leaseState is the holder last seen and whether this node holds it.
func (l *Level) leaseState() (string, bool) {
	held := l.holding()
	l.lease.mu.Lock()
	defer l.lease.mu.Unlock()
	return l.lease.seen, held
}

// setLease records what this node knows of the lease.
func (l *Level) setLease(held bool, expiry time.Time, seen string) {
	l.lease.mu.Lock()
	defer l.lease.mu.Unlock()
	l.lease.held, l.lease.expiry, l.lease.seen = held, expiry, seen
}

// readLease reads the lease file under the bound.
func (l *Level) readLease() (holder string, expiry time.Time, content []byte, err error) {
	content, err = call(l.bound, func() ([]byte, error) { return l.dir.ReadFile(leaseFile, maxLeaseBytes) })
	if err != nil {
		return "", time.Time{}, nil, err
	}
	holder, expiry, err = l.parseLease(content, l.cfg.Clock.Now())
	return holder, expiry, content, err
}

// tryLease takes, renews or observes the lease, and reports whether this
// node holds it afterwards. Every step reads the lease back, so that two
// nodes never both act as holder for longer than one renewal period.
func (l *Level) tryLease() bool {
	l.lease.op.Lock()
	defer l.lease.op.Unlock()
	now := l.cfg.Clock.Now()
	holder, expiry, content, err := l.readLease()
	switch {
	case errors.Is(err, syscall.ENOENT):
		return l.createLease(now)
	case errors.Is(err, syscall.ELOOP) || errors.Is(err, syscall.ENOTDIR):
		// A link or a file where the lease or its directory belongs: the
		// directory made real, the name is then taken over as expired.
		if err := l.bound.do(l.ensureControlDir); err != nil {
			l.setLease(false, time.Time{}, "")
			return false
		}
		holder, expiry = "", time.Time{}
	case errors.Is(err, errNotRegular) || errors.Is(err, errTooLarge) || content != nil && err != nil:
		// Not a lease file (a FIFO, a sparse terabyte) or not a lease of
		// ours (a hand edit, a forgery, a far-future expiry): expired.
		holder, expiry = "", time.Time{}
	case err != nil:
		// Unreachable, failing, or replaced while read (ESTALE on a
		// distributed filesystem): stop evicting; the expiry ends our claim.
		l.setLease(false, time.Time{}, "")
		return false
	}
	switch {
	case holder == l.cfg.Holder && now.Before(expiry):
		return l.renewLease(now, content)
	case now.Before(expiry):
		l.setLease(false, time.Time{}, holder)
		return false
	}
	// Expired: move it aside under a name of our own (only one node's rename
	// moves it), check that what moved is the expired lease, then race to
	// create a fresh one.
	aside := fmt.Sprintf("%s.expired-%s", leaseFile, l.unique())
	if err := l.bound.do(func() error { return l.dir.Rename(leaseFile, aside) }); err != nil {
		if errors.Is(err, syscall.ENOENT) {
			return l.createLease(now)
		}
		l.setLease(false, time.Time{}, holder)
		return false
	}
	moved, _ := call(l.bound, func() ([]byte, error) { return l.dir.ReadFile(aside, maxLeaseBytes) })
	if string(moved) != string(content) {
		// A live lease was created in between and moved by us: put it back.
		l.bound.do(func() error { return l.dir.Link(aside, leaseFile) })
		l.bound.do(func() error { return l.dir.Remove(aside) })
		l.setLease(false, time.Time{}, holder)
		return false
	}
	l.bound.do(func() error { return l.dir.Remove(aside) })
	return l.createLease(now)
}

// leaseContent is the lease file's content for this node until expiry.
func (l *Level) leaseContent(expiry time.Time) []byte {
	ns := strconv.FormatInt(expiry.UnixNano(), 10)
	return fmt.Appendf(nil, "%s %s %x\n", l.cfg.Holder, ns, l.tag(domainLease, []byte(l.cfg.Holder), []byte(ns)))
}

// createLease links a complete lease file into place (EEXIST if another node
// was first), then reads it back.
func (l *Level) createLease(now time.Time) bool {
	expiry := now.Add(l.cfg.LeaseTTL)
	content := l.leaseContent(expiry)
	tmp := fmt.Sprintf("%s.%s.tmp", leaseFile, l.unique())
	err := l.bound.do(func() error {
		if err := l.ensureControlDir(); err != nil {
			return err
		}
		if err := l.dir.WriteFile(tmp, content); err != nil {
			return err
		}
		defer l.dir.Remove(tmp)
		return l.dir.Link(tmp, leaseFile)
	})
	if err != nil {
		l.setLease(false, time.Time{}, "")
		return false
	}
	return l.confirmLease(content, expiry)
}

// renewLease replaces this node's lease with one expiring a lease lifetime from now.
func (l *Level) renewLease(now time.Time, current []byte) bool {
	expiry := now.Add(l.cfg.LeaseTTL)
	content := l.leaseContent(expiry)
	tmp := fmt.Sprintf("%s.%s.tmp", leaseFile, l.unique())
	err := l.bound.do(func() error {
		if err := l.dir.WriteFile(tmp, content); err != nil {
			return err
		}
		// Checked again just before the rename: a takeover since the read
		// above must not be overwritten.
		if got, err := l.dir.ReadFile(leaseFile, maxLeaseBytes); err != nil || string(got) != string(current) {
			l.dir.Remove(tmp)
			return errLeaseLost
		}
		return l.dir.Rename(tmp, leaseFile)
	})
	if err != nil {
		l.setLease(false, time.Time{}, "")
		return false
	}
	return l.confirmLease(content, expiry)
}

var errLeaseLost = errors.New("lease taken over")

// confirmLease reads the lease back and records whether it is ours.
func (l *Level) confirmLease(content []byte, expiry time.Time) bool {
	holder, _, got, err := l.readLease()
	if err != nil || string(got) != string(content) {
		l.setLease(false, time.Time{}, holder)
		return false
	}
	l.setLease(true, expiry, l.cfg.Holder)
	l.lease.mu.Lock()
	l.lease.content = content
	l.lease.mu.Unlock()
	return true
}

// leaseMine is the lease file's content while this node holds it.
func (l *Level) leaseMine() []byte {
	l.lease.mu.Lock()
	defer l.lease.mu.Unlock()
	return l.lease.content
}

// releaseLease removes this node's lease at Close, so another takes over at once.
func (l *Level) releaseLease() {
	if !l.holding() {
		return
	}
	l.lease.mu.Lock()
	mine := l.lease.content
	l.lease.held = false
	l.lease.mu.Unlock()
	l.bound.do(func() error {
		if got, err := l.dir.ReadFile(leaseFile, maxLeaseBytes); err != nil || string(got) != string(mine) {
			return err
		}
		return l.dir.Remove(leaseFile)
	})
}

// leaseLoop keeps the lease (at a third of its lifetime) and, while held,
// keeps the shared store within its capacity.
func (l *Level) leaseLoop() {
	defer l.wg.Done()
	var lastScan time.Time
	var lastTook time.Duration
	for {
		if l.cfg.Capacity == 0 {
			// Nothing to evict here: only tell who holds the lease.
			holder, _, _, _ := l.readLease()
			l.setLease(false, time.Time{}, holder)
		} else if l.tryLease() {
			if now := l.cfg.Clock.Now(); now.Sub(lastScan) >= max(l.cfg.ScanInterval, scanShare*lastTook) {
				lastScan = now
				l.evict()
				lastTook = l.cfg.Clock.Now().Sub(now)
			}
		}
		select {
		case <-l.stop:
			return
		case <-l.cfg.Clock.After(l.cfg.LeaseTTL / 3):
		}
	}
}
