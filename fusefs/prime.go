package fusefs

import (
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// primeThreads is how many threads look names up through the mount at once
// while priming: each lookup is a round trip to the daemon.
const primeThreads = 4

// primeInterval is how often every tier is primed again, so that entries
// past their lifetime (DirTimeout) are looked up before the engine needs them.
const primeInterval = DirTimeout / 2

// primer keeps the kernel's dentry cache holding the layout's directory
// levels (DESIGN "Lookups and the kernel's caches"): for every tier, all
// 4,096 names of the prefix level, absent or present, and every group
// directory that exists. It looks them up through the mount itself, so that
// the engine's lookups of absent keys end in the kernel's cache instead of a
// round trip each. It primes every tier after the mount, a tier the engine
// creates, a tier whose inode the kernel forgot (its entries went with it),
// and every tier each primeInterval. Its own lookups are not counted as the
// engine's (isPrimer).
type primer struct {
	fsys *FS

	mu      sync.Mutex
	pending map[string]bool
	wake    chan struct{}
	stop    chan struct{}
	stopped chan struct{}
	once    sync.Once
	// threads are the kernel thread ids of the lookups being made.
	threads sync.Map
	// names counts the names looked up through the mount since the mount.
	names atomic.Int64
}

func newPrimer(f *FS) *primer {
	return &primer{fsys: f, pending: map[string]bool{}, wake: make(chan struct{}, 1),
		stop: make(chan struct{}), stopped: make(chan struct{})}
}

// start primes every tier now and each primeInterval, until close.
func (p *primer) start() {
	p.scheduleAll()
	go p.run()
}

// close stops priming and waits for the lookups in flight.
func (p *primer) close() {
	p.once.Do(func() { close(p.stop) })
	<-p.stopped
}

// schedule asks for a tier to be primed.
func (p *primer) schedule(tier string) {
	p.mu.Lock()
	p.pending[tier] = true
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// scheduleAll asks for every tier directory of the store to be primed.
func (p *primer) scheduleAll() {
	entries, err := os.ReadDir(p.fsys.store.Root())
	if err != nil {
		return
	}
	for _, de := range entries {
		if de.IsDir() {
			p.schedule(de.Name())
		}
	}
}

// primeSettle is how long after the kernel forgot a tier's directory it is
// primed again: the kernel forgets while it reclaims its caches, and entries
// made before the reclaim ends would go with them.
const primeSettle = 50 * time.Millisecond

// forgotten asks for a tier whose directory the kernel forgot to be primed
// once the reclaim is over.
func (p *primer) forgotten(tier string) {
	time.AfterFunc(primeSettle, func() { p.schedule(tier) })
}

// isPrimer reports whether a request comes from the primer's lookups.
func (p *primer) isPrimer(thread uint32) bool {
	_, ok := p.threads.Load(thread)
	return ok
}

func (p *primer) run() {
	defer close(p.stopped)
	tick := time.NewTicker(primeInterval)
	defer tick.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-tick.C:
			p.scheduleAll()
		case <-p.wake:
		}
		p.mu.Lock()
		tiers := p.pending
		p.pending = map[string]bool{}
		p.mu.Unlock()
		for tier := range tiers {
			p.prime(tier)
		}
	}
}

// primeRetry is how long a tier the kernel does not see yet waits before it
// is primed again: the engine's mkdir of it has not returned, and until it
// does every name below it answers absent without a lookup.
const primeRetry = 20 * time.Millisecond

// prime looks up a tier's prefix-level names, then its group directories,
// through the mount.
func (p *primer) prime(tier string) {
	base := filepath.Join(p.fsys.mountpoint, tier)
	if err := unix.Faccessat(unix.AT_FDCWD, base, unix.F_OK, 0); err != nil {
		var st unix.Stat_t
		if unix.Lstat(filepath.Join(p.fsys.store.Root(), tier), &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			time.AfterFunc(primeRetry, func() { p.schedule(tier) })
		}
		return
	}
	names := make([]string, 0, prefixNames)
	for i := range prefixNames {
		names = append(names, prefixName(i))
	}
	p.lookUp(base, names)
	groups := p.fsys.index.groupDirs(tier)
	for i, rel := range groups {
		groups[i] = rel[len(tier)+1:]
	}
	p.lookUp(base, groups)
}

// lookUp looks names up under dir on primeThreads threads; it gives up early
// when the primer stops or the tier directory cannot be reached.
func (p *primer) lookUp(dir string, names []string) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range primeThreads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			tid := uint32(unix.Gettid())
			p.threads.Store(tid, true)
			defer p.threads.Delete(tid)
			for {
				i := int(next.Add(1)) - 1
				if i >= len(names) {
					return
				}
				select {
				case <-p.stop:
					return
				default:
				}
				err := unix.Faccessat(unix.AT_FDCWD, filepath.Join(dir, names[i]), unix.F_OK, 0)
				if err != nil && err != unix.ENOENT {
					p.fsys.logger.Debug("priming the kernel's lookup cache", "dir", dir, "err", err)
					next.Store(int64(len(names)))
					return
				}
				p.names.Add(1)
			}
		}()
	}
	wg.Wait()
}
