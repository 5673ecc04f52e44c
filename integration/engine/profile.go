package engine

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"time"
)

// profileSeconds is how long each daemon's CPU profile of the measured
// requests runs: pprof takes whole seconds, and the measured requests of the
// default multinode run take well under this.
const profileSeconds = 2

// phaseProfile records, for --profile DIR, what the measured requests cost:
// a CPU profile of every node's daemon (fetched from its pprof endpoint) and
// of this process (the engine and its ranks), and the CPU time the machine,
// every daemon and this process spent meanwhile.
type phaseProfile struct {
	dir    string
	label  string // names the run's files, e.g. "sync-on"
	nodes  []*node
	self   *os.File
	began  time.Time
	before cpuSample
	fetch  sync.WaitGroup
	errs   []error
	mu     sync.Mutex // guards errs
}

// cpuSample is the CPU time, in clock ticks, the machine (all cores) and
// each process spent so far.
type cpuSample struct {
	busy, all uint64   // the machine's non-idle and total ticks
	procs     []uint64 // user and system ticks of each daemon, then of this process
}

// clockTicks is USER_HZ, the unit of /proc's CPU times on Linux.
const clockTicks = 100

// newPhaseProfile prepares the profiles of a run labelled label under dir.
func newPhaseProfile(dir, label string, nodes []*node) (*phaseProfile, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("--profile: %w", err)
	}
	return &phaseProfile{dir: dir, label: label, nodes: nodes}, nil
}

// start begins the profiles and the CPU accounting.
func (p *phaseProfile) start() error {
	var err error
	if p.before, err = p.sample(); err != nil {
		return err
	}
	p.began = time.Now()
	if p.self, err = os.Create(filepath.Join(p.dir, fmt.Sprintf("bench-%s.pprof", p.label))); err != nil {
		return err
	}
	if err := pprof.StartCPUProfile(p.self); err != nil {
		p.self.Close()
		p.self = nil
		return err
	}
	for _, n := range p.nodes {
		p.fetch.Go(func() { p.note(n.fetchProfile(filepath.Join(p.dir, fmt.Sprintf("node%d-%s.pprof", n.index, p.label)))) })
	}
	return nil
}

// note keeps err, if any.
func (p *phaseProfile) note(err error) {
	if err != nil {
		p.mu.Lock()
		p.errs = append(p.errs, err)
		p.mu.Unlock()
	}
}

// stop ends the accounting, writes cpu-LABEL.txt and returns its text,
// then waits for the daemons' profiles.
func (p *phaseProfile) stop() (string, error) {
	if p.began.IsZero() {
		return "not started: the run ended before its measured requests", nil
	}
	wall := time.Since(p.began).Seconds()
	after, err := p.sample()
	if p.self != nil {
		pprof.StopCPUProfile()
		p.note(p.self.Close())
	}
	var report string
	if err == nil {
		report = p.report(wall, after)
		err = os.WriteFile(filepath.Join(p.dir, fmt.Sprintf("cpu-%s.txt", p.label)), []byte(report), 0o644)
	}
	p.fetch.Wait()
	return report, errors.Join(append(p.errs, err)...)
}

// report says how many cores the machine and each process kept busy over
// the wall seconds of the measured requests.
func (p *phaseProfile) report(wall float64, after cpuSample) string {
	cores := func(ticks uint64) float64 { return float64(ticks) / clockTicks / wall }
	var b strings.Builder
	fmt.Fprintf(&b, "measured requests: %.3f s wall\n", wall)
	all := after.all - p.before.all
	if all > 0 {
		fmt.Fprintf(&b, "machine: %.1f%% of all cores busy\n", 100*float64(after.busy-p.before.busy)/float64(all))
	}
	for i, n := range p.nodes {
		fmt.Fprintf(&b, "node %d daemon: %.2f cores\n", n.index, cores(after.procs[i]-p.before.procs[i]))
	}
	last := len(after.procs) - 1
	fmt.Fprintf(&b, "bench (engine, ranks, GPU stage): %.2f cores\n", cores(after.procs[last]-p.before.procs[last]))
	return b.String()
}

// sample reads the CPU times now.
func (p *phaseProfile) sample() (cpuSample, error) {
	var s cpuSample
	stat, err := os.ReadFile("/proc/stat")
	if err != nil {
		return s, err
	}
	line, _, _ := strings.Cut(string(stat), "\n")
	fields := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
	if len(fields) < 9 || fields[0] != "cpu" {
		return s, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	for i, f := range fields[1:9] {
		v, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return s, fmt.Errorf("/proc/stat: %w", err)
		}
		s.all += v
		if i != 3 && i != 4 { // idle, iowait
			s.busy += v
		}
	}
	pids := make([]int, 0, len(p.nodes)+1)
	for _, n := range p.nodes {
		pids = append(pids, n.daemon.Pid())
	}
	for _, pid := range append(pids, os.Getpid()) {
		t, err := processTicks(pid)
		if err != nil {
			return s, err
		}
		s.procs = append(s.procs, t)
	}
	return s, nil
}

// processTicks returns the user and system time of process pid and its
// reaped children, in clock ticks.
func processTicks(pid int) (uint64, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name may hold spaces and parentheses; the fields after
	// its closing parenthesis start with the state (field 3).
	i := bytes.LastIndexByte(stat, ')')
	fields := strings.Fields(string(stat[i+1:]))
	if i < 0 || len(fields) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	var ticks uint64
	for _, f := range fields[11:13] { // utime, stime: fields 14 and 15
		v, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
		ticks += v
	}
	return ticks, nil
}

// fetchProfile writes the daemon's CPU profile of the next profileSeconds
// to path.
func (n *node) fetchProfile(path string) error {
	client := http.Client{Timeout: profileSeconds*time.Second + 10*time.Second}
	resp, err := client.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", n.metrics, profileSeconds))
	if err != nil {
		return fmt.Errorf("node %d profile: %w", n.index, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("node %d profile: %s", n.index, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, resp.Body)
	return errors.Join(err, f.Close())
}

// beginMeasuring marks the start of the scenario's measured requests and
// starts their profile (--profile).
func (s *scheduler) beginMeasuring() error {
	s.measuring = true
	if s.profile == nil {
		return nil
	}
	return s.profile.start()
}
