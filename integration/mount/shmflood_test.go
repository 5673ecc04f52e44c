package mount_test

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

// floodFiles is how many empty files another user plants under --shm-glob.
const floodFiles = 20000

// TestShmFloodIsBounded: 20,000 empty files owned by another user match
// --shm-glob, all sorting before the engine's region. The region is still
// found and serves; stats.json lists the first 64 ignored files and counts
// them all under one warning (it was 8.5 MB, one entry and one warning
// each); the daemon logs a few lines about them, not one per file at mount
// and then 19,999 every event-log interval.
func TestShmFloodIsBounded(t *testing.T) {
	region := newRegion(t, 2)
	base := strings.TrimSuffix(region.Path, ".mmap")
	t.Cleanup(func() {
		for i := range floodFiles {
			os.Remove(fmt.Sprintf("%s-flood-%05d.mmap", base, i))
		}
	})
	for i := range floodFiles {
		fd, err := unix.Open(fmt.Sprintf("%s-flood-%05d.mmap", base, i), unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		err = unix.Fchown(fd, 64321, 64321)
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
	}
	d := mounttest.Start(t, mounttest.Options{ShmGlob: base + "*.mmap"})
	// Past one interval of the event log (10 s), which compares
	// snapshots, then 10 s more, whose CPU time is logged (no assertion:
	// the machine is shared).
	time.Sleep(12 * time.Second)
	cpuBefore := cpuTicks(t, d.Pid())
	time.Sleep(10 * time.Second)
	t.Logf("daemon CPU over 10 s of steady state with %d files under the glob: %d ticks of 1/100 s", floodFiles, cpuTicks(t, d.Pid())-cpuBefore)

	raw, err := os.ReadFile(d.Path(ctlabi.Dir, ctlabi.StatsFile))
	if err != nil {
		t.Fatal(err)
	}
	if len(raw) > 256<<10 {
		t.Errorf("stats.json is %d bytes with %d ignored files", len(raw), floodFiles)
	}
	st := d.Stats()
	if len(st.Primary.Regions) != 1 || st.Primary.Regions[0].Path != region.Path {
		t.Fatalf("regions %+v, want %s among the flood", st.Primary.Regions, region.Path)
	}
	if st.Primary.IgnoredCount != floodFiles || len(st.Primary.Ignored) != 64 || st.Primary.Ignored[0].Path != base+"-flood-00000.mmap" {
		t.Errorf("ignored: %d counted, %d listed (first %+v); want %d counted, the first 64 listed",
			st.Primary.IgnoredCount, len(st.Primary.Ignored), st.Primary.Ignored[:min(1, len(st.Primary.Ignored))], floodFiles)
	}
	warned := 0
	for _, w := range st.Warnings {
		if w.Code == ctlabi.WarnShmIgnored {
			warned++
		}
	}
	if warned != 1 {
		t.Errorf("%d shm_ignored warnings, want one", warned)
	}
	if lines := strings.Count(d.Log(), "ignored"); lines > 16 {
		t.Errorf("%d log lines about ignored files", lines)
	}

	tier := openTier(t, d)
	path := storeBlock(t, tier, region.Row(0), 1)
	if err := tier.Load(path, region.Row(1)); err != nil || !bytes.Equal(region.Row(1), expectedRow(1)) {
		t.Fatalf("load into the engine's region among the flood: %v", err)
	}
}

// cpuTicks is the user and system time process pid has used, in clock ticks.
func cpuTicks(t *testing.T, pid int) int64 {
	t.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// Fields after the command's closing parenthesis; utime and stime are
	// the 14th and 15th fields of the line.
	fields := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+1:]))
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	return utime + stime
}
