package main

import (
	"bufio"
	"context"
	"errors"
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

	"github.com/kvtierfs/kvtierfs/internal/testsys"
	"github.com/kvtierfs/kvtierfs/tiers/shm"
)

// helperEnv makes the test binary a process that maps (map), opens (open),
// opens through a bind mount of its directory in a mount namespace of its
// own (bind), or maps as a kvtierfs daemon would (daemon) the file named by
// helperFileEnv, then waits until its stdin closes.
const (
	helperEnv     = "KVTIERFS_TEST_REGION_HELPER"
	helperFileEnv = "KVTIERFS_TEST_REGION_FILE"
	// helperBindEnv names the directory the bind helper mounts on.
	helperBindEnv = "KVTIERFS_TEST_REGION_BIND"
)

// testOwners are the owners of the regions these tests create.
var testOwners = shm.RegionOwners(uint32(os.Getuid()))

// TestRegionHelperProcess is the helper process itself; it does nothing in
// a normal test run.
func TestRegionHelperProcess(t *testing.T) {
	mode := os.Getenv(helperEnv)
	if mode == "" {
		return
	}
	path := os.Getenv(helperFileEnv)
	if mode == "bind" {
		bind := os.Getenv(helperBindEnv)
		if err := unix.Mount(filepath.Dir(path), bind, "", unix.MS_BIND, ""); err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		path = filepath.Join(bind, filepath.Base(path))
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	if mode == "daemon" {
		os.WriteFile("/proc/self/comm", []byte("kvtierfs"), 0)
	}
	if mode == "map" || mode == "daemon" {
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
// when stop is called.
func startRegionHelper(t *testing.T, mode, file string) (stop func(), pid int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestRegionHelperProcess$")
	cmd.Env = append(os.Environ(), helperEnv+"="+mode, helperFileEnv+"="+file)
	if mode == "bind" {
		cmd.Env = append(cmd.Env, helperBindEnv+"="+t.TempDir())
		cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	}
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
	return stop, cmd.Process.Pid
}

// TestOrphanedRegions creates regions mapped by a live process, held open
// by one, held open by one through a mount only its own mount namespace
// has, mapped only by a kvtierfs daemon, and used by none, plus a
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
	mapped, opened, bound, daemonOnly, orphan := region("mapped"), region("opened"), region("bound"), region("daemon"), region("orphan")
	target := filepath.Join(t.TempDir(), "not-a-region")
	if err := os.WriteFile(target, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, prefix+"link.mmap")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(link) })

	stopMapper, _ := startRegionHelper(t, "map", mapped)
	startRegionHelper(t, "open", opened)
	startRegionHelper(t, "bind", bound)
	startRegionHelper(t, "daemon", daemonOnly)

	paths := func(rs []regionFile) []string {
		var out []string
		for _, r := range rs {
			out = append(out, r.path)
		}
		slices.Sort(out)
		return out
	}
	scan, err := scanRegions(glob, testOwners)
	if err != nil {
		t.Fatal(err)
	}
	wantOrphans := []string{daemonOnly, orphan}
	slices.Sort(wantOrphans)
	if got := paths(scan.orphans); !slices.Equal(got, wantOrphans) {
		t.Fatalf("orphans %v, want %v", got, wantOrphans)
	}
	wantInUse := []string{mapped, opened, bound}
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
	for _, p := range []string{mapped, opened, bound, daemonOnly, orphan, link, target} {
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
	for _, p := range []string{mapped, opened, bound, link, target} {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("gc-regions removed %s, which it must keep: %v", p, err)
		}
	}

	stopMapper()
	if scan, err = scanRegions(glob, testOwners); err != nil {
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
	scan, err := scanRegions(p, testOwners)
	if err != nil || len(scan.orphans) != 1 {
		t.Fatalf("scan: %+v, %v", scan, err)
	}
	scan.unreadable = nil // a sandbox's PID 1 may be out of reach; it is no engine
	stop, _ := startRegionHelper(t, "map", p)
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
	if scan, err = scanRegions(p, testOwners); err != nil || len(scan.orphans) != 1 || scan.orphans[0].path != left {
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

func (f *hangingFile) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	return nil, fuse.FOPEN_DIRECT_IO, 0
}

// hangingRoot is the hung server's root, holding its one file, of inode
// number ino, as "held".
type hangingRoot struct {
	fs.Inode
	file *hangingFile
	ino  uint64
}

func (r *hangingRoot) OnAdd(ctx context.Context) {
	r.AddChild("held", r.NewPersistentInode(ctx, r.file, fs.StableAttr{Mode: fuse.S_IFREG, Ino: r.ino}), false)
}

// TestGCRegionsSkipsHungFUSEFiles: a process holds a file open on a FUSE
// mount whose server no longer answers (the kvtierfs daemon stopped, which
// every engine holds files of); the file has the inode number of an
// orphan, so the scan must tell the two apart. The scans stat-ed each
// descriptor, which waited on the server until --timeout, and removed
// nothing; they read the descriptor's mount from fdinfo and the mount
// table instead, and the orphan is removed.
func TestGCRegionsSkipsHungFUSEFiles(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipped: the hung FUSE server is mounted as root")
	}
	p := filepath.Join("/dev/shm", fmt.Sprintf("kvtierfs-orphan-hung-%d.mmap", os.Getpid()))
	if err := os.WriteFile(p, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(p) })
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	file := &hangingFile{hang: make(chan struct{}), release: make(chan struct{})}
	mnt := t.TempDir()
	zero := time.Duration(0)
	srv, err := fs.Mount(mnt, &hangingRoot{file: file, ino: st.Ino}, &fs.Options{AttrTimeout: &zero, EntryTimeout: &zero})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Unmount() })
	t.Cleanup(func() { close(file.release) })
	_, holder := startRegionHelper(t, "open", filepath.Join(mnt, "held"))
	if !holdsInode(t, holder, st.Ino) {
		t.Fatalf("the helper holds no descriptor of inode %d", st.Ino)
	}
	close(file.hang)

	scan, err := scanRegionsWithin(p, testOwners, 5*time.Second)
	if err != nil || len(scan.orphans) != 1 {
		t.Fatalf("scan while a process holds a hung FUSE file: %+v, %v", scan, err)
	}
	scan.unreadable = nil // a sandbox's PID 1 may be out of reach; it is no engine
	var out strings.Builder
	if err := gcRegions(&out, scan, false, time.Millisecond, 5*time.Second); err != nil || !strings.Contains(out.String(), "removed "+p) {
		t.Fatalf("gc-regions while a process holds a hung FUSE file: %v\n%s", err, out.String())
	}
	if _, err := os.Lstat(p); err == nil {
		t.Fatal("the orphan is still there")
	}
}

// holdsInode tells whether process pid holds a descriptor of inode ino,
// from its fdinfo.
func holdsInode(t *testing.T, pid int, ino uint64) bool {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fdinfo", pid)
	fds, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		if _, got, err := readFdinfo(filepath.Join(dir, fd.Name())); err == nil && got == ino {
			return true
		}
	}
	return false
}

// TestGCRegionsRescanIsBounded: the scan after the grace, when it does not
// finish within --timeout (a process stuck in the kernel holding its
// mappings), gives every orphan its name back.
func TestGCRegionsRescanIsBounded(t *testing.T) {
	p := filepath.Join("/dev/shm", fmt.Sprintf("kvtierfs-orphan-stuck-%d.mmap", os.Getpid()))
	if err := os.WriteFile(p, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(p) })
	scan, err := scanRegions(p, testOwners)
	if err != nil || len(scan.orphans) != 1 {
		t.Fatalf("scan: %+v, %v", scan, err)
	}
	scan.unreadable = nil // a sandbox's PID 1 may be out of reach; it is no engine
	stuck := make(chan struct{})
	defer close(stuck)
	scanProcesses = func(map[fileID]bool) (map[fileID]bool, []int, error) { <-stuck; return nil, nil, nil }
	defer func() { scanProcesses = filesInUse }()
	var out strings.Builder
	if err := gcRegions(&out, scan, false, time.Millisecond, 2*time.Second); err == nil ||
		!strings.Contains(out.String(), "did not finish within 2s") || !strings.Contains(out.String(), "(name given back)") {
		t.Errorf("gc-regions whose rescan hangs: %v\n%s", err, out.String())
	}
	if _, err := os.Stat(p); err != nil {
		t.Errorf("the orphan lost its name: %v", err)
	}
	if names, _ := filepath.Glob(asideGlob(p)); len(names) != 0 {
		t.Errorf("renamed aside and left there: %v", names)
	}
}

// testUser is an unprivileged user created for one test.
type testUser struct {
	name string
	uid  uint32
}

// newTestUser creates a user that is deleted when the test ends.
func newTestUser(t *testing.T, role string) testUser {
	name, uid, _ := testsys.NewUser(t, "kvgc"+role)
	return testUser{name: name, uid: uint32(uid)}
}

// TestGCRegionsLeavesOtherUsersFiles: /dev/shm is every local user's, and
// gc-regions runs as root. Under the glob lie an orphan and a mapped region
// of the engine's user, an orphan of root's, and another user's 1 TiB sparse
// file and file named as gc-regions renames orphans aside. Only the files
// of root and the engine's uid are regions: the other user's are listed as
// not the engine's and left, and stat does not count them as orphaned (it
// listed the 1 TiB file, and gc-regions removed it). Without the engine's
// uid, gc-regions takes root's orphans only.
func TestGCRegionsLeavesOtherUsersFiles(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipped: creating users and giving files to them needs root")
	}
	engine, other := newTestUser(t, "eng"), newTestUser(t, "oth")
	prefix := fmt.Sprintf("/dev/shm/kvtierfs-owners-test-%d-", os.Getpid())
	glob := prefix + "*.mmap"
	file := func(path string, size int64, owner uint32) string {
		if err := os.WriteFile(path, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove(path) })
		if err := os.Truncate(path, size); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(path, int(owner), -1); err != nil {
			t.Fatal(err)
		}
		return path
	}
	engineOrphan := file(prefix+"engine.mmap", 8192, engine.uid)
	engineMapped := file(prefix+"mapped.mmap", 8192, engine.uid)
	rootOrphan := file(prefix+"root.mmap", 8192, 0)
	foreign := file(prefix+"foreign.mmap", 1<<40, other.uid)
	foreignAside := file(filepath.Join("/dev/shm", quarantinePrefix+"0123456789abcdef-"+filepath.Base(prefix)+"aside.mmap"), 4096, other.uid)
	startRegionHelper(t, "map", engineMapped)

	paths := func(rs []regionFile) []string {
		var out []string
		for _, r := range rs {
			out = append(out, r.path)
		}
		slices.Sort(out)
		return out
	}
	scan := func(owners []uint32) regionScan {
		t.Helper()
		s, err := scanRegions(glob, owners)
		if err != nil {
			t.Fatal(err)
		}
		s.unreadable = nil // a sandbox's PID 1 may be out of reach; it is no engine
		return s
	}
	present := func(path string) bool { _, err := os.Lstat(path); return err == nil }

	// gc-regions as root without --engine-uid: root's orphan alone.
	var out strings.Builder
	if err := gcRegions(&out, scan(shm.RegionOwners(0)), false, time.Millisecond, time.Minute); err != nil {
		t.Fatalf("gc-regions for root: %v\n%s", err, out.String())
	}
	for _, want := range []string{"removed " + rootOrphan, fmt.Sprintf("not the engine's (uid %d): left %s (8.0 KiB)", engine.uid, engineOrphan),
		fmt.Sprintf("not the engine's (uid %d): left %s (1.0 TiB)", other.uid, foreign), "1 orphaned regions removed"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("gc-regions for root lacks %q:\n%s", want, out.String())
		}
	}
	if present(rootOrphan) || !present(engineOrphan) || !present(engineMapped) || !present(foreign) || !present(foreignAside) {
		t.Fatalf("gc-regions for root: root's orphan removed %v, the engine's files kept %v %v, the other user's kept %v %v",
			!present(rootOrphan), present(engineOrphan), present(engineMapped), present(foreign), present(foreignAside))
	}

	// gc-regions --engine-uid: the engine's orphan too, never the other user's.
	rootOrphan = file(rootOrphan, 8192, 0)
	s := scan(shm.RegionOwners(engine.uid))
	if got, want := paths(s.orphans), []string{engineOrphan, rootOrphan}; !slices.Equal(got, want) {
		t.Fatalf("orphans %v, want %v", got, want)
	}
	if got, want := paths(s.others), []string{foreignAside, foreign}; !slices.Equal(got, want) {
		t.Fatalf("other users' files %v, want %v", got, want)
	}
	out.Reset()
	printOrphans(&out, s)
	if !strings.Contains(out.String(), "orphaned regions: 2 mapped by no process") || strings.Contains(out.String(), foreign) ||
		!strings.Contains(out.String(), "other users' files under the glob: 2 (1.0 TiB), not the engine's regions") {
		t.Errorf("stat's orphan lines:\n%s", out.String())
	}
	out.Reset()
	if err := gcRegions(&out, s, true, time.Millisecond, time.Minute); err != nil || strings.Contains(out.String(), "would remove "+foreign) ||
		!strings.Contains(out.String(), "would remove "+engineOrphan) {
		t.Errorf("gc-regions --dry-run: %v\n%s", err, out.String())
	}
	out.Reset()
	if err := gcRegions(&out, s, false, time.Millisecond, time.Minute); err != nil {
		t.Fatalf("gc-regions --engine-uid: %v\n%s", err, out.String())
	}
	if present(engineOrphan) || present(rootOrphan) || !present(engineMapped) || !present(foreign) || !present(foreignAside) {
		t.Fatalf("gc-regions --engine-uid: orphans removed %v %v, the mapped region kept %v, the other user's files kept %v %v\n%s",
			!present(engineOrphan), !present(rootOrphan), present(engineMapped), present(foreign), present(foreignAside), out.String())
	}
}

// TestParseFdinfo reads the mount id and inode of a descriptor from its
// fdinfo, and refuses a kernel's that names no inode (before Linux 5.14).
func TestParseFdinfo(t *testing.T) {
	mount, inode, err := parseFdinfo("pos:\t0\nflags:\t0100002\nmnt_id:\t31\nino:\t1234\n")
	if err != nil || mount != 31 || inode != 1234 {
		t.Errorf("fdinfo of Linux 6: mount %d inode %d, %v", mount, inode, err)
	}
	if _, _, err := parseFdinfo("pos:\t0\nflags:\t0100002\nmnt_id:\t31\n"); !errors.Is(err, errNoFdinfoInode) {
		t.Errorf("fdinfo of Linux 5.4: %v, want errNoFdinfoInode", err)
	}
	if _, _, err := parseFdinfo("pos:\t0\nflags:\t0100002\nmnt_id:\tx\nino:\t1\n"); err == nil || errors.Is(err, errNoFdinfoInode) {
		t.Errorf("a malformed mnt_id: %v", err)
	}
}

// TestOtherUsersFilesListedBounded: any local user can put as many files
// under the glob as /dev/shm holds; gc-regions names the first 20 of them.
func TestOtherUsersFilesListedBounded(t *testing.T) {
	var scan regionScan
	for i := range maxOrphansListed + 5 {
		scan.others = append(scan.others, regionFile{path: fmt.Sprintf("/dev/shm/vllm_offload_%d.mmap", i), size: 4096, uid: 1234})
	}
	var out strings.Builder
	if err := gcRegions(&out, scan, true, time.Millisecond, time.Minute); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out.String(), "not the engine's (uid 1234): left"); n != maxOrphansListed || !strings.Contains(out.String(), "and 5 more files not the engine's: left") {
		t.Errorf("%d files named:\n%s", n, out.String())
	}
}
