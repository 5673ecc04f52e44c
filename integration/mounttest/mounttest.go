// Package mounttest runs real kvtierfs daemons for tests: it builds the binary
// once per test process and starts `kvtierfs mount` as a child process, with
// cleanup that always unmounts (lazily as a last resort) and reaps the process.
package mounttest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/fusefs"
)

var (
	buildDir string
	binary   string
)

// Main builds the kvtierfs binary, runs the tests and removes the build; call
// it from TestMain.
func Main(m *testing.M) {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "mounttest: these tests mount FUSE filesystems and must run as root")
		os.Exit(1)
	}
	dir, err := os.MkdirTemp("", "kvtierfs-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	buildDir, binary = dir, filepath.Join(dir, "kvtierfs")
	out, err := exec.Command("go", "build", "-o", binary, "github.com/kvtierfs/kvtierfs/cmd/kvtierfs").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "building kvtierfs: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(buildDir)
	os.Exit(code)
}

// Binary is the path of the kvtierfs binary built by Main.
func Binary() string { return binary }

// Options configures a daemon.
type Options struct {
	// Store is the store directory; empty means a new temporary one.
	Store string
	// Mountpoint is where to mount; empty means a new temporary one.
	Mountpoint string
	// ShmGlob is passed as --shm-glob; empty means a glob that matches nothing.
	ShmGlob string
	// Args are extra flags for `kvtierfs mount`.
	Args []string
}

// Daemon is a running `kvtierfs mount`.
type Daemon struct {
	Mountpoint string
	Store      string
	t          testing.TB
	cmd        *exec.Cmd
	log        *syncBuffer
	exited     chan struct{}
	exitErr    error
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
	args := append([]string{"mount", opts.Mountpoint, "--store", opts.Store, "--metrics-addr", "", "--shm-glob", opts.ShmGlob}, opts.Args...)
	d := &Daemon{Mountpoint: opts.Mountpoint, Store: opts.Store, t: t, log: &syncBuffer{}, exited: make(chan struct{})}
	d.cmd = exec.Command(binary, args...)
	d.cmd.Stdout, d.cmd.Stderr = d.log, d.log
	if err := d.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		d.exitErr = d.cmd.Wait()
		close(d.exited)
	}()
	t.Cleanup(func() {
		d.Stop()
		if t.Failed() {
			t.Logf("kvtierfs log (%s):\n%s", d.Mountpoint, d.Log())
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(d.Mountpoint, fusefs.ControlDir, fusefs.StatsFile)); err == nil {
			return d, nil
		}
		select {
		case <-d.exited:
			return nil, fmt.Errorf("kvtierfs mount exited: %v\n%s", d.exitErr, d.Log())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("kvtierfs mount did not come up within 20s:\n%s", d.Log())
		}
	}
}

// Log is everything the daemon printed so far.
func (d *Daemon) Log() string { return d.log.String() }

// Path joins a path below the mountpoint.
func (d *Daemon) Path(rel ...string) string {
	return filepath.Join(append([]string{d.Mountpoint}, rel...)...)
}

// Running reports whether the daemon process is still alive.
func (d *Daemon) Running() bool {
	select {
	case <-d.exited:
		return false
	default:
		return true
	}
}

// Stop sends SIGTERM, waits for a clean exit (SIGKILL after 15 s) and makes
// sure nothing stays mounted. It returns the process's exit error.
func (d *Daemon) Stop() error {
	if d.Running() {
		d.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.exited:
		case <-time.After(15 * time.Second):
			d.cmd.Process.Kill()
			<-d.exited
		}
	}
	detach(d.Mountpoint)
	return d.exitErr
}

// Kill9 kills the daemon with SIGKILL, as a crash would, and detaches its dead mount.
func (d *Daemon) Kill9() {
	if d.Running() {
		d.cmd.Process.Kill()
		<-d.exited
	}
	detach(d.Mountpoint)
}

// detach lazily unmounts a mountpoint if anything is still mounted there.
func detach(mnt string) {
	for range 50 {
		if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
			return
		}
	}
}

// Stats reads the daemon's stats snapshot.
func (d *Daemon) Stats() fusefs.Stats {
	d.t.Helper()
	raw, err := os.ReadFile(d.Path(fusefs.ControlDir, fusefs.StatsFile))
	if err != nil {
		d.t.Fatalf("reading stats: %v", err)
	}
	var st fusefs.Stats
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

// syncBuffer is a bytes.Buffer safe for a writer process and test readers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
