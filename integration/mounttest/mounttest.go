// Package mounttest runs real kvtierfs daemons for tests: it builds the binary
// once per test process and starts `kvtierfs mount` as a child process, with
// cleanup that always unmounts (lazily as a last resort) and reaps the process.
package mounttest

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
	"github.com/kvtierfs/kvtierfs/integration/daemon"
)

// UnitEnv, when set, turns "not root" from a failure into a skip (`make unit`).
const UnitEnv = "KVTIERFS_UNIT"

// CoverDirEnv names a directory for the daemons' coverage counters (`make cover`).
const CoverDirEnv = "KVTIERFS_COVERDIR"

// DaemonArchEnv names another GOARCH to build the daemons for, without cgo
// (`.ci/arm64 e2e`: arm64, run by qemu-user through binfmt_misc).
const DaemonArchEnv = "KVTIERFS_DAEMON_GOARCH"

var (
	buildDir string
	binary   string
)

// Main builds the kvtierfs binary and its benchmark build beside it, runs
// the tests and removes the builds; call it from TestMain.
//
// Without root these tests fail, unless UnitEnv is set (`make unit`): then the
// package is skipped with a message. With CoverDirEnv set (`make cover`) the
// binary is built with coverage and every daemon writes its counters there.
func Main(m *testing.M) {
	if os.Geteuid() != 0 {
		if os.Getenv(UnitEnv) != "" {
			fmt.Fprintln(os.Stderr, "mounttest: skipped: these tests mount FUSE filesystems and need root")
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "mounttest: these tests mount FUSE filesystems and must run as root")
		os.Exit(1)
	}
	dir, err := os.MkdirTemp("", "kvtierfs-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	buildDir, binary = dir, filepath.Join(dir, "kvtierfs")
	var coverFlags []string
	if cover := os.Getenv(CoverDirEnv); cover != "" {
		coverFlags = []string{"-cover", "-coverpkg=github.com/kvtierfs/kvtierfs/..."}
		// Daemons inherit the test's environment (daemon.Start, Run).
		os.Setenv("GOCOVERDIR", cover)
	}
	// Beside the daemon, its benchmark build, which `kvtierfs bench` execs
	// (cmd/kvtierfs/bench_exec.go).
	for _, output := range [][]string{{"-o", binary}, {"-tags", "bench", "-o", binary + "-bench"}} {
		args := slices.Concat([]string{"build"}, coverFlags, output, []string{"github.com/kvtierfs/kvtierfs/cmd/kvtierfs"})
		cmd := exec.Command("go", args...)
		if arch := os.Getenv(DaemonArchEnv); arch != "" {
			cmd.Env = append(os.Environ(), "GOARCH="+arch, "CGO_ENABLED=0")
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "building kvtierfs: %v\n%s", err, out)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(buildDir)
	os.Exit(code)
}

// Binary is the path of the kvtierfs binary built by Main.
func Binary() string { return binary }

// BuildTagged builds kvtierfs with the build tags (e.g. kvtierfs_liar) into a
// directory removed when the test ends, and returns its path.
func BuildTagged(t testing.TB, tags string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kvtierfs-"+tags)
	out, err := exec.Command("go", "build", "-tags", tags, "-o", path, "github.com/kvtierfs/kvtierfs/cmd/kvtierfs").CombinedOutput()
	if err != nil {
		t.Fatalf("building kvtierfs with tags %s: %v\n%s", tags, err, out)
	}
	return path
}

// Options configures a daemon.
type Options struct {
	// Store is the store directory; empty means a new temporary one.
	Store string
	// Mountpoint is where to mount; empty means a new temporary one.
	Mountpoint string
	// ShmGlob is passed as --shm-glob; empty means a glob that matches nothing.
	ShmGlob string
	// Args are extra flags for `kvtierfs mount`. Without a --lookup-budget
	// among them the daemon mounts with --lookup-budget off: the budget
	// answers absent for present blocks past the region's rows in one
	// thread's chain, which the tests of everything else, reading back more
	// blocks than their small regions have rows, would meet by chance; the
	// tests of the budget name it (integration/engine).
	Args []string
	// Wrapper runs the daemon under another command, e.g. `ip netns exec NS`.
	Wrapper []string
	// Binary is the kvtierfs binary to run; empty means the one Main built.
	Binary string
}

// Daemon is a running `kvtierfs mount` tied to a test.
type Daemon struct {
	*daemon.Daemon
	t   testing.TB
	log *daemon.LogBuffer
}

// Start mounts a daemon and waits until it serves; cleanup is registered on t.
func Start(t testing.TB, opts Options) *Daemon {
	t.Helper()
	d, err := Launch(t, opts)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// Launch is Start that returns the daemon's failure instead of failing the test.
func Launch(t testing.TB, opts Options) (*Daemon, error) {
	if opts.Store == "" {
		opts.Store = t.TempDir()
	}
	if opts.Mountpoint == "" {
		opts.Mountpoint = filepath.Join(t.TempDir(), "mnt")
	}
	if opts.ShmGlob == "" {
		opts.ShmGlob = filepath.Join(t.TempDir(), "no-region-*.mmap")
	}
	if opts.Binary == "" {
		opts.Binary = binary
	}
	args := opts.Args
	if !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--lookup-budget") }) {
		args = append(slices.Clip(args), "--lookup-budget", "off")
	}
	log := &daemon.LogBuffer{}
	d, err := daemon.Start(daemon.Options{Binary: opts.Binary, Mountpoint: opts.Mountpoint, Store: opts.Store,
		ShmGlob: opts.ShmGlob, Args: args, Wrapper: opts.Wrapper, Log: log})
	if err != nil {
		return nil, fmt.Errorf("%w\n%s", err, log.String())
	}
	td := &Daemon{Daemon: d, t: t, log: log}
	t.Cleanup(func() {
		d.Stop()
		if t.Failed() {
			t.Logf("kvtierfs log (%s):\n%s", d.Mountpoint, log.String())
		}
	})
	return td, nil
}

// Log is everything the daemon printed so far.
func (d *Daemon) Log() string { return d.log.String() }

// Path joins a path below the mountpoint.
func (d *Daemon) Path(rel ...string) string {
	return filepath.Join(append([]string{d.Mountpoint}, rel...)...)
}

// Stats reads the daemon's stats snapshot.
func (d *Daemon) Stats() ctlabi.Stats {
	d.t.Helper()
	raw, err := os.ReadFile(d.Path(ctlabi.Dir, ctlabi.StatsFile))
	if err != nil {
		d.t.Fatalf("reading stats: %v", err)
	}
	var st ctlabi.Stats
	if err := json.Unmarshal(raw, &st); err != nil {
		d.t.Fatalf("decoding stats: %v\n%s", err, raw)
	}
	return st
}

// WaitLog waits until the daemon's log contains s.
func (d *Daemon) WaitLog(s string) bool {
	for range 500 {
		if strings.Contains(d.Log(), s) {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false
}

// Run runs the kvtierfs binary with args and returns its combined output.
func Run(args ...string) (string, error) {
	out, err := exec.Command(binary, args...).CombinedOutput()
	return string(out), err
}

// CopyExecutable copies the file from to a new executable file to, for
// tests that run a binary from a directory other users may read.
func CopyExecutable(t testing.TB, from, to string) {
	t.Helper()
	src, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
}

// SharedKeyFile writes a fresh random --shared-key-file (mode 0600) in a
// temporary directory of the test and returns its path: the replicas given
// the same file share one shared level.
func SharedKeyFile(t testing.TB) string {
	t.Helper()
	key := make([]byte, 32)
	rand.Read(key) // crypto/rand.Read never fails (Go ≥ 1.24)
	path := filepath.Join(t.TempDir(), "shared.key")
	if err := os.WriteFile(path, []byte(hex.EncodeToString(key)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// Allocated is what the regular files under dir allocate on disk, for
// checks that a store stays within its capacity.
func Allocated(t testing.TB, dir string) int64 {
	t.Helper()
	var total int64
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			total += fi.Sys().(*syscall.Stat_t).Blocks * 512
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return total
}
