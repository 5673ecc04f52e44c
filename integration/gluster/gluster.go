// Package gluster runs a real GlusterFS volume for tests: a private glusterd,
// one brick in a temporary directory, and two "nodes" — network namespaces,
// each joined to the host by a veth pair and each with its own FUSE client
// mount of the volume. Tests stop the brick or cut a node's link to make the
// shared filesystem unreachable from that node, and Close removes everything
// the harness made: mounts, client, brick and glusterd processes, namespaces,
// links and state directories.
//
// glusterd and the brick serve on the host side of a third veth pair whose
// other end idles in a namespace of its own: an address on one node's pair
// would vanish from the host when that node's link is cut, and with it the
// volume for every node.
//
// Everything glusterd writes (its working directory, run directory, sockets,
// logs) lives in the cluster's own state directory, so the host's
// /var/lib/glusterd is never touched; only the TCP port glusterd listens on
// (24007) is shared with the host, and Setup fails if something else holds it.
package gluster

import (
	"encoding/xml"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

// statePrefix names every state directory the harness creates under the
// system's temporary directory; the stale-state guard looks for it.
const statePrefix = "kvtierfs-gluster-"

// linkPrefix begins every namespace and interface name the harness creates.
const linkPrefix = "kvg"

// glusterdPort is the port glusterd serves volume files on; clients find it
// there by default.
const glusterdPort = 24007

// PingTimeout is the volume's network.ping-timeout: a client whose brick
// stops answering (a cut link) fails its calls with ENOTCONN after this long.
const PingTimeout = 3 * time.Second

// Node is one "machine": a network namespace with its own client mount.
type Node struct {
	// Name is the network namespace's name.
	Name string
	// Mount is the directory where this node's client mounts the volume; it
	// is visible from the host's mount namespace.
	Mount string
	// Addr is the node's address inside its namespace.
	Addr string
	// hostLink is the host side of the node's veth pair.
	hostLink  string
	clientPid int
	netnsMade bool
	linkMade  bool
	mounted   bool
}

// ClientPid is the process id of the node's FUSE client (glusterfs).
func (n *Node) ClientPid() int { return n.clientPid }

// NetnsPath is the namespace's file, for `nsenter --net=`.
func (n *Node) NetnsPath() string { return "/run/netns/" + n.Name }

// Wrapper runs a command inside the node's network namespace but in the
// host's mount namespace, so a FUSE mount it makes is visible outside (`ip
// netns exec` would give it a private mount namespace).
func (n *Node) Wrapper() []string { return []string{"nsenter", "--net=" + n.NetnsPath()} }

// Cluster is a running volume and its nodes.
type Cluster struct {
	// Volume is the volume's name; ServerAddr the host-side address that
	// glusterd and the brick serve on.
	Volume, ServerAddr string
	// Nodes are the client namespaces, in order.
	Nodes []*Node
	// SetupTime is how long Setup took.
	SetupTime time.Duration

	dir        string // state directory (removed by Close)
	brick      string
	server     *Node // the namespace anchoring the server's veth pair
	glusterd   *exec.Cmd
	glusterdUp chan struct{}
	volMade    bool
	closed     bool
	// brickSockets are files glusterd made outside the state directory.
	brickSockets map[string]bool
	// lock is held from Setup to Close: one cluster per machine at a time.
	lock *os.File
}

// Options configures Setup.
type Options struct {
	// Nodes is the number of client namespaces (default 2).
	Nodes int
}

var clusterSeq atomic.Int32

// Start sets up a cluster for a test and closes it when the test ends;
// setup failures fail the test. Under `make unit` (mounttest.UnitEnv set),
// which installs nothing, a machine without GlusterFS skips the test.
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	if os.Getenv(mounttest.UnitEnv) != "" && !Installed() {
		t.Skipf("GlusterFS is not installed and %s forbids installing it (make deps installs it)", mounttest.UnitEnv)
	}
	c, err := Setup(opts)
	if c != nil {
		t.Cleanup(func() {
			if err := c.Close(); err != nil {
				t.Errorf("gluster cleanup: %v", err)
			}
		})
	}
	if err != nil {
		t.Fatalf("gluster setup: %v", err)
	}
	t.Logf("gluster volume %s up in %s", c.Volume, c.SetupTime.Round(time.Millisecond))
	return c
}

// Setup installs GlusterFS if it is missing, clears state a crashed earlier
// run left, and brings up glusterd, the volume and every node's mount. On
// error the returned cluster (when not nil) holds what was made so far; Close
// it.
func Setup(opts Options) (*Cluster, error) {
	if opts.Nodes == 0 {
		opts.Nodes = 2
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("the GlusterFS harness needs root (namespaces, mounts, glusterd)")
	}
	began := time.Now()
	if err := EnsureInstalled(); err != nil {
		return nil, err
	}
	lock, err := lockMachine()
	if err != nil {
		return nil, err
	}
	ClearStale()
	fail := func(err error) (*Cluster, error) {
		lock.Close()
		return nil, err
	}
	if l, err := net.Listen("tcp", fmt.Sprintf(":%d", glusterdPort)); err != nil {
		return fail(fmt.Errorf("port %d is taken (another glusterd?); the harness runs its own: %w", glusterdPort, err))
	} else {
		l.Close()
	}
	subnets, err := freeSubnets(opts.Nodes + 1)
	if err != nil {
		return fail(err)
	}
	dir, err := os.MkdirTemp("", statePrefix)
	if err != nil {
		return fail(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		os.RemoveAll(dir)
		return fail(err)
	}
	tag := fmt.Sprintf("%s%d%c", linkPrefix, os.Getpid(), 'a'+rune(clusterSeq.Add(1)%26))
	c := &Cluster{dir: dir, lock: lock, brickSockets: map[string]bool{}, brick: filepath.Join(dir, "brick"), Volume: "kvt" + filepath.Base(dir)[len(statePrefix):]}
	c.server = &Node{Name: tag + "s", hostLink: tag + "hs", Addr: subnets[0] + ".2"}
	c.ServerAddr = subnets[0] + ".1"
	if err := c.server.link(subnets[0]); err != nil {
		return c, err
	}
	for i := range opts.Nodes {
		n := &Node{Name: fmt.Sprintf("%sn%d", tag, i+1), hostLink: fmt.Sprintf("%sh%d", tag, i+1),
			Addr: subnets[i+1] + ".2", Mount: filepath.Join(dir, fmt.Sprintf("node%d", i+1))}
		c.Nodes = append(c.Nodes, n)
		if err := n.link(subnets[i+1]); err != nil {
			return c, err
		}
	}
	if err := c.startGlusterd(); err != nil {
		return c, err
	}
	if err := c.createVolume(); err != nil {
		return c, err
	}
	for _, n := range c.Nodes {
		if err := c.mount(n); err != nil {
			return c, err
		}
	}
	if err := c.checkXattrs(); err != nil {
		return c, err
	}
	c.SetupTime = time.Since(began)
	return c, nil
}

// Installed reports whether glusterd and mount.glusterfs are on the PATH.
func Installed() bool {
	_, errD := exec.LookPath("glusterd")
	_, errM := exec.LookPath("mount.glusterfs")
	return errD == nil && errM == nil
}

// EnsureInstalled installs glusterfs-server and glusterfs-client with apt-get
// when glusterd or mount.glusterfs is missing.
func EnsureInstalled() error {
	if Installed() {
		return nil
	}
	if out, err := exec.Command("apt-get", "update", "-qq").CombinedOutput(); err != nil {
		return fmt.Errorf("apt-get update: %v\n%s", err, out)
	}
	cmd := exec.Command("apt-get", "install", "-y", "-qq", "glusterfs-server", "glusterfs-client")
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("installing glusterfs-server and glusterfs-client: %v\n%s", err, out)
	}
	return nil
}

// freeSubnets picks n /24 prefixes ("10.231.X") that no address or route on
// the host uses.
func freeSubnets(n int) ([]string, error) {
	out, err := exec.Command("ip", "-o", "addr").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("ip addr: %v\n%s", err, out)
	}
	routes, err := exec.Command("ip", "-o", "route").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("ip route: %v\n%s", err, routes)
	}
	used := string(out) + string(routes)
	var free []string
	for x := 10; x < 250 && len(free) < n; x++ {
		prefix := fmt.Sprintf("10.231.%d", x)
		if !strings.Contains(used, prefix+".") {
			free = append(free, prefix)
		}
	}
	if len(free) < n {
		return nil, errors.New("no free 10.231.x.0/24 subnets for the nodes")
	}
	return free, nil
}

func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

// link creates the node's namespace and its veth pair: PREFIX.1 on the host
// side, PREFIX.2 inside, a default route through the host.
func (n *Node) link(prefix string) error {
	if err := run("ip", "netns", "add", n.Name); err != nil {
		return err
	}
	n.netnsMade = true
	inner := n.hostLink[:len(n.hostLink)-2] + "c" + n.hostLink[len(n.hostLink)-1:]
	if err := run("ip", "link", "add", n.hostLink, "type", "veth", "peer", "name", inner); err != nil {
		return err
	}
	n.linkMade = true
	for _, args := range [][]string{
		{"link", "set", inner, "netns", n.Name},
		{"addr", "add", prefix + ".1/24", "dev", n.hostLink},
		{"link", "set", n.hostLink, "up"},
		{"-n", n.Name, "addr", "add", prefix + ".2/24", "dev", inner},
		{"-n", n.Name, "link", "set", inner, "up"},
		{"-n", n.Name, "link", "set", "lo", "up"},
		{"-n", n.Name, "route", "add", "default", "via", prefix + ".1"},
	} {
		if err := run("ip", args...); err != nil {
			return err
		}
	}
	return nil
}

// unlink deletes the node's veth pair and namespace.
func (n *Node) unlink() error {
	var errs []error
	if n.linkMade {
		// Deleting the namespace deletes its end and with it the pair; the
		// host side goes explicitly in case the inner end never moved.
		if err := exec.Command("ip", "link", "del", n.hostLink).Run(); err == nil || !linkExists(n.hostLink) {
			n.linkMade = false
		}
	}
	if n.netnsMade {
		if err := run("ip", "netns", "del", n.Name); err != nil {
			errs = append(errs, err)
		} else {
			n.netnsMade = false
		}
	}
	if linkExists(n.hostLink) {
		errs = append(errs, fmt.Errorf("link %s still exists", n.hostLink))
	}
	return errors.Join(errs...)
}

func linkExists(name string) bool {
	_, err := net.InterfaceByName(name)
	return err == nil
}

// startGlusterd writes a glusterd volfile that keeps every file of glusterd's
// in the state directory and runs glusterd in the foreground as our child.
func (c *Cluster) startGlusterd() error {
	for _, d := range []string{"wd", "run", "log", c.brick} {
		if err := os.MkdirAll(c.path(d), 0o755); err != nil {
			return err
		}
	}
	vol := fmt.Sprintf(`volume management
    type mgmt/glusterd
    option working-directory %s
    option run-directory %s
    option logging-directory %s
    option glusterd-sockfile %s
    option transport-type socket
    option transport.socket.listen-port %d
    option transport.socket.read-fail-log off
    option ping-timeout 0
    option event-threads 1
    option max-port 60999
end-volume
`, c.path("wd"), c.path("run"), c.path("log"), c.socket(), glusterdPort)
	if err := os.WriteFile(c.path("glusterd.vol"), []byte(vol), 0o644); err != nil {
		return err
	}
	log, err := os.Create(c.path("log", "glusterd.out"))
	if err != nil {
		return err
	}
	defer log.Close()
	c.glusterd = exec.Command("glusterd", "-N", "-f", c.path("glusterd.vol"), "-l", c.path("log", "glusterd.log"), "-p", c.path("run", "glusterd.pid"))
	c.glusterd.Stdout, c.glusterd.Stderr = log, log
	c.glusterd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := c.glusterd.Start(); err != nil {
		return fmt.Errorf("starting glusterd: %w", err)
	}
	c.glusterdUp = make(chan struct{})
	go func() { c.glusterd.Wait(); close(c.glusterdUp) }()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := os.Stat(c.socket()); err == nil {
			if _, err := c.cli("volume", "list"); err == nil {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("glusterd did not answer within 60s: %s", c.logTail("glusterd.log"))
		}
		select {
		case <-c.glusterdUp:
			return fmt.Errorf("glusterd exited: %s", c.logTail("glusterd.log"))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// logTail is the end of a log file in the state directory's log folder.
func (c *Cluster) logTail(name ...string) string {
	files, _ := filepath.Glob(c.path(append([]string{"log"}, name...)...))
	var out []byte
	for _, f := range files {
		b, _ := os.ReadFile(f)
		out = append(out, b...)
	}
	return tail(out)
}

func tail(b []byte) string {
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

func (c *Cluster) path(rel ...string) string {
	return filepath.Join(append([]string{c.dir}, rel...)...)
}

func (c *Cluster) socket() string { return c.path("run", "glusterd.socket") }

// cli runs the gluster CLI against our glusterd.
func (c *Cluster) cli(args ...string) (string, error) {
	argv := append([]string{"--mode=script", "--glusterd-sock=" + c.socket(), "--log-file=" + c.path("log", "cli.log")}, args...)
	out, err := exec.Command("gluster", argv...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("gluster %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// createVolume creates a one-brick volume served on the host-side address,
// sets a short ping timeout so a cut link fails fast, and starts it.
func (c *Cluster) createVolume() error {
	if _, err := c.cli("volume", "create", c.Volume, c.ServerAddr+":"+c.brick, "force"); err != nil {
		return err
	}
	c.volMade = true
	if _, err := c.cli("volume", "set", c.Volume, "network.ping-timeout", strconv.Itoa(int(PingTimeout/time.Second))); err != nil {
		return err
	}
	if _, err := c.cli("volume", "start", c.Volume); err != nil {
		return err
	}
	_, err := c.waitBrick(30 * time.Second)
	return err
}

// volumeStatus is the part of `gluster volume status VOL --xml` we read.
type volumeStatus struct {
	OpRet  int    `xml:"opRet"`
	OpErr  string `xml:"opErrstr"`
	Bricks []struct {
		Path   string `xml:"path"`
		Status int    `xml:"status"`
		Pid    int    `xml:"pid"`
	} `xml:"volStatus>volumes>volume>node"`
}

// BrickPid is the running brick process's id.
func (c *Cluster) BrickPid() (int, error) {
	out, err := c.cli("volume", "status", c.Volume, "--xml")
	if err != nil {
		return 0, err
	}
	var st volumeStatus
	if err := xml.Unmarshal([]byte(out), &st); err != nil {
		return 0, fmt.Errorf("volume status: %w\n%s", err, out)
	}
	for _, b := range st.Bricks {
		if b.Path == c.brick && b.Status == 1 && b.Pid > 0 {
			c.noteBrickSocket(b.Pid)
			return b.Pid, nil
		}
	}
	return 0, fmt.Errorf("brick %s is not online", c.brick)
}

// waitBrick waits until the brick is online and returns its pid.
func (c *Cluster) waitBrick(within time.Duration) (int, error) {
	deadline := time.Now().Add(within)
	for {
		pid, err := c.BrickPid()
		if err == nil || time.Now().After(deadline) {
			return pid, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// noteBrickSocket records the unix socket glusterd gave the brick process
// (glusterd puts it in /var/run/gluster whatever its run directory), for
// Close to remove.
func (c *Cluster) noteBrickSocket(pid int) {
	if sock := socketArg(pid); sock != "" && filepath.Dir(sock) != c.path("run") {
		c.brickSockets[sock] = true
	}
}

// socketArg is the -S argument of a gluster process's command line, if any.
func socketArg(pid int) string {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return ""
	}
	args := strings.Split(string(raw), "\x00")
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "-S" {
			return args[i+1]
		}
	}
	return ""
}

// Brick is the brick's directory: the files the volume stores, as the server
// keeps them.
func (c *Cluster) Brick() string { return c.brick }

// mount mounts the volume on the node's directory from inside its namespace,
// with the client's log in the state directory, and records the client's pid.
func (c *Cluster) mount(n *Node) error {
	if err := os.MkdirAll(n.Mount, 0o755); err != nil {
		return err
	}
	args := append(n.Wrapper(), "mount", "-t", "glusterfs", "-o", "log-file="+c.path("log", n.Name+".log"),
		c.ServerAddr+":/"+c.Volume, n.Mount)
	if err := run(args[0], args[1:]...); err != nil {
		return err
	}
	n.mounted = true
	pids := processesMatching(func(cmdline []string) bool {
		return len(cmdline) > 0 && filepath.Base(cmdline[0]) == "glusterfs" && cmdline[len(cmdline)-1] == n.Mount
	})
	if len(pids) != 1 {
		return fmt.Errorf("found %d client processes for %s, want 1", len(pids), n.Mount)
	}
	n.clientPid = pids[0]
	return nil
}

// checkXattrs makes sure user.* xattrs set through one node are read back
// through another, as the shared store's digests need.
func (c *Cluster) checkXattrs() error {
	probe := ".xattr-probe"
	first, last := c.Nodes[0], c.Nodes[len(c.Nodes)-1]
	if err := os.WriteFile(filepath.Join(first.Mount, probe), []byte("x"), 0o644); err != nil {
		return err
	}
	defer os.Remove(filepath.Join(first.Mount, probe))
	if err := unix.Setxattr(filepath.Join(first.Mount, probe), "user.kvtierfs.probe", []byte("ok"), 0); err != nil {
		return fmt.Errorf("user xattrs on the volume: %w", err)
	}
	buf := make([]byte, 16)
	n, err := unix.Getxattr(filepath.Join(last.Mount, probe), "user.kvtierfs.probe", buf)
	if err != nil || string(buf[:n]) != "ok" {
		return fmt.Errorf("user xattr not read back through %s: %q, %v", last.Name, buf[:max(n, 0)], err)
	}
	return nil
}

// Reachable reports whether the node's client reaches the brick now: a
// lookup of a name nobody made answers ENOENT rather than ENOTCONN.
func (c *Cluster) Reachable(n *Node) bool {
	_, err := os.Stat(filepath.Join(n.Mount, fmt.Sprintf(".probe-%d", time.Now().UnixNano())))
	return errors.Is(err, os.ErrNotExist)
}

// WaitReachable waits until the node's client reaches the brick.
func (c *Cluster) WaitReachable(n *Node, within time.Duration) error {
	deadline := time.Now().Add(within)
	for !c.Reachable(n) {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not reach the volume within %s", n.Name, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil
}

// StopBrick kills the brick process (SIGKILL, as a crashed server): every
// client's calls then fail with ENOTCONN until StartBrick.
func (c *Cluster) StopBrick() error {
	pid, err := c.BrickPid()
	if err != nil {
		return err
	}
	if err := unix.Kill(pid, unix.SIGKILL); err != nil {
		return fmt.Errorf("killing brick %d: %w", pid, err)
	}
	if err := waitGone(pid, 10*time.Second); err != nil {
		return err
	}
	// glusterd notices the brick's death on its own connection; until then
	// `volume start force` would take the brick for running.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := c.BrickPid(); err != nil {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("glusterd still reports the killed brick online after 30s")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// StartBrick restarts a stopped brick (`volume start force`) and waits until
// every node's client reaches it again. glusterd may take a moment to notice
// that a killed brick's connection is gone and until then takes `start force`
// for a no-op, so the start is repeated until the brick is online.
func (c *Cluster) StartBrick() error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := c.cli("volume", "start", c.Volume, "force"); err != nil {
			return err
		}
		_, err := c.waitBrick(5 * time.Second)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w; brick log: %s", err, c.logTail("bricks", "*.log"))
		}
	}
	for _, n := range c.Nodes {
		if err := c.WaitReachable(n, 30*time.Second); err != nil {
			return err
		}
	}
	return nil
}

// CutLink takes the host side of the node's veth pair down: the node's
// packets to the server vanish (its routes stay), so its client's calls hang
// until the ping timeout and then fail with ENOTCONN. Other nodes are not
// affected.
func (c *Cluster) CutLink(n *Node) error {
	return run("ip", "link", "set", n.hostLink, "down")
}

// RestoreLink brings the node's link back up and waits until its client
// reaches the brick again.
func (c *Cluster) RestoreLink(n *Node) error {
	if err := run("ip", "link", "set", n.hostLink, "up"); err != nil {
		return err
	}
	return c.WaitReachable(n, 30*time.Second)
}

// Close unmounts every node, stops and deletes the volume, stops glusterd and
// the brick, deletes the namespaces and links and removes the state
// directory. It is safe on a partly set up cluster and idempotent.
func (c *Cluster) Close() error {
	if c.closed {
		return nil
	}
	var errs []error
	for _, n := range c.Nodes {
		if n.hostLink != "" && linkExists(n.hostLink) {
			run("ip", "link", "set", n.hostLink, "up")
		}
		if n.mounted {
			if err := unix.Unmount(n.Mount, 0); err != nil {
				unix.Unmount(n.Mount, unix.MNT_DETACH)
			}
			n.mounted = false
		}
		if n.clientPid > 0 {
			if err := stopProcess(n.clientPid); err != nil {
				errs = append(errs, fmt.Errorf("client of %s: %w", n.Name, err))
			}
		}
	}
	brickPid := 0
	if c.volMade {
		brickPid, _ = c.BrickPid()
		if _, err := c.cli("volume", "stop", c.Volume, "force"); err != nil {
			errs = append(errs, err)
		}
		if _, err := c.cli("volume", "delete", c.Volume); err != nil {
			errs = append(errs, err)
		}
	}
	if brickPid > 0 {
		if err := stopProcess(brickPid); err != nil {
			errs = append(errs, fmt.Errorf("brick: %w", err))
		}
	}
	if c.glusterd != nil && c.glusterd.Process != nil {
		c.glusterd.Process.Signal(syscall.SIGTERM)
		select {
		case <-c.glusterdUp:
		case <-time.After(10 * time.Second):
			c.glusterd.Process.Kill()
			<-c.glusterdUp
		}
	}
	// Anything else started from our state directory (a brick restarted by
	// StartBrick after the pid above was read, for instance).
	for _, pid := range processesMatching(func(cmdline []string) bool { return mentions(cmdline, c.dir) }) {
		if err := stopProcess(pid); err != nil {
			errs = append(errs, err)
		}
	}
	for _, n := range append([]*Node{c.server}, c.Nodes...) {
		if n != nil {
			if err := n.unlink(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for sock := range c.brickSockets {
		if err := os.Remove(sock); err != nil && !os.IsNotExist(err) {
			errs = append(errs, err)
		}
	}
	if c.dir != "" {
		if err := os.RemoveAll(c.dir); err != nil {
			errs = append(errs, err)
		}
	}
	c.closed = len(errs) == 0
	if c.lock != nil {
		c.lock.Close()
		c.lock = nil
	}
	return errors.Join(errs...)
}

// lockPath is the file whose lock makes clusters on one machine take turns:
// they share glusterd's port, and test packages may run in parallel.
const lockPath = "/run/kvtierfs-gluster.lock"

// lockMachine waits for the machine-wide harness lock (released by Close,
// or by the kernel when the holding process dies).
func lockMachine() (*os.File, error) {
	f, err := os.OpenFile(lockPath, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("locking %s: %w", lockPath, err)
	}
	return f, nil
}

func mentions(cmdline []string, s string) bool {
	for _, a := range cmdline {
		if strings.Contains(a, s) {
			return true
		}
	}
	return false
}

// processesMatching lists the ids of processes whose command line matches.
func processesMatching(match func(cmdline []string) bool) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(raw) == 0 {
			continue
		}
		if match(strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// stopProcess sends SIGTERM, then SIGKILL after 5 s, and waits until the
// process is gone.
func stopProcess(pid int) error {
	if unix.Kill(pid, unix.SIGTERM) != nil {
		return nil
	}
	if waitGone(pid, 5*time.Second) == nil {
		return nil
	}
	unix.Kill(pid, unix.SIGKILL)
	return waitGone(pid, 5*time.Second)
}

// zombie reports whether pid has exited and waits to be reaped.
func zombie(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(stat), ')')
	return i > 0 && strings.HasPrefix(string(stat[i:]), ") Z")
}

// waitGone waits until pid no longer runs (a zombie counts as gone: the
// harness's own children are reaped by their Wait).
func waitGone(pid int, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil || zombie(pid) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("process %d still runs after %s", pid, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
