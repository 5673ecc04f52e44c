// Package prime looks names of a mount up from a helper process, so that the
// kernel holds their entries, present or absent, before the engine asks
// (DESIGN.md "Lookups and the kernel's caches").
//
// After the kernel dropped its dentries (memory pressure, drop_caches), the
// first pass of an engine over new keys sends one LOOKUP round trip per
// distinct missing directory of the block layout, most of them a
// `<tier>/<h[0:3]>` that does not exist. Looking up the 4,096 names of that
// level from sixteen threads ahead of the engine turns most of those round
// trips into cache hits.
//
// The daemon must not look its own mount up: killed while one of its own
// lookups is being answered, it could never exit. The lookups come from a
// helper process instead, the daemon's own binary run with the hidden
// command HelperCommand (Main), which dies with the daemon (its parent
// death signal is SIGKILL) and whose pending lookups fail when the daemon's
// FUSE connection goes.
//
// The protocol is lines on the helper's stdin and stdout. The helper first
// writes "tid N" for each thread that looks names up, then "ready". The
// daemon writes a batch of names relative to the mountpoint, one per line,
// ended by an empty line; the helper looks each up (lookUpName: through no
// link) and writes "done N" with the names of the batch it looked up.
//
// The priming policy lives here as well: Schedule says when a tier is
// primed (at most every Interval, a bounded number at once) and TierNames
// what; the mount asks them when the kernel looks a tier up and hands the
// names to Helper.
package prime

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
	"github.com/kvtierfs/kvtierfs/fusefs/mountinfo"
)

// HelperCommand is the hidden subcommand that runs Main.
const HelperCommand = "lookup-helper"

// Workers is how many threads of the helper look names up at once.
const Workers = 16

// queuedBatches bounds the batches waiting for the helper: Prime drops a
// batch beyond it rather than wait.
const queuedBatches = 4

// Helper is the daemon's side of a helper process.
type Helper struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	// batches wait for the writer goroutine, until stop is closed.
	batches chan []string
	stop    chan struct{}
	tids    map[uint32]bool
	// looked counts the names the helper reported looked up.
	looked  atomic.Int64
	dropped atomic.Int64
	done    chan struct{}
	closing sync.Once
	err     error
	logger  *slog.Logger
}

// Start runs exe (the daemon's own binary) as the helper of the mount at
// mountpoint and waits until it reported its threads. The helper opens
// mountpoint at its first batch, which only comes once the mount serves.
func Start(exe, mountpoint string, logger *slog.Logger) (*Helper, error) {
	cmd := exec.Command(exe, HelperCommand, mountpoint)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	h := &Helper{cmd: cmd, stdin: stdin, logger: logger, batches: make(chan []string, queuedBatches),
		stop: make(chan struct{}), tids: make(map[uint32]bool), done: make(chan struct{})}
	started := make(chan error)
	go func() {
		// The parent death signal fires when the thread that started the
		// helper ends, not the process: that thread is kept until the
		// helper ends.
		runtime.LockOSThread()
		err := cmd.Start()
		started <- err
		if err == nil {
			<-h.done
		}
		runtime.UnlockOSThread()
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("starting the lookup helper: %w", err)
	}
	out := bufio.NewScanner(stdout)
	for {
		if !out.Scan() {
			h.abandon()
			return nil, fmt.Errorf("the lookup helper ended before it was ready: %v", out.Err())
		}
		line := out.Text()
		if line == "ready" {
			break
		}
		tid, ok := strings.CutPrefix(line, "tid ")
		n, err := strconv.ParseUint(tid, 10, 32)
		if !ok || err != nil || len(h.tids) >= Workers {
			h.abandon()
			return nil, fmt.Errorf("the lookup helper said %q before it was ready", line)
		}
		h.tids[uint32(n)] = true
	}
	go h.write()
	go h.read(out)
	return h, nil
}

// abandon kills a helper that did not get ready.
func (h *Helper) abandon() {
	h.cmd.Process.Kill()
	h.err = h.cmd.Wait()
	close(h.done)
}

// write hands the queued batches to the helper.
func (h *Helper) write() {
	defer h.stdin.Close()
	w := bufio.NewWriter(h.stdin)
	for {
		var batch []string
		select {
		case batch = <-h.batches:
		case <-h.stop:
			return
		}
		for _, name := range batch {
			w.WriteString(name)
			w.WriteByte('\n')
		}
		w.WriteByte('\n')
		if err := w.Flush(); err != nil {
			return
		}
	}
}

// read counts what the helper reports, until it ends.
func (h *Helper) read(out *bufio.Scanner) {
	for out.Scan() {
		if n, ok := strings.CutPrefix(out.Text(), "done "); ok {
			if v, err := strconv.ParseInt(n, 10, 64); err == nil {
				h.looked.Add(v)
			}
		}
	}
	h.err = h.cmd.Wait()
	select {
	case <-h.stop:
	default:
		h.logger.Warn("the lookup helper ended: an engine's first lookups of new keys are no longer primed",
			"pid", h.cmd.Process.Pid, "err", h.err)
	}
	close(h.done)
}

// Prime queues names, relative to the mountpoint, for the helper to look
// up. It never blocks: it returns false and drops the batch when the helper
// is behind or gone, or a name could not be a path below the mountpoint.
func (h *Helper) Prime(names []string) bool {
	for _, name := range names {
		if !ValidName(name) {
			return false
		}
	}
	select {
	case <-h.done:
		return false
	case <-h.stop:
		return false
	default:
	}
	select {
	case h.batches <- names:
		return true
	default:
		h.dropped.Add(1)
		return false
	}
}

// ValidName reports whether name can be sent to the helper: a clean
// relative path without line breaks.
func ValidName(name string) bool {
	return fs.ValidPath(name) && name != "." && !strings.ContainsAny(name, "\n\x00")
}

// Owns reports whether a FUSE request's caller thread is one of the
// helper's: its lookups are the daemon's own, not the engine's. Once the
// helper ended its thread ids may name any other thread.
func (h *Helper) Owns(tid uint32) bool {
	select {
	case <-h.done:
		return false
	default:
		return h.tids[tid]
	}
}

// Looked is how many names the helper reported looked up.
func (h *Helper) Looked() int64 { return h.looked.Load() }

// Pid is the helper's process id.
func (h *Helper) Pid() int { return h.cmd.Process.Pid }

// Close ends the helper: it finishes nothing queued and exits.
func (h *Helper) Close() error {
	h.closing.Do(func() {
		close(h.stop)
		h.cmd.Process.Kill()
		<-h.done
	})
	var exit *exec.ExitError
	if errors.As(h.err, &exit) && !exit.Exited() {
		return nil // killed by Close
	}
	return h.err
}

// Main is the helper process: it looks names up below mountpoint as the
// daemon asks on in, reporting on out, until in ends. It returns the exit
// status.
func Main(args []string, in io.Reader, out io.Writer) int {
	if len(args) != 1 {
		fmt.Fprintf(os.Stderr, "kvtierfs %s: want the mountpoint only, got %q\n", HelperCommand, args)
		return 2
	}
	if err := serve(args[0], in, out); err != nil {
		fmt.Fprintf(os.Stderr, "kvtierfs %s: %v\n", HelperCommand, err)
		return 1
	}
	return 0
}

// serve runs the helper's side of the protocol.
func serve(mountpoint string, in io.Reader, out io.Writer) error {
	names := make(chan string)
	looked := make(chan bool)
	var dirfd atomic.Int64
	tids := make(chan int, Workers)
	var wg sync.WaitGroup
	for range Workers {
		wg.Go(func() {
			// Locked, so that every lookup comes from the thread reported.
			runtime.LockOSThread()
			tids <- unix.Gettid()
			for name := range names {
				looked <- lookUpName(int(dirfd.Load()), name)
			}
		})
	}
	w := bufio.NewWriter(out)
	for range Workers {
		fmt.Fprintf(w, "tid %d\n", <-tids)
	}
	fmt.Fprintln(w, "ready")
	if err := w.Flush(); err != nil {
		return err
	}
	defer func() {
		close(names)
		wg.Wait()
	}()
	r := bufio.NewScanner(in)
	var batch []string
	for r.Scan() {
		if name := r.Text(); name != "" {
			if ValidName(name) {
				batch = append(batch, name)
			}
			continue
		}
		// Opened for the batch only: a descriptor held would keep the
		// mount busy, and its unmount from failing.
		fd, err := openMount(mountpoint)
		if err != nil {
			return err
		}
		dirfd.Store(int64(fd))
		n := lookUp(batch, names, looked)
		unix.Close(fd)
		batch = batch[:0]
		fmt.Fprintf(w, "done %d\n", n)
		if err := w.Flush(); err != nil {
			return err
		}
	}
	return r.Err()
}

// maxRaces bounds the retries of a lookup that a signal or a rename interrupted.
const maxRaces = 8

// lookUpName looks name up below the mount's root dir, as an O_PATH open
// (no OPEN request reaches the daemon) through no link in any component and
// within the mount: the engine's uid owns the store tree and can swap a tier
// for a link, and the helper, root like the daemon, would otherwise look up
// every prefix name beneath the link's target, anywhere. It reports whether
// the name was looked up, found or absent. Without openat2 (ENOSYS: kernels
// before 5.6, qemu-user) the name is walked one component at a time, each
// opened O_PATH|O_NOFOLLOW from the last (directories O_DIRECTORY), so no
// link is followed either; only the check against crossing a mount is lost,
// and only root can mount beneath the mount.
func lookUpName(dir int, name string) bool {
	how := unix.OpenHow{Flags: unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV}
	fd, err := unix.Openat2(dir, name, &how)
	for races := 0; (err == unix.EINTR || err == unix.EAGAIN) && races < maxRaces; races++ {
		fd, err = unix.Openat2(dir, name, &how) // a signal, or a rename elsewhere in the tree
	}
	if err == unix.ENOSYS {
		return walkName(dir, name)
	}
	if err == nil {
		unix.Close(fd)
	}
	return err == nil || err == unix.ENOENT || err == unix.ENOTDIR
}

// walkName is lookUpName where openat2 is missing.
func walkName(dir int, name string) bool {
	parts := strings.Split(name, "/")
	at := dir
	defer func() {
		if at != dir {
			unix.Close(at)
		}
	}()
	for i, part := range parts {
		if part == "" || part == "." || part == ".." {
			return false
		}
		flags := unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC
		if i < len(parts)-1 {
			flags |= unix.O_DIRECTORY
		}
		fd, err := unix.Openat(at, part, flags, 0)
		for races := 0; err == unix.EINTR && races < maxRaces; races++ {
			fd, err = unix.Openat(at, part, flags, 0)
		}
		if err != nil {
			return err == unix.ENOENT || (err == unix.ENOTDIR && i == len(parts)-1)
		}
		if at != dir {
			unix.Close(at)
		}
		at = fd
	}
	return true
}

// lookUp hands a batch to the workers and counts the names they looked up
// (found or absent).
func lookUp(batch []string, names chan<- string, looked <-chan bool) int {
	n := 0
	go func() {
		for _, name := range batch {
			names <- name
		}
	}()
	for range batch {
		if <-looked {
			n++
		}
	}
	return n
}

// openMount opens the root of the kvtierfs mount at mountpoint. The path is
// opened anew for each batch (a descriptor held would keep the mount busy),
// so what it opens must be the filesystem the mount table has there: not a
// link, nor another filesystem put in its place.
func openMount(mountpoint string) (int, error) {
	fd, err := unix.Open(mountpoint, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("opening the mount: %w", err)
	}
	if err := isMountAt(fd, mountpoint); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// isMountAt checks that fd is the root of the topmost mount at mountpoint,
// a kvtierfs one.
func isMountAt(fd int, mountpoint string) error {
	abs, err := filepath.Abs(mountpoint)
	if err != nil {
		return err
	}
	mounts, err := mountinfo.Read("self")
	if err != nil {
		return err
	}
	at := mountinfo.At(mounts, abs)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	dev := fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
	if len(at) == 0 || at[len(at)-1].FSType != ctlabi.FSType || at[len(at)-1].Device != dev {
		return fmt.Errorf("%s is not a kvtierfs mount (device %s; the mount table: %+v)", mountpoint, dev, at)
	}
	return nil
}
