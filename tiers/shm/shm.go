// Package shm finds and maps the engine's shared offload regions
// (`/dev/shm/vllm_offload_<engine_id>.mmap`): files with no header holding
// rows × row_bytes, one block per row (DESIGN §2).
//
// `/dev/shm` is writable by every local user, so a file matching the glob is
// mapped only when it is a regular file owned by root or the engine's uid,
// opened without following links, and nothing mounted on a name under the
// glob is ever asked anything (Scan; DESIGN "Regions in /dev/shm"). A region is
// the file's identity (device, inode) and size: a file recreated under the
// same name is a new region. Every read of a mapping recovers from the fault
// a region truncated under it raises, and drops that region.
package shm

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvtierfs/kvtierfs/tiers/internal/beneath"
	"golang.org/x/sys/unix"
)

// DefaultGlob matches vLLM's shared offload regions.
const DefaultGlob = "/dev/shm/vllm_offload_*.mmap"

// Any local user can create files under the glob, as many as /dev/shm holds:
// what the Set reports and logs about the ones it ignores is bounded.
const (
	// MaxIgnoredListed bounds the ignored files Ignored lists (the first
	// by name); IgnoredNow counts them all.
	MaxIgnoredListed = 64
	// ignoredLogBurst lines about ignored files are logged per
	// ignoredLogPeriod; the rest are counted in one line per period.
	ignoredLogBurst  = 8
	ignoredLogPeriod = time.Minute
)

// FileID is a file's identity: a name recreated by the engine gets a new one.
type FileID struct {
	Dev, Ino uint64
}

// region is one mapped shm region.
type region struct {
	path string
	id   FileID
	size int64
	data []byte
	// file stays open while mapped: after a fault, Guard asks it (not the
	// path, which another user can swap) whether it shrank.
	file *os.File
	// faulted is set when a read of the mapping faulted (the file shrank):
	// the region is skipped from then on and dropped at the next Refresh.
	faulted atomic.Bool
}

// Info describes a region for stats: its geometry as inferred from the store's
// block size, and a warning when the two disagree.
type Info struct {
	Path     string
	Size     int64
	Rows     int64
	RowBytes int64
	Warning  string
}

// Ignored is a file matching the glob that is not mapped, and why.
type Ignored struct {
	Path   string
	Reason string
}

// Options tune a Set; the zero value is the default.
type Options struct {
	// EngineUID is the uid whose region files are mapped, besides root's;
	// nil means the daemon's own uid.
	EngineUID *uint32
	// Logger receives one line per region mapped, dropped or ignored; nil discards them.
	Logger *slog.Logger
}

// Set tracks the regions that match a glob, mapping new ones and dropping
// vanished, recreated or resized ones at each Refresh.
type Set struct {
	glob   string
	owners []uint32
	logger *slog.Logger

	// refreshMu serialises Refresh.
	refreshMu sync.Mutex
	// mu guards regions and ignored: Refresh writes, the row searches read.
	// A mapping is unmapped only under the write lock, so no reader holds it.
	mu      sync.RWMutex
	regions map[string]*region
	ignored map[string]Ignored

	// ignoredTotal counts files refused (each name and identity once);
	// faults counts regions dropped because a read of them faulted.
	ignoredTotal atomic.Int64
	faults       atomic.Int64

	// ignoredLog limits the lines about newly ignored files; Refresh
	// alone uses it.
	ignoredLog logLimit
	// scanned is the glob directory's state at the last full scan (zero
	// when it was not to be trusted), lastScan when that scan started and
	// scanCost how long it took (Refresh alone uses them).
	scanned  dirStamp
	lastScan time.Time
	scanCost time.Duration
}

const (
	// fullScanEvery bounds how long Refresh trusts an unchanged glob
	// directory and looks at its mapped regions only.
	fullScanEvery = 30 * time.Second
	// A full scan that took d, at least slowScan, is followed by the next
	// one no sooner than scanCostFactor·d later (and at most
	// fullScanEvery), so that full scans take at most a twentieth of a
	// core however many files match the glob and however often someone
	// changes its directory. A quick scan (a /dev/shm of tens of files
	// takes well under a millisecond) is never held back.
	scanCostFactor = 20
	slowScan       = 10 * time.Millisecond
)

// dirStamp is what changes in a directory's status when a name in it is
// created, removed or renamed.
type dirStamp struct {
	ino          uint64
	mtime, ctime unix.Timespec
}

// globDirStamp is the state of the glob's directory; ok is false when the
// directory part of the glob has wildcards or cannot be read.
func (s *Set) globDirStamp() (dirStamp, bool) {
	dir := filepath.Dir(s.glob)
	if strings.ContainsAny(dir, `*?[\`) {
		return dirStamp{}, false
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return dirStamp{}, false
	}
	return dirStamp{ino: st.Ino, mtime: st.Mtim, ctime: st.Ctim}, true
}

// fullScanDue tells whether Refresh must examine every name the glob
// matches: a name in its directory changed since the last full scan (or
// fullScanEvery passed), and the cost bound allows it, or a mapped region is
// no longer its file, of its size. Any local user can put thousands of files
// under the glob; this keeps a Refresh from examining each of them every
// second.
func (s *Set) fullScanDue(stamp dirStamp, ok bool) bool {
	since := time.Since(s.lastScan)
	if (s.scanCost < slowScan || since >= min(scanCostFactor*s.scanCost, fullScanEvery)) &&
		(!ok || stamp == (dirStamp{}) || stamp != s.scanned || since >= fullScanEvery) {
		return true
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	for p, r := range s.regions {
		// A mount point put on the name has another device: a change.
		st, err := statNoWait(unix.AT_FDCWD, p)
		if r.faulted.Load() || err != nil || (FileID{Dev: unix.Mkdev(st.Dev_major, st.Dev_minor), Ino: st.Ino}) != r.id || int64(st.Size) != r.size {
			return true
		}
	}
	return false
}

// logLimit allows ignoredLogBurst lines per ignoredLogPeriod and counts the
// lines it refused.
type logLimit struct {
	start      time.Time
	used       int
	suppressed int
}

// roll starts a new period once the current one is over and returns how
// many lines the one that ended refused.
func (l *logLimit) roll(now time.Time) int {
	if now.Sub(l.start) < ignoredLogPeriod {
		return 0
	}
	n := l.suppressed
	l.start, l.used, l.suppressed = now, 0, 0
	return n
}

// allow tells whether one more line may be logged in this period.
func (l *logLimit) allow() bool {
	if l.used < ignoredLogBurst {
		l.used++
		return true
	}
	l.suppressed++
	return false
}

// NewSet returns a Set for the glob with default Options; call Refresh to map the regions.
func NewSet(glob string) (*Set, error) { return NewSetWith(glob, Options{}) }

// NewSetWith returns a Set for the glob; call Refresh to map the regions.
func NewSetWith(glob string, opts Options) (*Set, error) {
	if _, _, err := splitGlob(glob); err != nil {
		return nil, err
	}
	engine := uint32(os.Getuid())
	if opts.EngineUID != nil {
		engine = *opts.EngineUID
	}
	owners := RegionOwners(engine)
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Set{glob: glob, owners: owners, logger: logger,
		regions: make(map[string]*region), ignored: make(map[string]Ignored)}, nil
}

// RegionOwners lists the uids whose files under the glob are the engine's
// regions: root's and the engine's (DESIGN "Regions in /dev/shm"). The Set
// maps those alone, and gc-regions removes no other orphan.
func RegionOwners(engine uint32) []uint32 {
	if engine == 0 {
		return []uint32{0}
	}
	return []uint32{0, engine}
}

// Owners lists the uids whose region files the Set maps.
func (s *Set) Owners() []uint32 { return append([]uint32(nil), s.owners...) }

// OpenFile opens a region file without following a link in its last
// component, without crossing a mount point on it (a FUSE server that never
// answers, scan.go) and without blocking (a FIFO planted under the glob),
// and checks on the descriptor that it is a regular file owned by one of
// owners (any owner when none are given). flag is O_RDONLY or O_RDWR.
// size is the file's size at the check.
func OpenFile(path string, flag int, owners ...uint32) (f *os.File, id FileID, size int64, err error) {
	dirPath, name := filepath.Split(path)
	if dirPath == "" {
		dirPath = "."
	}
	dir, err := unix.Open(dirPath, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, FileID{}, 0, &os.PathError{Op: "open", Path: dirPath, Err: err}
	}
	fd, err := beneath.Open(dir, name, flag|unix.O_NONBLOCK, 0)
	unix.Close(dir)
	switch {
	case err == unix.ELOOP:
		return nil, FileID{}, 0, &RefusedError{Path: path, Reason: reasonLink}
	case err == unix.EXDEV:
		return nil, FileID{}, 0, &RefusedError{Path: path, Reason: reasonMountPoint}
	case err != nil:
		return nil, FileID{}, 0, &os.PathError{Op: "open", Path: path, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, FileID{}, 0, &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	reason := typeRefusal(st.Mode)
	if reason == "" {
		reason = ownerRefusal(st.Uid, owners)
	}
	if reason != "" {
		unix.Close(fd)
		return nil, FileID{}, 0, &RefusedError{Path: path, Reason: reason}
	}
	return os.NewFile(uintptr(fd), path), FileID{Dev: st.Dev, Ino: st.Ino}, st.Size, nil
}

// RefusedError is a file under the glob that is not a region the daemon may use.
type RefusedError struct {
	Path, Reason string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("shm file %s refused: %s", e.Path, e.Reason)
}

// typeRefusal says why a file of this mode is not a region (a link, not a
// regular file); "" when it may be one.
func typeRefusal(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return ""
	case unix.S_IFLNK:
		return reasonLink
	default:
		return reasonNotRegular
	}
}

// ownerRefusal says why a file owned by uid is not a region: owned by none
// of owners (any owner passes when none are given); "" when it may be one.
func ownerRefusal(uid uint32, owners []uint32) string {
	if len(owners) == 0 || slices.Contains(owners, uid) {
		return ""
	}
	return fmt.Sprintf("owned by uid %d, not by one of %v (root, the engine)", uid, owners)
}

// Refresh maps regions that appeared and unmaps those that vanished, were
// recreated, changed size or faulted; files that are links, not regular or
// not owned by root or the engine's uid are ignored and counted.
func (s *Set) Refresh() error {
	s.refreshMu.Lock()
	defer s.refreshMu.Unlock()
	// Taken before the scan: a change during it makes the next one full.
	stamp, stamped := s.globDirStamp()
	if !s.fullScanDue(stamp, stamped) {
		return nil
	}
	start := time.Now()
	s.lastScan = start
	defer func() { s.scanCost = time.Since(start) }()
	// A directory changed within the last second may change again within
	// its timestamps' granularity (a clock tick) after the glob read it:
	// such a stamp is not trusted.
	s.scanned = dirStamp{}
	if stamped && start.Sub(time.Unix(stamp.mtime.Unix())) > time.Second && start.Sub(time.Unix(stamp.ctime.Unix())) > time.Second {
		s.scanned = stamp
	}
	entries, err := Scan(s.glob)
	if err != nil {
		return err
	}
	current := make(map[string]candidate, len(entries))
	for _, e := range entries {
		current[e.Path] = s.examine(e)
	}
	if n := s.ignoredLog.roll(time.Now()); n > 0 {
		s.logger.Warn("more shm files matching the glob ignored, not logged one by one", "files", n, "ignored_now", len(s.ignored))
	}
	if !s.changed(current) {
		return nil
	}
	// Map outside the lock: readers go on with the old regions meanwhile.
	fresh := make(map[string]*region)
	var errs []error
	for p, c := range current {
		if c.reason != "" || s.mapped(p, c.id, c.size) {
			continue
		}
		r, err := s.mapRegion(p)
		var refused *RefusedError
		switch {
		case errors.As(err, &refused):
			current[p] = candidate{reason: refused.Reason}
		case os.IsNotExist(err):
			delete(current, p)
		case err != nil:
			errs = append(errs, err)
		default:
			fresh[p] = r
		}
	}
	s.mu.Lock()
	var stale []*region
	for p, r := range s.regions {
		c, ok := current[p]
		if ok && c.reason == "" && fresh[p] == nil && r.id == c.id && r.size == c.size && !r.faulted.Load() {
			continue
		}
		stale = append(stale, r)
		delete(s.regions, p)
	}
	for p, r := range fresh {
		s.regions[p] = r
	}
	ignored := make(map[string]Ignored)
	for p, c := range current {
		if c.reason == "" {
			continue
		}
		ignored[p] = Ignored{Path: p, Reason: c.reason}
		if old, seen := s.ignored[p]; !seen || old.Reason != c.reason {
			s.ignoredTotal.Add(1)
			if s.ignoredLog.allow() {
				s.logger.Warn("shm file matching the glob ignored", "path", p, "reason", c.reason)
			}
		}
	}
	s.ignored = ignored
	for _, r := range stale {
		r.unmap()
	}
	s.mu.Unlock()
	for _, r := range stale {
		s.logger.Info("shm region dropped", "path", r.path, "size", r.size, "faulted", r.faulted.Load())
	}
	for _, r := range fresh {
		s.logger.Info("shm region mapped", "path", r.path, "size", r.size)
	}
	if len(errs) > 0 {
		s.scanned = dirStamp{}
		return fmt.Errorf("mapping shm regions: %v", errs)
	}
	return nil
}

// candidate is what Refresh saw at a path: its identity and size, or why it is ignored.
type candidate struct {
	id     FileID
	size   int64
	reason string
}

// examine is what Refresh makes of an entry Scan listed.
func (s *Set) examine(e Entry) candidate {
	if e.Reason != "" {
		return candidate{reason: e.Reason}
	}
	if reason := ownerRefusal(e.UID, s.owners); reason != "" {
		return candidate{reason: reason}
	}
	return candidate{id: e.ID, size: e.Size}
}

// mapped reports whether the region at p is mapped with this identity and size.
func (s *Set) mapped(p string, id FileID, size int64) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	r, ok := s.regions[p]
	return ok && r.id == id && r.size == size && !r.faulted.Load()
}

// changed reports whether what the glob matches differs from the mapped
// regions, so that a Refresh with nothing to do never blocks readers.
func (s *Set) changed(current map[string]candidate) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	usable := 0
	for p, c := range current {
		if c.reason != "" {
			if s.ignored[p].Reason != c.reason {
				return true
			}
			continue
		}
		usable++
		r, ok := s.regions[p]
		if !ok || r.id != c.id || r.size != c.size || r.faulted.Load() {
			return true
		}
	}
	return usable != len(s.regions) || len(current)-usable != len(s.ignored)
}

// mapRegion opens and maps a region file read-only; the file is checked
// again on its descriptor, as it may have changed since examine.
func (s *Set) mapRegion(p string) (*region, error) {
	f, id, size, err := OpenFile(p, unix.O_RDONLY, s.owners...)
	if err != nil {
		return nil, err
	}
	r := &region{path: p, id: id, size: size}
	if r.size == 0 {
		f.Close()
		return r, nil
	}
	if r.data, err = unix.Mmap(int(f.Fd()), 0, int(r.size), unix.PROT_READ, unix.MAP_SHARED); err != nil {
		f.Close()
		return nil, fmt.Errorf("mmap %s: %w", p, err)
	}
	r.file = f
	return r, nil
}

// unmap releases the mapping and its file; the caller holds the Set's write lock.
func (r *region) unmap() {
	if r.data != nil {
		unix.Munmap(r.data)
		r.data = nil
	}
	if r.file != nil {
		r.file.Close()
		r.file = nil
	}
}

// ErrFault is returned by Guard when the mapping it protected faulted.
var ErrFault = errors.New("mapping faulted: its file shrank under it")

// Guard runs fn, which reads or writes the first mapped bytes of file, a
// file other users can truncate (a region in /dev/shm), and turns the fault
// such an access raises into ErrFault instead of SIGBUS ending the daemon.
// fn must not leave locks or state half-changed when it stops at any byte.
//
// A fault is told from a bug by its cause, not its address: a runtime error
// is ErrFault only when file is now shorter than the mapping. The address
// cannot be relied on: qemu-user delivers the SIGBUS of a truncated mapping
// with address 0, which the Go runtime then reports as a nil dereference.
// Any other panic, or a runtime error while the file still covers the
// mapping, goes on.
func Guard(file *os.File, mapped int64, fn func()) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		v := recover()
		if v == nil {
			return
		}
		if _, runtimeError := v.(runtime.Error); !runtimeError || !shrank(file, mapped) {
			panic(v)
		}
		err = fmt.Errorf("%w (%v)", ErrFault, v)
	}()
	fn()
	return nil
}

// shrank reports whether file now holds fewer than mapped bytes.
func shrank(file *os.File, mapped int64) bool {
	var st unix.Stat_t
	return unix.Fstat(int(file.Fd()), &st) == nil && st.Size < mapped
}

// guard runs fn over the region's mapping through Guard; after a fault the
// region is marked faulted, skipped from then on and dropped by the next
// Refresh, and guard returns false.
func (s *Set) guard(r *region, fn func()) bool {
	err := Guard(r.file, r.size, fn)
	if err == nil {
		return true
	}
	if !r.faulted.Swap(true) {
		s.faults.Add(1)
		s.logger.Warn("shm region shrank under its mapping: dropped", "path", r.path, "err", err)
	}
	return false
}

// FileOf returns the identity of the region file mapped for path; ok is
// false when none is (never mapped, refused, or faulted). A mapping of the
// same path made elsewhere (row mirroring) whose identity differs is of an
// older file the engine has replaced, and can be unmapped.
func (s *Set) FileOf(path string) (FileID, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	r, ok := s.regions[path]
	if !ok || r.faulted.Load() {
		return FileID{}, false
	}
	return r.id, true
}

// Ignored lists the files matching the glob that are not mapped now, and
// why: the first MaxIgnoredListed by name.
func (s *Set) Ignored() []Ignored {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]Ignored, 0, len(s.ignored))
	for _, ig := range s.ignored {
		out = append(out, ig)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return slices.Clone(out[:min(len(out), MaxIgnoredListed)])
}

// IgnoredNow counts the files matching the glob that are not mapped now.
func (s *Set) IgnoredNow() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.ignored)
}

// IgnoredTotal counts the files refused since the Set was made (a file is
// counted once while it stays refused for the same reason).
func (s *Set) IgnoredTotal() int64 { return s.ignoredTotal.Load() }

// Faults counts the regions dropped because they shrank under their mapping.
func (s *Set) Faults() int64 { return s.faults.Load() }

// Infos describes every region, inferring its row size from the block sizes
// found in the store (rowSizes); a region no block size divides is refused
// with a warning.
func (s *Set) Infos(rowSizes []int64) []Info {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]Info, 0, len(s.regions))
	for _, r := range s.regions {
		out = append(out, describe(r, rowSizes))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

// describe infers one region's geometry.
func describe(r *region, rowSizes []int64) Info {
	info := Info{Path: r.path, Size: r.size}
	if len(rowSizes) == 0 {
		info.Warning = "row size unknown until the engine stores a block"
		return info
	}
	for _, rb := range rowSizes {
		if rb > 0 && r.size > 0 && r.size%rb == 0 {
			info.RowBytes, info.Rows = rb, r.size/rb
			return info
		}
	}
	info.Warning = fmt.Sprintf("region of %d bytes is not a multiple of the block size %v: the engine and the store disagree on the row geometry; this region is not used", r.size, rowSizes)
	return info
}

// Close unmaps every region.
func (s *Set) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for p, r := range s.regions {
		r.unmap()
		delete(s.regions, p)
	}
}
