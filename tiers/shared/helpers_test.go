package shared

import (
	"crypto/sha256"
	"path/filepath"

	"bytes"
	"fmt"
	"golang.org/x/sys/unix"
	"io/fs"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// fakeClock is a clock moved by hand; After fires once Advance passes its deadline.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	waiters []waiter
}

type waiter struct {
	at time.Time
	c  chan time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Unix(1_800_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	if d <= 0 {
		ch <- c.now
		return ch
	}
	c.waiters = append(c.waiters, waiter{at: c.now.Add(d), c: ch})
	return ch
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	kept := c.waiters[:0]
	for _, w := range c.waiters {
		if !w.at.After(c.now) {
			w.c <- c.now
		} else {
			kept = append(kept, w)
		}
	}
	c.waiters = kept
}

// fakeLocal is a local store in memory.
type fakeLocal struct {
	mu     sync.Mutex
	blocks map[string][]byte
}

func newFakeLocal() *fakeLocal { return &fakeLocal{blocks: map[string][]byte{}} }

func (f *fakeLocal) ReadBlock(rel string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.blocks[rel]
	if !ok {
		return nil, syscall.ENOENT
	}
	return bytes.Clone(b), nil
}

func (f *fakeLocal) RecycleBlock([]byte) {}

func (f *fakeLocal) Import(rel string, data []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.blocks[rel] = bytes.Clone(data)
	return nil
}

func (f *fakeLocal) put(rel string, data []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.blocks[rel] = data
}

func (f *fakeLocal) get(rel string) ([]byte, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.blocks[rel]
	return b, ok
}

// noXattrs is a directory whose filesystem refuses xattrs.
type noXattrs struct{ Dir }

func (noXattrs) GetXattr(string, string) ([]byte, error) { return nil, syscall.ENOTSUP }
func (noXattrs) SetXattr(string, string, []byte) error   { return syscall.ENOTSUP }

// hangingDir blocks every call while hung, as a FUSE client whose server vanished.
type hangingDir struct {
	Dir
	mu   sync.Mutex
	gate chan struct{} // closed while the directory answers
}

func newHangingDir(d Dir) *hangingDir {
	h := &hangingDir{Dir: d, gate: make(chan struct{})}
	close(h.gate)
	return h
}

func (h *hangingDir) hang() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.gate = make(chan struct{})
}

func (h *hangingDir) resume() {
	h.mu.Lock()
	defer h.mu.Unlock()
	close(h.gate)
}

func (h *hangingDir) wait() {
	h.mu.Lock()
	g := h.gate
	h.mu.Unlock()
	<-g
}

func (h *hangingDir) Stat(rel string) (FileInfo, error) { h.wait(); return h.Dir.Stat(rel) }
func (h *hangingDir) ReadFile(rel string, limit int64) ([]byte, error) {
	h.wait()
	return h.Dir.ReadFile(rel, limit)
}
func (h *hangingDir) ReadBlock(rel string, size int64, chunk func([]byte)) ([]byte, error) {
	h.wait()
	return h.Dir.ReadBlock(rel, size, chunk)
}
func (h *hangingDir) WriteFile(rel string, data []byte) error {
	h.wait()
	return h.Dir.WriteFile(rel, data)
}
func (h *hangingDir) Rename(a, b string) error { h.wait(); return h.Dir.Rename(a, b) }
func (h *hangingDir) Link(a, b string) error   { h.wait(); return h.Dir.Link(a, b) }
func (h *hangingDir) Remove(rel string) error  { h.wait(); return h.Dir.Remove(rel) }
func (h *hangingDir) MkdirAll(rel string) error {
	h.wait()
	return h.Dir.MkdirAll(rel)
}
func (h *hangingDir) ReadDir(rel string, limit int, keep func(string) bool) ([]fs.DirEntry, error) {
	h.wait()
	return h.Dir.ReadDir(rel, limit, keep)
}
func (h *hangingDir) Touch(rel string, t time.Time) error { h.wait(); return h.Dir.Touch(rel, t) }
func (h *hangingDir) GetXattr(rel, n string) ([]byte, error) {
	h.wait()
	return h.Dir.GetXattr(rel, n)
}
func (h *hangingDir) SetXattr(rel, n string, v []byte) error {
	h.wait()
	return h.Dir.SetXattr(rel, n, v)
}

// testKey is the shared key of the test levels.
var testKey = []byte("the replicas' shared test key")

// keyHolder is another replica holding key, as far as the files it signs
// in the shared directory go (log names and lines, leases).
func keyHolder(key []byte, holder string) *Level {
	l := &Level{cfg: Config{Key: key, Holder: holder, LeaseTTL: DefaultLeaseTTL, Clock: newFakeClock()}}
	l.journal.init()
	l.journal.own = namesDir + "/" + l.logName(holder)
	return l
}

// blockRel is the layout path of test block i.
func blockRel(i int) string {
	h := fmt.Sprintf("%032x", 0xabc000+i)
	return fmt.Sprintf("model/%s/%s_g0/%s.bin", h[:3], h[3:5], h)
}

// blockData is test block i's bytes: size bytes, a zero page in the middle.
func blockData(i, size int) []byte {
	b := make([]byte, size)
	for j := range b {
		b[j] = byte(i*7 + j%251 + 1)
	}
	if size >= 3*block.PageSize {
		clear(b[block.PageSize : 2*block.PageSize])
	}
	return b
}

// newTestLevel starts a level on a temp dir with a fake clock.
func newTestLevel(t *testing.T, dir Dir, root string, mod func(*Config)) (*Level, *fakeLocal, *fakeClock) {
	t.Helper()
	local := newFakeLocal()
	clock := newFakeClock()
	cfg := Config{Dir: root, FS: dir, Local: local, Clock: clock, Timeout: 200 * time.Millisecond,
		Rate: 1 << 30, Holder: "node-a", Key: testKey}
	if mod != nil {
		mod(&cfg)
	}
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l, local, clock
}

// eventually polls cond (state, not timing) for up to 10 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 1000 {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("never: %s", what)
}

// downDir fails every call with ENOTCONN while down, as a FUSE client of a
// distributed filesystem that lost its servers answers.
type downDir struct {
	Dir
	down atomic.Bool
}

func (d *downDir) err() error {
	if d.down.Load() {
		return syscall.ENOTCONN
	}
	return nil
}

func (d *downDir) Stat(rel string) (FileInfo, error) {
	if err := d.err(); err != nil {
		return FileInfo{}, err
	}
	return d.Dir.Stat(rel)
}

func (d *downDir) WriteFile(rel string, data []byte) error {
	if err := d.err(); err != nil {
		return err
	}
	return d.Dir.WriteFile(rel, data)
}

func (d *downDir) MkdirAll(rel string) error {
	if err := d.err(); err != nil {
		return err
	}
	return d.Dir.MkdirAll(rel)
}

// sealedRecordOf is the sealed record l writes for data at rel.
func (l *Level) sealedRecordOf(t *testing.T, rel string, data []byte) []byte {
	t.Helper()
	_, name := block.Parse(rel)
	rec, err := block.DigestOf(data).MarshalRecord(name.Binding())
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	return l.sealRecord(rel, rec, sum[:])
}

// setSealed sets a sealed record on the shared file at rel.
func setSealed(t *testing.T, root, rel string, sealed []byte) {
	t.Helper()
	if err := unix.Setxattr(filepath.Join(root, rel), recordXattr, sealed, 0); err != nil {
		t.Fatal(err)
	}
}
