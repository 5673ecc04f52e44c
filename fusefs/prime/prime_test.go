package prime

import (
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestMain runs the helper when the test binary is started as one.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == HelperCommand {
		os.Exit(Main(os.Args[2:], os.Stdin, os.Stdout))
	}
	os.Exit(m.Run())
}

func TestValidName(t *testing.T) {
	for name, want := range map[string]bool{
		"M_0123456789ab_r0/abc":       true,
		"M_0123456789ab_r0/abc/de_g0": true,
		"":                            false,
		".":                           false,
		"/etc":                        false,
		"a/../b":                      false,
		"../a":                        false,
		"a//b":                        false,
		"a/b/":                        false,
		"a\nb":                        false,
		"a\x00b":                      false,
	} {
		if got := ValidName(name); got != want {
			t.Errorf("ValidName(%q) = %v, want %v", name, got, want)
		}
	}
}

// The helper reports its threads, refuses what is not a FUSE mount at its
// first batch and then ends: Prime says so instead of blocking.
func TestHelperRefusesADirectoryThatIsNotAMount(t *testing.T) {
	var logs strings.Builder
	h, err := Start(os.Args[0], t.TempDir(), slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if len(h.tids) != Workers {
		t.Fatalf("the helper reported %d threads, want %d", len(h.tids), Workers)
	}
	for tid := range h.tids {
		if tid == 0 || tid == uint32(os.Getpid()) || !h.Owns(tid) {
			t.Errorf("thread %d: not one of the helper's", tid)
		}
	}
	if h.Owns(uint32(os.Getpid())) {
		t.Error("the daemon's own thread counts as the helper's")
	}
	if h.Prime([]string{"../escape"}) {
		t.Error("a name above the mountpoint was queued")
	}
	if !h.Prime([]string{"tier/abc"}) {
		t.Fatal("a batch was refused by a live helper")
	}
	select {
	case <-h.done:
	case <-time.After(time.Minute):
		t.Fatal("the helper did not end after a batch for a directory that is not a FUSE mount")
	}
	if h.Prime([]string{"tier/abc"}) {
		t.Error("a batch was queued for a helper that ended")
	}
	if !strings.Contains(logs.String(), "the lookup helper ended") {
		t.Errorf("a helper that ended by itself was not logged: %q", logs.String())
	}
	if err := h.Close(); err == nil || h.Looked() != 0 {
		t.Errorf("Close = %v after the helper failed, looked up %d names; want its exit status and none", err, h.Looked())
	}
}

// A helper that is closed ends at once, with nothing to report.
func TestHelperCloses(t *testing.T) {
	var logs strings.Builder
	h, err := Start(os.Args[0], t.TempDir(), slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := h.Close(); err != nil {
		t.Errorf("Close again: %v", err)
	}
	if h.Prime([]string{"tier/abc"}) {
		t.Error("a batch was queued for a closed helper")
	}
	if logs.Len() != 0 {
		t.Errorf("a helper stopped by Close was logged: %q", logs.String())
	}
}

// A helper started with no mountpoint says so and exits 2.
func TestHelperUsage(t *testing.T) {
	var out strings.Builder
	if code := Main(nil, strings.NewReader(""), &out); code != 2 {
		t.Errorf("Main() = %d, want 2", code)
	}
}

// Once the helper ended, its thread ids can be reused by any other thread,
// the engine's included: they no longer mark a lookup as the helper's.
func TestThreadsOfAnEndedHelperAreNotItsOwn(t *testing.T) {
	h, err := Start(os.Args[0], t.TempDir(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	var tid uint32
	for tid = range h.tids {
		break
	}
	if err := h.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.done:
	case <-time.After(time.Minute):
		t.Fatal("the killed helper was not seen ending")
	}
	if h.Owns(tid) {
		t.Errorf("thread %d of a helper that ended still counts as the helper's", tid)
	}
}

// The helper opens only the kvtierfs mount the mount table has at its
// path: a plain directory, or a link to one, is refused.
func TestOpenMountRefusesWhatIsNotTheMount(t *testing.T) {
	dir := t.TempDir()
	link := dir + "/link"
	if err := os.Symlink("/", link); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{dir, link, "/"} {
		if fd, err := openMount(path); err == nil {
			t.Errorf("openMount(%s) = %d, want an error", path, fd)
		}
	}
}

// TestLookUpGoesThroughNoLink: the engine's uid owns the store tree and can
// swap a tier for a link to any directory; the helper, root like the
// daemon, must not look the prefix names up beneath the link's target
// (main's fstatat followed every link but the last component's). Names of
// plain directories are looked up, found or absent.
func TestLookUpGoesThroughNoLink(t *testing.T) {
	mount, elsewhere := t.TempDir(), t.TempDir()
	for _, dir := range []string{mount + "/tier/abc", elsewhere + "/abc"} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(elsewhere, mount+"/swapped"); err != nil {
		t.Fatal(err)
	}
	root, err := unix.Open(mount, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(root)
	for name, want := range map[string]bool{
		"tier/abc":                   true,  // present
		"tier/abd":                   true,  // absent
		"swapped/abc":                false, // through the link: elsewhere/abc
		"swapped/abd":                false,
		"swapped":                    true, // the link itself, not followed
		"../abc":                     false,
		"tier/abc/../../swapped/abc": false,
	} {
		if got := lookUpName(root, name); got != want {
			t.Errorf("lookUpName(%q) = %v, want %v", name, got, want)
		}
		if got := walkName(root, name); got != want { // the walk where openat2 is missing
			t.Errorf("walkName(%q) = %v, want %v", name, got, want)
		}
	}
}
