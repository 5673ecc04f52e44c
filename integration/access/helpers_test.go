// Package access_test checks who may see and use a mount (DESIGN "Threat
// model") with real users the tests create, and that no request or file
// escapes the daemon's bounds.
package access_test

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
	"github.com/kvtierfs/kvtierfs/fusefs/mountinfo"
	"github.com/kvtierfs/kvtierfs/integration/engineio"
	"github.com/kvtierfs/kvtierfs/integration/mounttest"
	"github.com/kvtierfs/kvtierfs/internal/testsys"
)

// helperEnv makes the test binary act as a helper run as another user
// (runHelper) instead of running the tests.
const helperEnv = "KVTIERFS_ACCESS_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(runHelper(os.Args[1:]))
	}
	mounttest.Main(m)
}

// rowBytes is the CI-size row: 64 pages.
const rowBytes = 256 << 10

// tierDir is the engine's per-model directory used by these tests.
const tierDir = "TestModel_0123456789ab_r0"

// hashOf is the chunk hash of block i.
func hashOf(i int) string {
	sum := sha256.Sum256([]byte(fmt.Sprintf("chunk-%d", i)))
	return hex.EncodeToString(sum[:])
}

// runHelper runs one operation on a mount as the user it was started as
// and prints what happened; it exits 0 when the operation succeeded.
//
//	list DIR                    read a directory
//	read FILE                   read a file
//	statfs PATH                 print the counts statfs answers for PATH
//	listen ADDR                 listen on ADDR, print its address, hold it until stdin ends
//	swap-on-open WATCH DIR TARGET  once WATCH is opened, rename DIR away and put a link to TARGET there
//	match MNT KEY               match one key of tierDir through MNT/.kvtier/match
//	listxattr PATH              print the names of PATH's xattrs, space-separated
//	store MNT HASH              store a block as the engine does (O_DIRECT from an shm row)
//	region PATH                 create and map a one-row shm region, hold it until stdin ends
//	without-openat2 BINARY ARGS run BINARY with openat2 answering ENOSYS (execWithoutOpenat2)
func runHelper(args []string) int {
	var err error
	var out string
	switch args[0] {
	case "list":
		var entries []os.DirEntry
		entries, err = os.ReadDir(args[1])
		out = fmt.Sprintf("%d entries", len(entries))
	case "read":
		var data []byte
		data, err = os.ReadFile(args[1])
		out = fmt.Sprintf("%d bytes", len(data))
	case "match":
		out, err = matchOne(args[1], args[2])
	case "listxattr":
		names := make([]byte, 64<<10)
		var n int
		n, err = syscall.Listxattr(args[1], names)
		out = strings.Join(strings.Fields(strings.ReplaceAll(string(names[:max(n, 0)]), "\x00", " ")), " ")
	case "listen":
		var l net.Listener
		if l, err = net.Listen("tcp", args[1]); err == nil {
			fmt.Println(l.Addr())
			io.Copy(io.Discard, os.Stdin)
			l.Close()
		}
	case "swap-on-open":
		err = swapOnOpen(args[1], args[2], args[3])
		out = "swapped"
	case "statfs":
		var st syscall.Statfs_t
		err = syscall.Statfs(args[1], &st)
		out = fmt.Sprintf("blocks %d free %d avail %d files %d ffree %d frsize %d", st.Blocks, st.Bfree, st.Bavail, st.Files, st.Ffree, st.Frsize)
	case "store":
		err = storeOne(args[1], args[2])
		out = "stored"
	case "region":
		var region *engineio.Region
		if region, err = engineio.CreateRegion(args[1], 1, rowBytes); err == nil {
			fmt.Println("mapped")
			io.Copy(io.Discard, os.Stdin)
			region.Close()
		}
	case "without-openat2":
		err = execWithoutOpenat2(args[1:])
	default:
		err = fmt.Errorf("unknown helper operation %q", args[0])
	}
	if err != nil {
		fmt.Println(err)
		return 1
	}
	fmt.Println(out)
	return 0
}

// swapOnOpen waits until watch is opened, then renames dir to dir.old and
// puts a link to target in its place, as a user who may write dir's parent
// can.
func swapOnOpen(watch, dir, target string) error {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if _, err := unix.InotifyAddWatch(fd, watch, unix.IN_OPEN); err != nil {
		return err
	}
	fmt.Println("watching")
	if _, err := unix.Read(fd, make([]byte, 4096)); err != nil {
		return err
	}
	if err := os.Rename(dir, dir+".old"); err != nil {
		return err
	}
	return os.Symlink(target, dir)
}

// matchOne writes a one-key request to the match file and reads the answer.
func matchOne(mnt, key string) (string, error) {
	f, err := os.OpenFile(filepath.Join(mnt, ctlabi.Dir, ctlabi.MatchFile), os.O_RDWR, 0)
	if err != nil {
		return "", err
	}
	defer f.Close()
	request := fmt.Sprintf(`{"tier":%q,"groups":[{"group":0,"kind":"full","keys":[%q]}]}`, tierDir, key)
	if _, err := f.WriteString(request); err != nil {
		return "", err
	}
	answer := make([]byte, 4096)
	n, err := f.ReadAt(answer, 0)
	if n == 0 {
		return "", err
	}
	return string(bytes.TrimSpace(answer[:n])), nil
}

// storeOne stores block hash from a row of a region of the caller's own.
func storeOne(mnt, hash string) error {
	region, err := engineio.CreateRegion(fmt.Sprintf("/dev/shm/kvtier-access-%d.mmap", os.Getpid()), 1, rowBytes)
	if err != nil {
		return err
	}
	defer region.Close()
	engineio.FillPattern(region.Row(0), 1)
	tier, err := engineio.OpenTier(mnt)
	if err != nil {
		return err
	}
	_, err = tier.Store(tier.BlockPath(tierDir, 0, hash), region.Row(0))
	return err
}

// testUser is an unprivileged user created for one test.
type testUser struct {
	name     string
	uid, gid int
}

// newUser creates a user (with its own group) that is deleted when the test ends.
func newUser(t *testing.T, role string) testUser {
	name, uid, gid := testsys.NewUser(t, "kvt"+role)
	return testUser{name: name, uid: uid, gid: gid}
}

// sharedDir is a directory every user may enter, removed when the test ends.
func sharedDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "kvtierfs-access-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// binaries copies this test binary and kvtierfs where every user may run them.
func binaries(t *testing.T, dir string) (helper, kvtierfs string) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	helper, kvtierfs = filepath.Join(dir, "helper"), filepath.Join(dir, "kvtierfs")
	for src, dst := range map[string]string{self: helper, mounttest.Binary(): kvtierfs} {
		mounttest.CopyExecutable(t, src, dst)
	}
	return helper, kvtierfs
}

// as runs a command as u; it returns the command's output and whether it succeeded.
func as(u testUser, env []string, name string, args ...string) (string, bool) {
	cmd := exec.Command(name, args...)
	cmd.Env = env
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(u.uid), Gid: uint32(u.gid)}}
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err == nil
}

// startHelperAs starts a helper operation as u and returns the first line
// it prints; its stdin stays open, and the helper is ended and reaped, when
// the test ends.
func startHelperAs(t *testing.T, u testUser, helper string, args ...string) string {
	t.Helper()
	cmd := exec.Command(helper, args...)
	cmd.Env = []string{helperEnv + "=1"}
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(u.uid), Gid: uint32(u.gid)}}
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
	t.Cleanup(func() {
		stdin.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("helper %v as %s: %q, %v", args, u.name, line, err)
	}
	return strings.TrimSpace(line)
}

// helperAs runs a helper operation as u.
func helperAs(u testUser, helper string, args ...string) (string, bool) {
	return as(u, []string{helperEnv + "=1"}, helper, args...)
}

// vmRSS is a process's resident set size in bytes, from /proc/PID/status.
func vmRSS(t *testing.T, pid int) int64 {
	t.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
}

// mountOptions returns the super options of the filesystem mounted at mnt
// from /proc/self/mountinfo.
func mountOptions(t *testing.T, mnt string) string {
	t.Helper()
	mounts, err := mountinfo.Read("self")
	if err != nil {
		t.Fatal(err)
	}
	at := mountinfo.At(mounts, mnt)
	if len(at) == 0 {
		t.Fatalf("%s is not in /proc/self/mountinfo", mnt)
	}
	return at[len(at)-1].SuperOptions
}
