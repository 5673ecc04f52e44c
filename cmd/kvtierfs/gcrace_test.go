package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/tiers/shm"
)

// vllmRegionCreator opens a region file as vLLM's SharedOffloadRegion does
// (vllm/v1/kv_offload/cpu/shared_offload_region.py, __init__): O_CREAT|
// O_EXCL|O_RDWR 0600 and ftruncate, or, when the file exists, join it
// (O_RDWR, wait for its size); then mmap it MAP_SHARED and keep the
// descriptor. It starts argv[3] seconds after a line on stdin, prints the
// inode it maps, and holds it until stdin closes.
const vllmRegionCreator = `
import mmap, os, sys, time
path, size = sys.argv[1], int(sys.argv[2])
print("ready", flush=True)
sys.stdin.readline()
time.sleep(float(sys.argv[3]))
try:
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.ftruncate(fd, size)
except FileExistsError:
    fd = os.open(path, os.O_RDWR)
    while os.fstat(fd).st_size < size:
        time.sleep(0.005)
m = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
print(os.fstat(fd).st_ino, flush=True)
sys.stdin.read()
`

// TestGCRegionsRacingEngine runs gc-regions on an orphaned region while an
// engine starts, 60 times, the engine's start spread over the time
// gc-regions' scan of the processes takes: whichever way each race goes, the file the engine maps is still the
// one its name leads to (other workers of that engine join it by name),
// never one gc-regions removed (10 of 60 races removed it when gc-regions
// unlinked by name after its last check).
func TestGCRegionsRacingEngine(t *testing.T) {
	p := fmt.Sprintf("/dev/shm/kvtierfs-gc-race-%d.mmap", os.Getpid())
	t.Cleanup(func() { os.Remove(p) })
	const size = 8192
	owners := shm.RegionOwners(uint32(os.Getuid()))
	if err := os.WriteFile(p, make([]byte, size), 0o600); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := scanRegions(p, owners); err != nil {
		t.Fatal(err)
	}
	span := 2 * time.Since(start).Seconds()
	lost := 0
	for round := range 60 {
		os.Remove(p)
		if err := os.WriteFile(p, make([]byte, size), 0o600); err != nil {
			t.Fatal(err)
		}
		scan, err := scanRegions(p, owners)
		if err != nil || len(scan.orphans) != 1 {
			t.Fatalf("scan: %+v, %v", scan, err)
		}
		scan.unreadable = nil // a sandbox's PID 1 may be out of reach; it is no engine
		delay := span * float64(round) / 60
		engine := exec.Command("/usr/bin/python3", "-c", vllmRegionCreator, p, strconv.Itoa(size), strconv.FormatFloat(delay, 'f', 4, 64))
		stdin, err := engine.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := engine.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := engine.Start(); err != nil {
			t.Fatalf("engine (python3): %v", err)
		}
		out := bufio.NewReader(stdout)
		if line, _ := out.ReadString('\n'); line != "ready\n" {
			t.Fatalf("engine: %q", line)
		}
		io.WriteString(stdin, "go\n")
		gcRegions(io.Discard, scan, false, 50*time.Millisecond, time.Minute)
		line, _ := out.ReadString('\n')
		mapped, err := strconv.ParseUint(strings.TrimSpace(line), 10, 64)
		if err != nil {
			stdin.Close()
			engine.Wait()
			t.Fatalf("round %d: the engine mapped nothing: %q", round, line)
		}
		var st unix.Stat_t
		if unix.Stat(p, &st) != nil || st.Ino != mapped {
			lost++
			t.Errorf("round %d (engine after %.3fs): the engine maps inode %d, which its name no longer leads to", round, delay, mapped)
		}
		stdin.Close()
		engine.Wait()
	}
	if lost > 0 {
		t.Errorf("gc-regions took the engine's region in %d of 60 races", lost)
	}
}
