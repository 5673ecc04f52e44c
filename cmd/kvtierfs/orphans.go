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
)

// Orphaned engine regions: an engine that dies leaves its shm region behind
// (vllm_offload_*.mmap), and each restart adds one, until /dev/shm is full.
// A region is orphaned when no process but kvtierfs daemons (which map every
// region they find) maps it or holds it open.

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
}

// regionScan is what a scan of the regions and of /proc found.
type regionScan struct {
	orphans, inUse []regionFile
	// unreadable lists the processes whose mappings or descriptors could
	// not be read (another user's without root, or beyond a sandbox's
	// reach): an orphan is proven only when it is empty.
	unreadable []int
}

// scanRegions lists the regular files matching glob (symlinks and other
// types are ignored), and those a gc-regions that was killed left renamed
// aside in the glob's directory, and sorts them into orphaned and in use.
func scanRegions(glob string) (regionScan, error) {
	var scan regionScan
	paths, err := filepath.Glob(glob)
	if err != nil {
		return scan, fmt.Errorf("--shm-glob %q: %w", glob, err)
	}
	if aside, err := filepath.Glob(asideGlob(glob)); err == nil {
		for _, p := range aside {
			if !slices.Contains(paths, p) {
				paths = append(paths, p)
			}
		}
	}
	var regions []regionFile
	for _, p := range paths {
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
			continue
		}
		regions = append(regions, regionFile{path: p, size: st.Size, id: statID(&st)})
	}
	if len(regions) == 0 {
		return scan, nil
	}
	used, unreadable, err := filesInUse()
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

func statID(st *unix.Stat_t) fileID {
	return fileID{unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino}
}

// filesInUse returns the files mapped or held open by every process except
// this one and kvtierfs daemons, and the processes that could not be read.
func filesInUse() (map[fileID]bool, []int, error) {
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return nil, nil, err
	}
	used := map[fileID]bool{}
	var unreadable []int
	self := os.Getpid()
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil || pid == self || isKvtierfsDaemon(pid) {
			continue
		}
		err = readMappedFiles(pid, used)
		if err == nil {
			err = readOpenFiles(pid, used)
		}
		switch {
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

// readMappedFiles adds the files process pid maps, from /proc/PID/maps
// ("address perms offset major:minor inode path").
func readMappedFiles(pid int, used map[fileID]bool) error {
	f, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if id, ok := parseMapsLine(sc.Text()); ok {
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

// readOpenFiles adds the files process pid holds open (an engine between
// creating its region and mapping it).
func readOpenFiles(pid int, used map[fileID]bool) error {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	fds, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, fd := range fds {
		var st unix.Stat_t
		if unix.Stat(filepath.Join(dir, fd.Name()), &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFREG {
			used[statID(&st)] = true
		}
	}
	return nil
}
