package mount_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

// outerLimit ends a command under test that failed to honour its own bound,
// so that a regression fails the test instead of hanging it.
const outerLimit = 2 * time.Minute

// stopDaemon stops d with SIGSTOP until the test ends.
func stopDaemon(t *testing.T, d *mounttest.Daemon) {
	t.Helper()
	if err := syscall.Kill(d.Pid(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(d.Pid(), syscall.SIGCONT) })
}

// TestStatGivesUpOnStoppedDaemon runs stat on the mount of a stopped daemon:
// it exits at its --timeout with a message naming a stopped or hung daemon.
func TestStatGivesUpOnStoppedDaemon(t *testing.T) {
	d := mounttest.Start(t, mounttest.Options{})
	stopDaemon(t, d)
	for _, args := range [][]string{{"stat"}, {"stat", "--json"}, {"stat", "--watch"}} {
		ctx, cancel := context.WithTimeout(context.Background(), outerLimit)
		out, err := exec.CommandContext(ctx, mounttest.Binary(), append(args, d.Mountpoint, "--timeout", "1s")...).CombinedOutput()
		overran := ctx.Err() != nil
		cancel()
		if overran {
			t.Fatalf("kvtierfs %v on a stopped daemon ran past %s despite --timeout 1s", args, outerLimit)
		}
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 1 {
			t.Errorf("kvtierfs %v on a stopped daemon: %v, want exit status 1\n%s", args, err, out)
		}
		if !strings.Contains(string(out), "does not answer within 1s: the daemon serving it is stopped or hung") {
			t.Errorf("kvtierfs %v on a stopped daemon does not name the cause:\n%s", args, out)
		}
	}
}

// TestStatHonoursSIGTERMOnStoppedDaemon sends SIGTERM to a stat that waits on
// a stopped daemon with a long --timeout: it ends, as its signal says.
func TestStatHonoursSIGTERMOnStoppedDaemon(t *testing.T) {
	d := mounttest.Start(t, mounttest.Options{})
	stopDaemon(t, d)
	ctx, cancel := context.WithTimeout(context.Background(), outerLimit)
	defer cancel()
	cmd := exec.CommandContext(ctx, mounttest.Binary(), "stat", d.Mountpoint, "--timeout", "1h")
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Waits until stat is blocked on the mount: its thread sleeps in a
	// FUSE request the stopped daemon never answers.
	for !blockedInFUSE(cmd.Process.Pid) && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	if ctx.Err() != nil {
		t.Fatalf("stat ignored SIGTERM while the daemon was stopped:\n%s", out.String())
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 128+int(syscall.SIGTERM) {
		t.Errorf("stat after SIGTERM: %v, want exit status %d\n%s", err, 128+int(syscall.SIGTERM), out.String())
	}
	if !strings.Contains(out.String(), "interrupted by terminated") {
		t.Errorf("stat after SIGTERM does not say it was interrupted:\n%s", out.String())
	}
}

// blockedInFUSE reports whether a thread of pid waits in a FUSE request.
func blockedInFUSE(pid int) bool {
	tasks, _ := filepath.Glob(filepath.Join("/proc", strconv.Itoa(pid), "task", "*", "wchan"))
	for _, task := range tasks {
		wchan, err := os.ReadFile(task)
		if err == nil && strings.Contains(string(wchan), "request_wait_answer") {
			return true
		}
	}
	return false
}

// TestUmountOnlyKvtierfs bind-mounts a directory: `kvtierfs umount` refuses
// it, naming what is mounted, and leaves it mounted; a kvtierfs mount it
// unmounts at once, without calling it busy.
func TestUmountOnlyKvtierfs(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(dst, unix.MNT_DETACH) })
	out, err := mounttest.Run("umount", dst)
	if err == nil || !strings.Contains(out, "is not a kvtierfs mount") {
		t.Fatalf("kvtierfs umount of a bind mount: %v\n%s", err, out)
	}
	if !isMounted(t, dst) {
		t.Fatal("kvtierfs umount unmounted a bind mount")
	}

	d := mounttest.Start(t, mounttest.Options{})
	// The engine's first lookup of a tier starts the lookup helper's batch.
	tier := openTier(t, d)
	if tier.Exists(tier.BlockPath(tierDir, 0, hashOf(1))) {
		t.Fatal("a block never stored answers present")
	}
	out, err = mounttest.Run("umount", d.Mountpoint)
	if err != nil || strings.Contains(out, "busy") {
		t.Fatalf("kvtierfs umount of an idle kvtierfs mount: %v\n%s", err, out)
	}
	if isMounted(t, d.Mountpoint) {
		t.Fatal("the kvtierfs mount is still there after kvtierfs umount")
	}
}

// isMounted reports whether the mount table has a mount at dir.
func isMounted(t *testing.T, dir string) bool {
	t.Helper()
	raw, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(raw), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == dir {
			return true
		}
	}
	return false
}

// TestMountRefusesNonEmptyMountpoint leaves a file in a bare mountpoint, as
// an engine writing while no daemon served would: mount refuses it naming
// the file and --nonempty; with --nonempty it mounts.
func TestMountRefusesNonEmptyMountpoint(t *testing.T) {
	mnt := filepath.Join(t.TempDir(), "mnt")
	if err := os.MkdirAll(filepath.Join(mnt, "TestModel_r0"), 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := mounttest.Run("mount", mnt, "--store", t.TempDir(), "--metrics-addr", "")
	if err == nil || !strings.Contains(out, "is not empty (TestModel_r0)") || !strings.Contains(out, "--nonempty") {
		t.Fatalf("mount over a non-empty mountpoint: %v\n%s", err, out)
	}
	if isMounted(t, mnt) {
		t.Fatal("the refused mount is mounted")
	}
	mounttest.Start(t, mounttest.Options{Mountpoint: mnt, Args: []string{"--nonempty"}})
}

// TestWarningClearsOnceCauseIsGone corrupts a block in the store tree: its
// load raises changed_outside, which clears after a window without another
// failure while the counter keeps its total.
func TestWarningClearsOnceCauseIsGone(t *testing.T) {
	region := newRegion(t, 1)
	d := mounttest.Start(t, mounttest.Options{Args: []string{"--diagnostics-window", "1s"}})
	tier := openTier(t, d)
	bad := storeBlock(t, tier, region.Row(0), 1)
	flipByte(t, filepath.Join(d.Store, strings.TrimPrefix(bad, d.Mountpoint)), 12345)
	if err := tier.Load(bad, region.Row(0)); !errors.Is(err, syscall.EIO) {
		t.Fatalf("load of a corrupt block: %v, want EIO", err)
	}
	raised := func() bool { return hasWarning(d.Stats().Warnings, "changed_outside") }
	if !raised() {
		t.Fatalf("no changed_outside warning after a block written in the store tree failed: %+v", d.Stats().Warnings)
	}
	deadline := time.Now().Add(outerLimit)
	for raised() {
		if time.Now().After(deadline) {
			t.Fatalf("changed_outside still raised %s after the only failure, with --diagnostics-window 1s", outerLimit)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if c := d.Stats().Counters.BlocksChangedOutside; c != 1 {
		t.Errorf("blocks changed outside counter %d after the warning cleared, want 1", c)
	}
}

// TestDfShowsTheTier fills half of a small store filesystem with another
// user's file: df of an empty tier shows nothing used and what is left as
// its size, and a --capacity beyond the filesystem is clamped, saying so.
func TestDfShowsTheTier(t *testing.T) {
	fsDir, _ := smallFilesystem(t, 64)
	other := make([]byte, 32<<20)
	if err := os.WriteFile(filepath.Join(fsDir, "other-user"), other, 0o600); err != nil {
		t.Fatal(err)
	}
	store := filepath.Join(fsDir, "store")
	if err := os.Mkdir(store, 0o755); err != nil {
		t.Fatal(err)
	}
	d := mounttest.Start(t, mounttest.Options{Store: store, Args: []string{"--capacity", "1GiB", "--staging-bytes", "0"}})
	if !strings.Contains(d.Log(), "capacity larger than the store filesystem: clamped") {
		t.Errorf("--capacity 1GiB on a 64 MiB filesystem was not reported clamped:\n%s", d.Log())
	}
	if c := d.Stats().Disk.CapacityBytes; c > 64<<20 {
		t.Errorf("capacity %d bytes on a 64 MiB filesystem", c)
	}
	var fsStat, tierStat unix.Statfs_t
	if err := unix.Statfs(fsDir, &fsStat); err != nil {
		t.Fatal(err)
	}
	if err := unix.Statfs(d.Mountpoint, &tierStat); err != nil {
		t.Fatal(err)
	}
	size, free := int64(tierStat.Blocks)*tierStat.Bsize, int64(tierStat.Bavail)*tierStat.Bsize
	if used := size - free; used != 0 {
		t.Errorf("df of an empty tier: %d bytes used (the filesystem's other file counts), want 0", used)
	}
	if fsAvail := int64(fsStat.Bavail) * fsStat.Bsize; size <= 0 || size > fsAvail {
		t.Errorf("df of an empty tier: size %d, want what the filesystem has left (%d) at most", size, fsAvail)
	}

	tier := openTier(t, d)
	storeBlock(t, tier, newRegion(t, 1).Row(0), 1)
	if err := unix.Statfs(d.Mountpoint, &tierStat); err != nil {
		t.Fatal(err)
	}
	if used := int64(tierStat.Blocks-tierStat.Bavail) * tierStat.Bsize; used < rowBytes || used > 2*rowBytes {
		t.Errorf("df after one block of %d bytes: %d bytes used", rowBytes, used)
	}
}

// TestHealthAndBuildInfo scrapes a mount's endpoint: /healthz answers ok,
// /metrics has kvtierfs_build_info, and the start-up log names the version.
func TestHealthAndBuildInfo(t *testing.T) {
	d := mounttest.Start(t, mounttest.Options{Args: []string{"--metrics-addr", "127.0.0.1:0"}})
	m := regexp.MustCompile(`metrics=http://(\S+)/metrics`).FindStringSubmatch(d.Log())
	if m == nil {
		t.Fatalf("the daemon did not log its metrics address:\n%s", d.Log())
	}
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + m[1] + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, body := get("/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/healthz of a serving mount: %d %q", code, body)
	}
	if _, body := get("/metrics"); !regexp.MustCompile(`kvtierfs_build_info\{goversion="go[^"]+",revision="[^"]+",version="[^"]+"\} 1`).MatchString(body) {
		t.Errorf("metrics lack kvtierfs_build_info with its labels")
	}
	if !regexp.MustCompile(`msg=mounted .*version=\S+ commit=\S+`).MatchString(d.Log()) {
		t.Errorf("the start-up log does not name the version:\n%s", d.Log())
	}
}

// TestMetricsTokenKeepsMetricsToTheOperator: with --metrics-token-file,
// /metrics and /debug/pprof answer only a request bearing the token, which
// a local user who reaches the port does not have; /healthz stays open for
// probes. A token file others could read is refused at mount.
func TestMetricsTokenKeepsMetricsToTheOperator(t *testing.T) {
	token := "operator-token-0123456789"
	file := filepath.Join(t.TempDir(), "metrics.token")
	if err := os.WriteFile(file, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := mounttest.Start(t, mounttest.Options{Args: []string{"--metrics-addr", "127.0.0.1:0", "--metrics-token-file", file, "--debug"}})
	m := regexp.MustCompile(`metrics=http://(\S+)/metrics`).FindStringSubmatch(d.Log())
	if m == nil {
		t.Fatalf("the daemon did not log its metrics address:\n%s", d.Log())
	}
	get := func(path, bearer string) (int, string) {
		req, err := http.NewRequest(http.MethodGet, "http://"+m[1]+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	for _, path := range []string{"/metrics", "/debug/pprof/", "/debug/pprof/heap"} {
		for _, bearer := range []string{"", "operator-token-wrong-guess"} {
			if code, _ := get(path, bearer); code != http.StatusUnauthorized {
				t.Errorf("%s with token %q: %d, want 401", path, bearer, code)
			}
		}
	}
	if code, body := get("/metrics", token); code != http.StatusOK || !strings.Contains(body, "kvtierfs_build_info") {
		t.Errorf("/metrics with the token: %d, no kvtierfs_build_info", code)
	}
	if code, _ := get("/debug/pprof/", token); code != http.StatusOK {
		t.Errorf("/debug/pprof/ with the token: %d", code)
	}
	if code, body := get("/healthz", ""); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/healthz without a token: %d %q", code, body)
	}

	readable := filepath.Join(t.TempDir(), "readable.token")
	if err := os.WriteFile(readable, []byte(token), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := mounttest.Launch(t, mounttest.Options{Args: []string{"--metrics-token-file", readable}}); err == nil ||
		!strings.Contains(err.Error(), "--metrics-token-file") {
		t.Fatalf("a world-readable token file: %v, want a refusal naming --metrics-token-file", err)
	}
}
