package main

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// mountEntry is one line of /proc/self/mountinfo.
type mountEntry struct {
	mountpoint, fstype, source string
}

// findMount returns the topmost mount at dir, or nil, from
// /proc/self/mountinfo (it works for stale FUSE mounts that stat cannot reach).
func findMount(dir string) (*mountEntry, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var found *mountEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if e, ok := parseMountinfoLine(sc.Text()); ok && e.mountpoint == abs {
			found = &e // later lines are mounted on top of earlier ones
		}
	}
	return found, sc.Err()
}

// parseMountinfoLine reads the mount point (field 5) and, after the " - "
// separator, the filesystem type and source of a mountinfo line.
func parseMountinfoLine(line string) (mountEntry, bool) {
	fields := strings.Fields(line)
	if len(fields) < 5 {
		return mountEntry{}, false
	}
	e := mountEntry{mountpoint: unescapeMountinfo(fields[4])}
	for i := 5; i+2 < len(fields); i++ {
		if fields[i] == "-" {
			e.fstype, e.source = fields[i+1], unescapeMountinfo(fields[i+2])
			break
		}
	}
	return e, true
}

// isMountpoint reports whether something is mounted at dir.
func isMountpoint(dir string) (bool, error) {
	e, err := findMount(dir)
	return e != nil, err
}

// unescapeMountinfo decodes the octal escapes (\040 for space) of mountinfo paths.
func unescapeMountinfo(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
