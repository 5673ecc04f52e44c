package beneath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/internal/seccomptest"
)

// tree makes root/a/b/f ("inside") beside a directory outside root holding
// a/b/f ("outside"), and links that lead there from every component: root/L
// (a first directory), root/a/L (a middle one), root/a/b/F (the last name),
// and root/a/I, a link that stays inside root.
func tree(t *testing.T) (root string, dir int) {
	t.Helper()
	root, outside := t.TempDir(), t.TempDir()
	for _, base := range []string{root, outside} {
		if err := os.MkdirAll(filepath.Join(base, "a", "b"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	write(t, filepath.Join(root, "a", "b", "f"), "inside")
	write(t, filepath.Join(outside, "a", "b", "f"), "outside")
	for link, target := range map[string]string{
		"L":     outside,
		"a/L":   filepath.Join(outside, "a"),
		"a/b/F": filepath.Join(outside, "a", "b", "f"),
		"a/I":   "b",
	} {
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			t.Fatal(err)
		}
	}
	dir, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(dir) })
	return root, dir
}

func write(t *testing.T, name, data string) {
	t.Helper()
	if err := os.WriteFile(name, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// eachResolution runs test with openat2 and with the walk forced, telling
// it whether Open is to walk.
func eachResolution(t *testing.T, test func(t *testing.T, walking bool)) {
	t.Run("openat2", func(t *testing.T) {
		// Where the kernel lacks openat2 (qemu-user) this too is the walk.
		if noOpenat2.Load() && kernelHasOpenat2() {
			t.Fatal("openat2 off before the test on a kernel that has it")
		}
		test(t, !kernelHasOpenat2())
	})
	t.Run("walk", func(t *testing.T) {
		before := noOpenat2.Load()
		restore := WithoutOpenat2()
		defer func() {
			restore()
			if noOpenat2.Load() != before {
				t.Error("WithoutOpenat2's restore did not restore the resolution before it")
			}
		}()
		test(t, true)
	})
}

// kernelHasOpenat2 reports whether openat2 answers on this thread.
func kernelHasOpenat2() bool {
	how := unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC}
	fd, err := unix.Openat2(unix.AT_FDCWD, "/", &how)
	if err == nil {
		unix.Close(fd)
	}
	return err != unix.ENOSYS
}

// readName opens name beneath dir and reads it whole.
func readName(dir int, name string) (string, error) {
	fd, err := Open(dir, name, unix.O_RDONLY, 0)
	if err != nil {
		return "", err
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	buf := make([]byte, 64)
	n, err := f.Read(buf)
	return string(buf[:n]), err
}

func TestOpenResolvesPlainNames(t *testing.T) {
	eachResolution(t, func(t *testing.T, walking bool) {
		root, dir := tree(t)
		if got, err := readName(dir, "a/b/f"); err != nil || got != "inside" {
			t.Fatalf("a/b/f: %q, %v", got, err)
		}
		for _, name := range []string{"", "."} {
			fd, err := Open(dir, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
			if err != nil {
				t.Fatalf("%q: %v", name, err)
			}
			var st, want unix.Stat_t
			unix.Fstat(fd, &st)
			unix.Close(fd)
			unix.Stat(root, &want)
			if st.Ino != want.Ino || st.Dev != want.Dev {
				t.Errorf("%q opened another directory than the root", name)
			}
		}
		// A mode without O_CREAT is dropped (openat2 refuses one), kept with it.
		if fd, err := Open(dir, "a/b/f", unix.O_RDONLY, 0o644); err != nil {
			t.Errorf("open with a stray mode: %v", err)
		} else {
			unix.Close(fd)
		}
		fd, err := Open(dir, "a/b/new", unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o640)
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		var st unix.Stat_t
		unix.Fstat(fd, &st)
		unix.Close(fd)
		if st.Mode&0o777 != 0o640&^uint32(umask()) {
			t.Errorf("created with mode %o, want %o", st.Mode&0o777, 0o640&^umask())
		}
		if fl, err := unix.FcntlInt(uintptr(fdOf(t, dir, "a/b/f")), unix.F_GETFD, 0); err != nil || fl&unix.FD_CLOEXEC == 0 {
			t.Errorf("descriptor without FD_CLOEXEC: %x, %v", fl, err)
		}
	})
}

// fdOf opens name O_RDONLY until the test ends.
func fdOf(t *testing.T, dir int, name string) int {
	t.Helper()
	fd, err := Open(dir, name, unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

func umask() uint32 {
	old := unix.Umask(0)
	unix.Umask(old)
	return uint32(old)
}

func TestOpenRefusesLinksInEveryComponent(t *testing.T) {
	eachResolution(t, func(t *testing.T, walking bool) {
		_, dir := tree(t)
		// openat2 answers ELOOP for any link; the walk's O_DIRECTORY opens
		// answer ENOTDIR for a linked directory: which one ran shows.
		for _, c := range []struct {
			name    string
			dirLink bool
		}{{"L/a/b/f", true}, {"a/L/b/f", true}, {"a/I/f", true}, {"a/b/F", false}} {
			want := unix.ELOOP
			if walking && c.dirLink {
				want = unix.ENOTDIR
			}
			if got, err := readName(dir, c.name); !errors.Is(err, want) {
				t.Errorf("%s: %q, %v, want %v", c.name, got, err, want)
			}
		}
		// O_PATH of a final link opens the link itself, never its target.
		fd, err := Open(dir, "a/b/F", unix.O_PATH, 0)
		if err != nil {
			t.Fatalf("O_PATH of the link: %v", err)
		}
		var st unix.Stat_t
		unix.Fstat(fd, &st)
		unix.Close(fd)
		if st.Mode&unix.S_IFMT != unix.S_IFLNK {
			t.Errorf("O_PATH of a link opened mode %o, want the link", st.Mode)
		}
		// A directory through a link is refused even as the last name's parent.
		if fd, err := Open(dir, "L/a", unix.O_PATH|unix.O_DIRECTORY, 0); err == nil {
			unix.Close(fd)
			t.Error("L/a opened as a directory through the link")
		}
	})
}

func TestOpenRefusesNamesLeavingOrMalformed(t *testing.T) {
	eachResolution(t, func(t *testing.T, walking bool) {
		root, dir := tree(t)
		for _, c := range []struct {
			name string
			want unix.Errno
		}{
			{"..", unix.EXDEV},
			{"../" + filepath.Base(root) + "/a/b/f", unix.EXDEV},
			{"a/../a/b/f", unix.EXDEV},
			{"a/b/..", unix.EXDEV},
			{filepath.Join(root, "a/b/f"), unix.EXDEV},
			{"/", unix.EXDEV},
			{"a//b/f", unix.EINVAL},
			{"a/./b/f", unix.EINVAL},
			{"a/b/", unix.EINVAL},
		} {
			got, err := readName(dir, c.name)
			if !errors.Is(err, c.want) {
				t.Errorf("%q: %q, %v, want %v", c.name, got, err, c.want)
			}
		}
	})
}

// TestRetry: EINTR is retried however often it comes, EAGAIN up to
// maxRaces times and then returned; other errors and successes at once.
func TestRetry(t *testing.T) {
	answers := func(errs ...error) (func() (int, error), *int) {
		calls := 0
		return func() (int, error) {
			calls++
			if calls <= len(errs) {
				return -1, errs[calls-1]
			}
			return 7, nil
		}, &calls
	}
	many := func(err error, n int) []error {
		out := make([]error, n)
		for i := range out {
			out[i] = err
		}
		return out
	}
	for _, c := range []struct {
		what      string
		errs      []error
		wantFD    int
		wantErr   error
		wantCalls int
	}{
		{"success", nil, 7, nil, 1},
		{"signals", many(unix.EINTR, 100), 7, nil, 101},
		{"races then signals", append(many(unix.EAGAIN, maxRaces), unix.EINTR, unix.EINTR), 7, nil, maxRaces + 3},
		{"too many races", many(unix.EAGAIN, maxRaces+5), -1, unix.EAGAIN, maxRaces + 1},
		{"other error", []error{unix.ENOENT}, -1, unix.ENOENT, 1},
	} {
		open, calls := answers(c.errs...)
		fd, err := retry(open)
		if fd != c.wantFD || err != c.wantErr || *calls != c.wantCalls {
			t.Errorf("%s: fd %d, %v after %d calls; want %d, %v after %d", c.what, fd, err, *calls, c.wantFD, c.wantErr, c.wantCalls)
		}
	}
}

// TestOpenWalksWhereOpenat2IsMissing: on a thread whose seccomp filter
// answers openat2 with ENOSYS, as a sandbox does, Open still resolves names
// (by the walk), still refuses links, and remembers that openat2 is missing.
func TestOpenWalksWhereOpenat2IsMissing(t *testing.T) {
	_, dir := tree(t)
	defer noOpenat2.Store(noOpenat2.Load())
	type result struct {
		got    string
		err    error
		linked error
		off    bool
	}
	done := make(chan result)
	go func() {
		// The filter stays on this thread: locked and never unlocked, the
		// thread ends with the goroutine.
		runtime.LockOSThread()
		var r result
		defer func() { done <- r }()
		// qemu-user refuses seccomp filters, and has no openat2 to deny.
		if err := seccomptest.DenyOpenat2(); kernelHasOpenat2() {
			r.err = fmt.Errorf("openat2 still answers under the filter (%v)", err)
			return
		}
		r.got, r.err = readName(dir, "a/b/f")
		r.off = noOpenat2.Load()
		_, r.linked = readName(dir, "a/L/b/f")
	}()
	r := <-done
	if r.err != nil || r.got != "inside" {
		t.Fatalf("a/b/f without openat2: %q, %v", r.got, r.err)
	}
	if !r.off {
		t.Error("ENOSYS from openat2 not remembered")
	}
	if !errors.Is(r.linked, unix.ENOTDIR) && !errors.Is(r.linked, unix.ELOOP) {
		t.Errorf("a/L/b/f without openat2: %v, want ENOTDIR or ELOOP", r.linked)
	}
}

// TestOpenRefusesMountPoints: a filesystem mounted inside the tree (the
// engine's uid may mount a FUSE server there where /dev/fuse is open to it,
// and stop it) is never entered: a name through it or naming it fails with
// EXDEV, with openat2 and with the walk. So does a bind mount of a file or a
// directory of the tree's own filesystem, whose device is the tree's.
func TestOpenRefusesMountPoints(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"m", "plain", "bound", "source"} {
		if err := os.Mkdir(filepath.Join(root, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mount("kvtierfs-beneath-test", filepath.Join(root, "m"), "tmpfs", 0, "size=1m"); err != nil {
		t.Fatalf("mounting a tmpfs inside the tree (root needed): %v", err)
	}
	t.Cleanup(func() { unix.Unmount(filepath.Join(root, "m"), unix.MNT_DETACH) })
	write(t, filepath.Join(root, "m", "f"), "mounted")
	write(t, filepath.Join(root, "plain", "f"), "plain")
	write(t, filepath.Join(root, "source", "f"), "bound")
	write(t, filepath.Join(root, "boundfile"), "")
	for target, source := range map[string]string{"bound": "source", "boundfile": "source/f"} {
		if err := unix.Mount(filepath.Join(root, source), filepath.Join(root, target), "", unix.MS_BIND, ""); err != nil {
			t.Fatalf("bind-mounting %s over %s: %v", source, target, err)
		}
		t.Cleanup(func() { unix.Unmount(filepath.Join(root, target), unix.MNT_DETACH) })
	}
	dir, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(dir) })
	eachResolution(t, func(t *testing.T, walking bool) {
		for _, name := range []string{"m/f", "m", "bound/f", "bound", "boundfile"} {
			if fd, err := Open(dir, name, unix.O_RDONLY, 0); err != unix.EXDEV {
				if err == nil {
					unix.Close(fd)
				}
				t.Errorf("Open(%q) through a mount point: %v, want EXDEV", name, err)
			}
		}
		if got, err := readName(dir, "plain/f"); err != nil || got != "plain" {
			t.Errorf("Open(plain/f) = %q, %v; want its bytes", got, err)
		}
	})
}
