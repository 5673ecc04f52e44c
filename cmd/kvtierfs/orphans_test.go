package main

import (
	"bufio"
	"context"
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

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// helperEnv makes the test binary a process that maps (map), opens (open)
// or maps as a kvtierfs daemon would (daemon) the file named by
// helperFileEnv, then waits until its stdin closes.
const (
	helperEnv     = "KVTIERFS_TEST_REGION_HELPER"
	helperFileEnv = "KVTIERFS_TEST_REGION_FILE"
)

// TestRegionHelperProcess is the helper process itself; it does nothing in
// a normal test run.
func TestRegionHelperProcess(t *testing.T) {
	mode := os.Getenv(helperEnv)
	if mode == "" {
		return
	}
	f, err := os.OpenFile(os.Getenv(helperFileEnv), os.O_RDWR, 0)
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	if mode == "daemon" {
		os.WriteFile("/proc/self/comm", []byte("kvtierfs"), 0)
	}
	if mode != "open" {
		if _, err := unix.Mmap(int(f.Fd()), 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		f.Close()
	}
	fmt.Println("ready")
	bufio.NewReader(os.Stdin).ReadString('\n')
	os.Exit(0)
}

// startRegionHelper starts a helper process on file; it ends at cleanup or
// when the returned function is called.
func startRegionHelper(t *testing.T, mode, file string) (stop func()) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestRegionHelperProcess$")
	cmd.Env = append(os.Environ(), helperEnv+"="+mode, helperFileEnv+"="+file)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			stdin.Close()
			cmd.Wait()
		}
	}
	t.Cleanup(stop)
	if line, _ := bufio.NewReader(stdout).ReadString('\n'); line != "ready\n" {
		stop()
		t.Fatalf("helper %s on %s: %q", mode, file, line)
	}
	return stop
}

// TestOrphanedRegions creates regions mapped by a live process, held open
// by one, mapped only by a kvtierfs daemon, and used by none, plus a
// symlink matching the glob: only the unused ones are orphans, gc-regions
// --dry-run removes nothing, gc-regions removes exactly the orphans, and a
// region becomes an orphan when the process mapping it exits.
func TestOrphanedRegions(t *testing.T) {
	dir := "/dev/shm"
	prefix := fmt.Sprintf("kvtierfs-orphan-test-%d-", os.Getpid())
	glob := filepath.Join(dir, prefix+"*.mmap")
	region := func(name string) string {
		p := filepath.Join(dir, prefix+name+".mmap")
		if err := os.WriteFile(p, make([]byte, 8192), 0o600); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove(p) })
		return p
	}
	mapped, opened, daemonOnly, orphan := region("mapped"), region("opened"), region("daemon"), region("orphan")
	target := filepath.Join(t.TempDir(), "not-a-region")
	if err := os.WriteFile(target, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, prefix+"link.mmap")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(link) })

	stopMapper := startRegionHelper(t, "map", mapped)
	startRegionHelper(t, "open", opened)
	startRegionHelper(t, "daemon", daemonOnly)

	paths := func(rs []regionFile) []string {
		var out []string
		for _, r := range rs {
			out = append(out, r.path)
		}
		slices.Sort(out)
		return out
	}
	scan, err := scanRegions(glob)
	if err != nil {
		t.Fatal(err)
	}
	wantOrphans := []string{daemonOnly, orphan}
	slices.Sort(wantOrphans)
	if got := paths(scan.orphans); !slices.Equal(got, wantOrphans) {
		t.Fatalf("orphans %v, want %v", got, wantOrphans)
	}
	wantInUse := []string{mapped, opened}
	slices.Sort(wantInUse)
	if got := paths(scan.inUse); !slices.Equal(got, wantInUse) {
		t.Fatalf("in use %v, want %v", got, wantInUse)
	}
	var out strings.Builder
	printOrphans(&out, scan)
	if !strings.Contains(out.String(), "orphaned regions: 2 mapped by no process") || !strings.Contains(out.String(), orphan+"  8.0 KiB") {
		t.Errorf("stat's orphan lines:\n%s", out.String())
	}

	// Unreadable processes might map a region: nothing is removed.
	unproven := scan
	unproven.unreadable = []int{os.Getpid()}
	if err := gcRegions(io.Discard, unproven, false, time.Millisecond, time.Minute); err == nil || !strings.Contains(err.Error(), "no region is proven orphaned") {
		t.Fatalf("gc-regions with an unreadable process: %v", err)
	}
	var st unix.Stat_t
	if unix.Lstat(orphan, &st) != nil {
		t.Fatal("gc-regions removed a region while a process was unreadable")
	}
	// --dry-run still lists what stat calls orphaned, as not proven.
	out.Reset()
	if err := gcRegions(&out, unproven, true, time.Millisecond, time.Minute); err == nil || !strings.Contains(out.String(), "not proven orphaned "+orphan) {
		t.Fatalf("gc-regions --dry-run with an unreadable process: %v\n%s", err, out.String())
	}
	if len(scan.unreadable) > 0 {
		// A sandbox's PID 1 may be out of even root's reach; it is no engine.
		t.Logf("processes %v unreadable here; going on with the readable ones", scan.unreadable)
		scan.unreadable = nil
	}

	out.Reset()
	if err := gcRegions(&out, scan, true, time.Millisecond, time.Minute); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{mapped, opened, daemonOnly, orphan, link, target} {
		if _, err := os.Lstat(p); err != nil {
			t.Fatalf("--dry-run removed %s: %v", p, err)
		}
	}
	if !strings.Contains(out.String(), "would remove "+orphan) {
		t.Errorf("--dry-run printed:\n%s", out.String())
	}

	out.Reset()
	if err := gcRegions(&out, scan, false, time.Millisecond, time.Minute); err != nil {
		t.Fatalf("gc-regions: %v\n%s", err, out.String())
	}
	for _, p := range []string{daemonOnly, orphan} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("gc-regions kept the orphan %s", p)
		}
	}
	for _, p := range []string{mapped, opened, link, target} {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("gc-regions removed %s, which it must keep: %v", p, err)
		}
	}

	stopMapper()
	if scan, err = scanRegions(glob); err != nil {
		t.Fatal(err)
	}
	if got := paths(scan.orphans); !slices.Equal(got, []string{mapped}) {
		t.Fatalf("after the mapping process exited: orphans %v, want [%s]", got, mapped)
	}
}

// TestGCRegionsRechecks keeps a region mapped since the scan, under its
// name, and one replaced since the scan; it removes nothing else.
func TestGCRegionsRechecks(t *testing.T) {
	p := filepath.Join("/dev/shm", fmt.Sprintf("kvtierfs-orphan-recheck-%d.mmap", os.Getpid()))
	if err := os.WriteFile(p, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(p) })
	scan, err := scanRegions(p)
	if err != nil || len(scan.orphans) != 1 {
		t.Fatalf("scan: %+v, %v", scan, err)
	}
	scan.unreadable = nil // a sandbox's PID 1 may be out of reach; it is no engine
	stop := startRegionHelper(t, "map", p)
	var out strings.Builder
	if err := gcRegions(&out, scan, false, time.Millisecond, time.Minute); err == nil || !strings.Contains(out.String(), "a process opened or mapped it since the scan (name given back)") {
		t.Fatalf("gc-regions of a region mapped since the scan: %v\n%s", err, out.String())
	}
	stop()
	replaced := scan
	replaced.orphans = []regionFile{scan.orphans[0]}
	replaced.orphans[0].id.inode++
	out.Reset()
	if err := gcRegions(&out, replaced, false, time.Millisecond, time.Minute); err == nil || !strings.Contains(out.String(), "replaced since the scan") {
		t.Fatalf("gc-regions of a replaced region: %v\n%s", err, out.String())
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatal("the region was removed")
	}
	if names, _ := filepath.Glob(asideGlob(p)); len(names) != 0 {
		t.Fatalf("quarantine names left behind: %v", names)
	}

	// What a gc-regions killed during its grace leaves renamed aside is an
	// orphan of the next one.
	left := filepath.Join("/dev/shm", quarantinePrefix+"0123456789abcdef-"+filepath.Base(p))
	if err := os.Rename(p, left); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(left) })
	if scan, err = scanRegions(p); err != nil || len(scan.orphans) != 1 || scan.orphans[0].path != left {
		t.Fatalf("scan after a killed gc-regions: %+v, %v", scan, err)
	}
	scan.unreadable = nil
	if err := gcRegions(io.Discard, scan, false, time.Millisecond, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(left); err == nil {
		t.Fatal("a region left renamed aside was kept")
	}
}

// TestPrintableNames: names with escape sequences, other control bytes or
// invalid UTF-8 are quoted in gc-regions' and stat's output, plain ones not.
func TestPrintableNames(t *testing.T) {
	esc := "/dev/shm/vllm_offload_\x1b]0;owned\x07\x1b[2J.mmap"
	scan := regionScan{orphans: []regionFile{{path: esc, size: 4096}, {path: "/dev/shm/vllm_offload_plain.mmap", size: 4096}}}
	var out strings.Builder
	gcRegions(&out, scan, true, time.Millisecond, time.Minute)
	printOrphans(&out, scan)
	if strings.ContainsAny(out.String(), "\x1b\x07") {
		t.Fatalf("raw control bytes in the output: %q", out.String())
	}
	for _, want := range []string{`would remove "/dev/shm/vllm_offload_\x1b]0;owned\a\x1b[2J.mmap"`, "would remove /dev/shm/vllm_offload_plain.mmap (4.0 KiB)",
		`  "/dev/shm/vllm_offload_\x1b]0;owned\a\x1b[2J.mmap"  4.0 KiB`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

// hangingFile is a file whose attributes, once hang is closed, are answered
// only when release is: a hung FUSE server's file (a stopped daemon's).
type hangingFile struct {
	fs.Inode
	hang, release chan struct{}
}

func (f *hangingFile) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	select {
	case <-f.hang:
		<-f.release
	default:
	}
	out.Mode = fuse.S_IFREG | 0o600
	return 0
}

// hangingRoot is the hung server's root, holding its one file as "held".
type hangingRoot struct {
	fs.Inode
	file *hangingFile
}

func (r *hangingRoot) OnAdd(ctx context.Context) {
	r.AddChild("held", r.NewPersistentInode(ctx, r.file, fs.StableAttr{Mode: fuse.S_IFREG}), false)
}

func (f *hangingFile) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	return nil, fuse.FOPEN_DIRECT_IO, 0
}

// TestGCRegionsRescanIsBounded: a process holds a file open on a FUSE mount
// whose server stops answering during gc-regions' grace (the kvtierfs
// daemon stopped, which every engine holds files of). The scan after the
// grace stats each descriptor and waited in the kernel for good, --timeout
// unheeded, every orphan left renamed aside. It gives up at the timeout,
// and the orphan gets its name back.
func TestGCRegionsRescanIsBounded(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipped: the hung FUSE server is mounted as root")
	}
	file := &hangingFile{hang: make(chan struct{}), release: make(chan struct{})}
	mnt := t.TempDir()
	zero := time.Duration(0)
	srv, err := fs.Mount(mnt, &hangingRoot{file: file}, &fs.Options{AttrTimeout: &zero, EntryTimeout: &zero})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Unmount() })
	released := false
	releaseHang := func() {
		if !released {
			released = true
			close(file.release)
		}
	}
	t.Cleanup(releaseHang)
	startRegionHelper(t, "open", filepath.Join(mnt, "held"))

	p := filepath.Join("/dev/shm", fmt.Sprintf("kvtierfs-orphan-hung-%d.mmap", os.Getpid()))
	if err := os.WriteFile(p, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(p) })
	scan, err := scanRegions(p)
	if err != nil || len(scan.orphans) != 1 {
		t.Fatalf("scan: %+v, %v", scan, err)
	}
	scan.unreadable = nil // a sandbox's PID 1 may be out of reach; it is no engine
	close(file.hang)
	var out strings.Builder
	done := make(chan error, 1)
	go func() { done <- gcRegions(&out, scan, false, time.Millisecond, 100*time.Millisecond) }()
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		releaseHang()
		<-done
		t.Fatalf("gc-regions --timeout 100ms still waited on the hung file a minute later:\n%s", out.String())
	}
	if err == nil || !strings.Contains(out.String(), "did not finish within 100ms") || !strings.Contains(out.String(), "(name given back)") {
		t.Errorf("gc-regions whose rescan hangs: %v\n%s", err, out.String())
	}
	if _, err := os.Stat(p); err != nil {
		t.Errorf("the orphan lost its name: %v", err)
	}
	if names, _ := filepath.Glob(asideGlob(p)); len(names) != 0 {
		t.Errorf("renamed aside and left there: %v", names)
	}
}
