package fusefs

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
	"github.com/kvtierfs/kvtierfs/staging/diagnose"
	"github.com/kvtierfs/kvtierfs/tiers/block"
	"github.com/kvtierfs/kvtierfs/tiers/disk"
)

// recordingDiagnoser records what the mount tells the diagnostics and
// answers one fixed warning.
type recordingDiagnoser struct {
	mu     sync.Mutex
	events []string
	state  diagnose.StoreState // as Warnings was last asked
}

func (r *recordingDiagnoser) note(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, fmt.Sprintf(format, args...))
}

func (r *recordingDiagnoser) Stored(key block.Ref, n int64) { r.note("stored %s %d", key.Rel, n) }
func (r *recordingDiagnoser) Read(key block.Ref, n int64)   { r.note("read %s %d", key.Rel, n) }
func (r *recordingDiagnoser) LookedUp(key block.Ref, present bool) {
	r.note("lookup %s %t", key.Rel, present)
}
func (r *recordingDiagnoser) MissedLookup(tier string, group int) {
	r.note("missed %s %d", tier, group)
}
func (r *recordingDiagnoser) Warnings(st diagnose.StoreState) []ctlabi.Warning {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.state = st
	return []ctlabi.Warning{{Code: "recorded", Message: "from the test's diagnoser"}}
}

func (r *recordingDiagnoser) seen() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

// mountInProcess mounts a new store in this process with opts (Store set
// here); cleanup unmounts it and closes the store.
func mountInProcess(t *testing.T, opts Options) (*FS, string) {
	t.Helper()
	mnt := t.TempDir()
	return mountInProcessAt(t, mnt, opts), mnt
}

// mountInProcessAt is mountInProcess at the mountpoint mnt.
func mountInProcessAt(t *testing.T, mnt string, opts Options) *FS {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipped: mounting FUSE in this process needs root")
	}
	store, err := disk.Open(disk.Config{Dir: t.TempDir(), Capacity: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	opts.Store = store
	f, err := Mount(mnt, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.ProbePoll(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.Unmount(); err != nil {
			t.Errorf("unmount: %v", err)
		}
	})
	return f
}

// TestImportedBlockIsFound imports a block into the store, as a fetch from
// the shared level does, making its directories without the mount: the
// lookup index learns them, so the block is found through the mount.
func TestImportedBlockIsFound(t *testing.T) {
	f, mnt := mountInProcess(t, Options{})
	const tier = "M_0123456789ab_r0"
	if err := os.Mkdir(filepath.Join(mnt, tier), 0o700); err != nil {
		t.Fatal(err)
	}
	h := strings.Repeat("cd", 32)
	rel := fmt.Sprintf("%s/%s/%s_g0/%s.bin", tier, h[:3], h[3:5], h)
	data := bytes.Repeat([]byte{9}, 2*block.PageSize)
	if err := f.store.Import(rel, data); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(mnt, rel))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("loading an imported block through the mount: %v (%d bytes)", err, len(got))
	}
}

// TestMountFeedsTheDiagnostics mounts the filesystem in this process and
// replays the engine's I/O: every event the field diagnostics judge reaches
// them from the FUSE requests, with the store's state, and their warnings
// reach stats.json. The rules themselves are tested in staging/diagnose,
// without a mount or a clock; integration/mount keeps the end-to-end cases
// that need the engine's region or a whole window.
func TestMountFeedsTheDiagnostics(t *testing.T) {
	rec := &recordingDiagnoser{}
	f, mnt := mountInProcess(t, Options{Diagnostics: rec})

	const tier = "M_0123456789ab_r0"
	h := strings.Repeat("ab", 32)
	rel := fmt.Sprintf("%s/%s/%s_g0/%s.bin", tier, h[:3], h[3:5], h)
	path := filepath.Join(mnt, rel)
	if err := os.Mkdir(filepath.Join(mnt, tier), 0o700); err != nil {
		t.Fatal(err)
	}
	// An absent key whose prefix directory does not exist yet.
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("stat of an absent key: %v", err)
	}
	// The engine's store: directories, an O_EXCL tmp, one write, rename.
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte{7}, 3*block.PageSize)
	tmp := path + "_1.tmp"
	w, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	// A lookup that finds it, a load, and a lookup of another key in its directory.
	if _, err := os.Stat(path); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("load: %v (%d bytes)", err, len(got))
	}
	other := filepath.Join(filepath.Dir(rel), strings.Repeat("ab", 31)+"cd.bin")
	if _, err := os.Stat(filepath.Join(mnt, other)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("stat of an absent key: %v", err)
	}

	events := rec.seen()
	for _, want := range []string{
		fmt.Sprintf("missed %s -1", tier),
		fmt.Sprintf("stored %s %d", rel, len(data)),
		fmt.Sprintf("lookup %s true", rel),
		fmt.Sprintf("read %s %d", rel, len(data)),
		fmt.Sprintf("lookup %s false", other),
	} {
		if !slices.Contains(events, want) {
			t.Errorf("the diagnostics were not told %q; they saw %q", want, events)
		}
	}
	if w := f.Stats().Warnings; !slices.ContainsFunc(w, func(w ctlabi.Warning) bool { return w.Code == "recorded" }) {
		t.Errorf("stats warnings %v: the diagnostics' warning is missing", w)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.state.Blocks != 1 || rec.state.NeverLookedUp != 0 {
		t.Errorf("the diagnostics judged a store of %+v; want 1 block, looked up", rec.state)
	}
}
