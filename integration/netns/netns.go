// Package netns gives tests and benchmarks "nodes" with network stacks of
// their own on one machine: network namespaces joined by veth pairs to a
// bridge in a hub namespace. It needs root and iproute2; nothing it makes is
// visible outside the namespaces it creates, and Close removes them all.
package netns

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
)

// Group is n namespaces on one bridge; node i has the address IP(i).
type Group struct {
	names []string // the hub's namespace, then the nodes'
}

// New creates n node namespaces named <prefix><pid>-<i> and their hub, with
// node i at 10.213.9.<i+1>/24 and loopback up. On error it removes whatever
// it made.
func New(prefix string, n int) (_ *Group, err error) {
	if n < 1 || n > 200 {
		return nil, fmt.Errorf("netns: %d nodes, want 1 to 200", n)
	}
	for _, tool := range []string{"ip", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("netns: %s is not installed (iproute2, util-linux): run make deps", tool)
		}
	}
	g := &Group{}
	defer func() {
		if err != nil {
			g.Close()
		}
	}()
	add := func(suffix string) (string, error) {
		name := fmt.Sprintf("%s%d-%s", prefix, os.Getpid(), suffix)
		if err := ip("netns", "add", name); err != nil {
			return "", err
		}
		g.names = append(g.names, name)
		return name, nil
	}
	hub, err := add("hub")
	if err != nil {
		return nil, err
	}
	if err := ips([][]string{{"-n", hub, "link", "add", "br0", "type", "bridge"}, {"-n", hub, "link", "set", "br0", "up"}}); err != nil {
		return nil, err
	}
	for i := range n {
		ns, err := add(strconv.Itoa(i))
		if err != nil {
			return nil, err
		}
		port := fmt.Sprintf("p%d", i)
		if err := ips([][]string{
			{"-n", hub, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns},
			{"-n", hub, "link", "set", port, "master", "br0", "up"},
			{"-n", ns, "addr", "add", g.IP(i) + "/24", "dev", "eth0"},
			{"-n", ns, "link", "set", "eth0", "up"},
			{"-n", ns, "link", "set", "lo", "up"},
		}); err != nil {
			return nil, err
		}
	}
	return g, nil
}

// IP is node i's address.
func (g *Group) IP(i int) string { return fmt.Sprintf("10.213.9.%d", i+1) }

// Wrapper runs a command in node i's network namespace only: `ip netns
// exec` would also give it a private mount namespace and hide its mounts.
func (g *Group) Wrapper(i int) []string {
	return []string{"nsenter", "--net=/var/run/netns/" + g.names[i+1]}
}

// Close removes every namespace of the group (and with them its links).
func (g *Group) Close() error {
	var errs []error
	for _, name := range g.names {
		errs = append(errs, ip("netns", "del", name))
	}
	g.names = nil
	return errors.Join(errs...)
}

func ip(args ...string) error {
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("netns: ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func ips(cmds [][]string) error {
	for _, args := range cmds {
		if err := ip(args...); err != nil {
			return err
		}
	}
	return nil
}
