// Package daemon runs `kvtierfs mount` as a child process for tests and
// benchmarks: start, wait until it serves, stop cleanly or kill it, and make
// sure nothing stays mounted.
package daemon

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
	"golang.org/x/sys/unix"
)

// Options configures a daemon.
type Options struct {
	// Binary is the kvtierfs executable.
	Binary string
	// Mountpoint and Store are passed to `kvtierfs mount`.
	Mountpoint, Store string
	// ShmGlob is passed as --shm-glob.
	ShmGlob string
	// Args are extra flags for `kvtierfs mount`.
	Args []string
	// Wrapper runs the daemon under another command, e.g. `ip netns exec NS`.
	Wrapper []string
	// Log receives the daemon's stdout and stderr; nil discards them.
	Log io.Writer
}

// Daemon is a running `kvtierfs mount`.
type Daemon struct {
	Mountpoint string
	Store      string
	cmd        *exec.Cmd
	exited     chan struct{}
	exitErr    error
}

// startTimeout bounds how long a mount may take to come up.
const startTimeout = 20 * time.Second

// readyGrace is how long Start waits for READY=1 once the mount serves.
const readyGrace = 5 * time.Second

// listenReady opens a datagram socket for the daemon's READY=1, in a
// directory of its own that any user may reach (daemons run as other users
// in some tests).
func listenReady() (*net.UnixConn, string, error) {
	dir, err := os.MkdirTemp("", "kvtierfs-notify-")
	if err != nil {
		return nil, "", err
	}
	os.Chmod(dir, 0o777)
	path := filepath.Join(dir, "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		os.RemoveAll(dir)
		return nil, "", err
	}
	os.Chmod(path, 0o666)
	return conn, path, nil
}

// Start launches the daemon and waits until it serves: its stats file is
// readable and it has reported READY=1 on NOTIFY_SOCKET. The second matters:
// go-fuse opens and closes a file on the new mount before the mount call
// returns, and a daemon killed while it holds that file can never exit (its
// close waits on the very server that died). A daemon whose notification
// cannot arrive (a wrapper that drops the environment or changes the user)
// is taken as up readyGrace after its stats file appeared. On failure
// nothing is left running or mounted.
func Start(opts Options) (*Daemon, error) {
	args := append([]string{"mount", opts.Mountpoint, "--store", opts.Store, "--metrics-addr", "", "--shm-glob", opts.ShmGlob}, opts.Args...)
	d := &Daemon{Mountpoint: opts.Mountpoint, Store: opts.Store, exited: make(chan struct{})}
	argv := append(append(append([]string{}, opts.Wrapper...), opts.Binary), args...)
	d.cmd = exec.Command(argv[0], argv[1:]...)
	if opts.Log != nil {
		d.cmd.Stdout, d.cmd.Stderr = opts.Log, opts.Log
	}
	ready, notifyPath, err := listenReady()
	if err != nil {
		return nil, err
	}
	defer ready.Close()
	defer os.RemoveAll(filepath.Dir(notifyPath))
	d.cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+notifyPath)
	if err := d.cmd.Start(); err != nil {
		return nil, err
	}
	readyc := make(chan struct{})
	go func() {
		buf := make([]byte, 512)
		for {
			n, err := ready.Read(buf)
			if err != nil {
				return
			}
			if bytes.Contains(buf[:n], []byte("READY=1")) {
				close(readyc)
				return
			}
		}
	}()
	go func() {
		d.exitErr = d.cmd.Wait()
		close(d.exited)
	}()
	deadline := time.Now().Add(startTimeout)
	var servedAt time.Time
	for {
		if servedAt.IsZero() {
			if _, err := os.Stat(filepath.Join(d.Mountpoint, ctlabi.Dir, ctlabi.StatsFile)); err == nil {
				servedAt = time.Now()
			}
		}
		if !servedAt.IsZero() {
			select {
			case <-readyc:
				return d, nil
			default:
			}
			if time.Since(servedAt) > readyGrace {
				return d, nil
			}
		}
		select {
		case <-d.exited:
			Detach(d.Mountpoint)
			return nil, fmt.Errorf("kvtierfs mount exited: %v", d.exitErr)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			d.Kill9()
			return nil, fmt.Errorf("kvtierfs mount did not come up within %s", startTimeout)
		}
	}
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

// Pid is the daemon's process id.
func (d *Daemon) Pid() int { return d.cmd.Process.Pid }

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
	Detach(d.Mountpoint)
	return d.exitErr
}

// Kill9 kills the daemon with SIGKILL, as a crash would, and detaches its dead mount.
func (d *Daemon) Kill9() {
	if d.Running() {
		d.cmd.Process.Kill()
		<-d.exited
	}
	Detach(d.Mountpoint)
}

// Crash kills the daemon with SIGKILL and leaves its dead mount in place, as
// a crash in the field does; Stop or Kill9 detaches it later.
func (d *Daemon) Crash() {
	if d.Running() {
		d.cmd.Process.Kill()
		<-d.exited
	}
}

// Detach lazily unmounts a mountpoint while anything is mounted there.
// Detach then lifts the guard a daemon leaves on its bare mountpoint, so
// that the test's temporary directories can be removed.
func Detach(mnt string) {
	for range 50 {
		if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
			break
		}
	}
	Unguard(mnt)
}

// fsImmutableFlag is FS_IMMUTABLE_FL of linux/fs.h.
const fsImmutableFlag = 0x10

// Unguard makes a bare mountpoint an ordinary directory again: not
// immutable, mode 0755. It does nothing to a path that is no directory.
func Unguard(mnt string) {
	fd, err := unix.Open(mnt, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	if flags, err := unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS); err == nil && flags&fsImmutableFlag != 0 {
		unix.IoctlSetPointerInt(fd, unix.FS_IOC_SETFLAGS, int(flags&^fsImmutableFlag))
	}
	unix.Fchmod(fd, 0o755)
}

// LogBuffer collects a daemon's output; it is safe for the writing process
// and concurrent readers.
type LogBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends daemon output.
func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String is everything written so far.
func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
