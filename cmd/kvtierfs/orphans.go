package main

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
	"github.com/kvtierfs/kvtierfs/fusefs/mountinfo"
	"github.com/kvtierfs/kvtierfs/tiers/shm"
)

// Orphaned engine regions: an engine that dies leaves its shm region behind
// (vllm_offload_*.mmap), and each restart adds one, until /dev/shm is full.
// A region is a regular file under the glob owned by root or the engine's
// uid (shm.RegionOwners); it is orphaned when no process but kvtierfs
// daemons (which map every region they find) maps it or holds it open.

// fileID identifies a file by device and inode, as /proc/PID/maps does.
type fileID struct {
	major, minor uint32
	inode        uint64
}

// regionFile is a regular file matching the region glob.
type regionFile struct {
	path string
	size int64
	id   fileID
	uid  uint32
}

// regionScan is what a scan of the regions and of /proc found.
type regionScan struct {
	orphans, inUse []regionFile
	// others are the regular files under the glob that none of the
	// engine's uids owns (another local user's): never renamed or removed.
	others []regionFile
	// unreadable lists the processes whose mappings or descriptors could
	// not be read (another user's without root, or beyond a sandbox's
	// reach): an orphan is proven only when it is empty.
	unreadable []int
}

// scanRegions lists the regular files matching glob (symlinks, other types
// and mount points are ignored, shm.Scan), and those a gc-regions that was killed left renamed
// aside in the glob's directory; it sorts those owned by one of owners into
// orphaned and in use, and sets the others apart.
func scanRegions(glob string, owners []uint32) (regionScan, error) {
	var scan regionScan
	entries, err := shm.Scan(glob)
	if err != nil {
		return scan, fmt.Errorf("--shm-glob %q: %w", glob, err)
	}
	if aside, err := shm.Scan(asideGlob(glob)); err == nil {
		for _, e := range aside {
			if !slices.ContainsFunc(entries, func(o shm.Entry) bool { return o.Path == e.Path }) {
				entries = append(entries, e)
			}
		}
	}
	var regions []regionFile
	wanted := map[fileID]bool{}
	for _, e := range entries {
		if e.Reason != "" {
			continue
		}
		r := regionFile{path: e.Path, size: e.Size, id: regionID(e.ID), uid: e.UID}
		if !slices.Contains(owners, e.UID) {
			scan.others = append(scan.others, r)
			continue
		}
		regions = append(regions, r)
		wanted[r.id] = true
	}
	if len(regions) == 0 {
		return scan, nil
	}
	used, unreadable, err := filesInUse(wanted)
	if err != nil {
		return scan, err
	}
	scan.unreadable = unreadable
	for _, r := range regions {
		if used[r.id] {
			scan.inUse = append(scan.inUse, r)
		} else {
			scan.orphans = append(scan.orphans, r)
		}
	}
	return scan, nil
}

// regionID is a region file's identity as /proc's maps and fds name it.
func regionID(id shm.FileID) fileID {
	return fileID{unix.Major(id.Dev), unix.Minor(id.Dev), id.Ino}
}

// filesInUse returns which of the wanted files a process other than this
// one and kvtierfs daemons maps or holds open, and the processes that could
// not be read.
func filesInUse(wanted map[fileID]bool) (map[fileID]bool, []int, error) {
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return nil, nil, err
	}
	inodes := map[uint64]bool{}
	for id := range wanted {
		inodes[id.inode] = true
	}
	used := map[fileID]bool{}
	devices := map[int]device{}
	var unreadable []int
	self := os.Getpid()
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil || pid == self || isKvtierfsDaemon(pid) {
			continue
		}
		err = readMappedFiles(pid, wanted, used)
		if err == nil {
			err = readOpenFiles(pid, wanted, inodes, devices, used)
		}
		switch {
		case errors.Is(err, errNoFdinfoInode):
			return nil, nil, err
		case errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ESRCH):
			// the process exited during the scan
		case err != nil:
			unreadable = append(unreadable, pid)
		}
	}
	return used, unreadable, nil
}

// describeProcesses names processes for a message: "1 (systemd), 42 (sshd)".
func describeProcesses(pids []int) string {
	var parts []string
	for i, pid := range pids {
		if i == 5 {
			parts = append(parts, fmt.Sprintf("and %d more", len(pids)-i))
			break
		}
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		parts = append(parts, fmt.Sprintf("%d (%s)", pid, ctlabi.Printable(strings.TrimSpace(string(comm)))))
	}
	return strings.Join(parts, ", ")
}

// isKvtierfsDaemon reports whether process pid runs kvtierfs.
func isKvtierfsDaemon(pid int) bool {
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return err == nil && strings.TrimSpace(string(comm)) == "kvtierfs"
}

// readMappedFiles adds the wanted files process pid maps, from
// /proc/PID/maps ("address perms offset major:minor inode path").
func readMappedFiles(pid int, wanted, used map[fileID]bool) error {
	f, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if id, ok := parseMapsLine(sc.Text()); ok && wanted[id] {
			used[id] = true
		}
	}
	return sc.Err()
}

// parseMapsLine reads the device and inode of a /proc/PID/maps line; false
// for anonymous mappings (inode 0).
func parseMapsLine(line string) (fileID, bool) {
	fields := strings.Fields(line)
	if len(fields) < 5 {
		return fileID{}, false
	}
	majorHex, minorHex, ok := strings.Cut(fields[3], ":")
	major, err1 := strconv.ParseUint(majorHex, 16, 32)
	minor, err2 := strconv.ParseUint(minorHex, 16, 32)
	inode, err3 := strconv.ParseUint(fields[4], 10, 64)
	if !ok || err1 != nil || err2 != nil || err3 != nil || inode == 0 {
		return fileID{}, false
	}
	return fileID{uint32(major), uint32(minor), inode}, true
}

// device is a filesystem's device number, as /proc/PID/mountinfo shows it.
type device struct{ major, minor uint32 }

// errNoFdinfoInode is a kernel whose /proc/PID/fdinfo names no inode.
var errNoFdinfoInode = errors.New("/proc/PID/fdinfo names no inode (the ino: line, Linux 5.14 on): " +
	"which files processes hold open cannot be told without a stat of each, which waits on the server of a hung FUSE mount")

// readOpenFiles adds the wanted files process pid holds open (an engine
// between creating its region and mapping it). A descriptor is never
// stat-ed, which on a hung FUSE mount waits on its server: its mount id
// and inode come from /proc/PID/fdinfo, and for one whose inode is wanted
// the mount's device from the process's mount table. devices holds the
// mounts found so far, by id (ids are unique system-wide). A descriptor on
// a mount in no table of its process (a pseudo filesystem's, a memfd's, one
// detached) is not counted.
func readOpenFiles(pid int, wanted map[fileID]bool, inodes map[uint64]bool, devices map[int]device, used map[fileID]bool) error {
	dir := fmt.Sprintf("/proc/%d/fdinfo", pid)
	fds, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	type held struct {
		mount int
		inode uint64
	}
	var candidates []held
	unknown := map[int]bool{}
	for _, fd := range fds {
		mount, inode, err := readFdinfo(filepath.Join(dir, fd.Name()))
		if errors.Is(err, fs.ErrNotExist) {
			continue // closed meanwhile
		}
		if err != nil {
			return err
		}
		if !inodes[inode] {
			continue
		}
		candidates = append(candidates, held{mount, inode})
		if _, ok := devices[mount]; !ok {
			unknown[mount] = true
		}
	}
	if len(unknown) > 0 {
		if err := readMountDevices(pid, unknown, devices); err != nil {
			return err
		}
	}
	for _, c := range candidates {
		if d, ok := devices[c.mount]; ok {
			if id := (fileID{d.major, d.minor, c.inode}); wanted[id] {
				used[id] = true
			}
		}
	}
	return nil
}

// readFdinfo reads a descriptor's mount id and inode from its
// /proc/PID/fdinfo file.
func readFdinfo(path string) (mount int, inode uint64, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	// pos, flags, mnt_id and ino come first, in well under 256 bytes.
	buf := make([]byte, 256)
	n, err := f.Read(buf)
	if err != nil {
		return 0, 0, err
	}
	return parseFdinfo(string(buf[:n]))
}

// parseFdinfo reads the mnt_id: and ino: lines at the start of an fdinfo
// file (what follows them depends on the file's type).
func parseFdinfo(text string) (mount int, inode uint64, err error) {
	var haveMount, haveInode bool
	for line := range strings.Lines(text) {
		key, value, _ := strings.Cut(line, ":")
		value = strings.TrimSpace(value)
		switch key {
		case "mnt_id":
			mount, err = strconv.Atoi(value)
			haveMount = true
		case "ino":
			inode, err = strconv.ParseUint(value, 10, 64)
			haveInode = true
		}
		if err != nil {
			return 0, 0, fmt.Errorf("fdinfo line %q: %w", line, err)
		}
		if haveMount && haveInode {
			return mount, inode, nil
		}
	}
	return 0, 0, errNoFdinfoInode
}

// readMountDevices adds the devices of the mounts wanted (by id) that
// process pid's mount table lists (fusefs/mountinfo).
func readMountDevices(pid int, wanted map[int]bool, devices map[int]device) error {
	mounts, err := mountinfo.Read(strconv.Itoa(pid))
	if err != nil {
		return err
	}
	for _, m := range mounts {
		if !wanted[m.ID] {
			continue
		}
		majorText, minorText, ok := strings.Cut(m.Device, ":")
		major, err1 := strconv.ParseUint(majorText, 10, 32)
		minor, err2 := strconv.ParseUint(minorText, 10, 32)
		if ok && err1 == nil && err2 == nil {
			devices[m.ID] = device{uint32(major), uint32(minor)}
		}
	}
	return nil
}
