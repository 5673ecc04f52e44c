// Package mountinfo reads the kernel's mount table, /proc/PID/mountinfo: the
// one place that splits its lines and undoes their escapes. It sees mounts
// whose filesystem no longer answers (a dead FUSE daemon's), which stat
// cannot reach.
package mountinfo

import (
	"os"
	"strconv"
	"strings"
)

// Mount is one line of a mountinfo file.
type Mount struct {
	// ID is the mount's id (field 1), unique system-wide, as statx's
	// STATX_MNT_ID and /proc/PID/fdinfo's mnt_id give it; -1 if unreadable.
	ID int
	// Mountpoint is where the filesystem is mounted (field 5).
	Mountpoint string
	// Device is the filesystem's "major:minor" (field 3), as stat's st_dev.
	Device string
	// FSType and Source follow the " - " separator; SuperOptions ends the line.
	FSType, Source, SuperOptions string
}

// Read returns the mounts of process pid's mount namespace ("self" for this
// process), in the order they were mounted: a later one at a mount point is
// on top of an earlier one.
func Read(pid string) ([]Mount, error) {
	raw, err := os.ReadFile("/proc/" + pid + "/mountinfo")
	if err != nil {
		return nil, err
	}
	var mounts []Mount
	for _, line := range strings.Split(string(raw), "\n") {
		if m, ok := ParseLine(line); ok {
			mounts = append(mounts, m)
		}
	}
	return mounts, nil
}

// ParseLine reads one mountinfo line; ok is false for a line too short to
// name a mount point.
func ParseLine(line string) (m Mount, ok bool) {
	fields := strings.Fields(line)
	if len(fields) < 5 {
		return Mount{}, false
	}
	m.Device, m.Mountpoint = fields[2], unescape(fields[4])
	id, err := strconv.Atoi(fields[0])
	if err != nil {
		id = -1
	}
	m.ID = id
	for i := 5; i+3 < len(fields); i++ {
		if fields[i] == "-" {
			m.FSType, m.Source, m.SuperOptions = fields[i+1], unescape(fields[i+2]), fields[i+3]
			break
		}
	}
	return m, true
}

// At returns the mounts at dir, the topmost last.
func At(mounts []Mount, dir string) []Mount {
	var at []Mount
	for _, m := range mounts {
		if m.Mountpoint == dir {
			at = append(at, m)
		}
	}
	return at
}

// Under lists the mount points at or below dir, deepest (latest) first: the
// order to unmount them in.
func Under(mounts []Mount, dir string) []string {
	var under []string
	for _, m := range mounts {
		if m.Mountpoint == dir || strings.HasPrefix(m.Mountpoint, dir+"/") {
			under = append([]string{m.Mountpoint}, under...)
		}
	}
	return under
}

// unescape decodes the octal escapes of mountinfo's paths (\040 for a space).
func unescape(s string) string {
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
