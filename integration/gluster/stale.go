package gluster

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/fusefs/mountinfo"
)

// ClearStale removes what a harness process that died without Close left
// behind — mounts, glusterd, brick and client processes, namespaces, links
// and state directories — recognised by their names and by the owner process
// recorded beside them no longer running. A live harness's state is left
// alone.
func ClearStale() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), statePrefix+"*"))
	for _, dir := range dirs {
		raw, err := os.ReadFile(filepath.Join(dir, "owner.pid"))
		if pid, perr := strconv.Atoi(strings.TrimSpace(string(raw))); err == nil && perr == nil && alive(pid) {
			continue
		}
		for _, mnt := range mountsUnder(dir) {
			unix.Unmount(mnt, unix.MNT_DETACH)
		}
		for _, pid := range processesMatching(func(cmdline []string) bool { return mentions(cmdline, dir) }) {
			sock := socketArg(pid)
			stopProcess(pid)
			if strings.HasSuffix(sock, ".socket") && !strings.HasPrefix(sock, dir+"/") {
				os.Remove(sock)
			}
		}
		os.RemoveAll(dir)
	}
	netns, _ := os.ReadDir("/run/netns")
	for _, e := range netns {
		if staleName(e.Name()) {
			exec.Command("ip", "netns", "del", e.Name()).Run()
		}
	}
	links, _ := net.Interfaces()
	for _, l := range links {
		if staleName(l.Name) {
			exec.Command("ip", "link", "del", l.Name).Run()
		}
	}
}

// staleName reports whether a namespace or link name is one of the harness's
// (`kvg<pid><letter>…`) whose process no longer runs.
func staleName(name string) bool {
	rest, ok := strings.CutPrefix(name, linkPrefix)
	if !ok {
		return false
	}
	digits := len(rest) - len(strings.TrimLeft(rest, "0123456789"))
	pid, err := strconv.Atoi(rest[:digits])
	return err == nil && digits < len(rest) && !alive(pid)
}

// alive reports whether pid runs (a zombie has ended).
func alive(pid int) bool {
	return pid > 0 && unix.Kill(pid, 0) == nil && !zombie(pid)
}

// mountsUnder lists mountpoints at or below dir, deepest first.
func mountsUnder(dir string) []string {
	mounts, err := mountinfo.Read("self")
	if err != nil {
		return nil
	}
	return mountinfo.Under(mounts, dir)
}
