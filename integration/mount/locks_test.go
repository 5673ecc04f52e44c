package mount_test

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

// TestLockWaitersHoldNoDaemonThread: one process holds a lock on a file of
// the mount and others wait for it (flock(1)). Main passed locks to the
// store file (go-fuse's EnableLocks), so each waiter's request held a
// daemon thread blocked in flock(2) until the lock was let go, and the
// waiter could not be killed meanwhile (the kernel waits for the answer of
// a request the daemon has read): the engine's uid piled up threads until
// Go's limit of 10,000 ended the daemon. Locks are the kernel's now: the
// waiters cost the daemon nothing and die when killed.
func TestLockWaitersHoldNoDaemonThread(t *testing.T) {
	d := mounttest.Start(t, mounttest.Options{})
	file := d.Path("config.json")
	if err := os.WriteFile(file, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	holder := exec.Command("flock", "--exclusive", "--close", file, "cat")
	stdin, err := holder.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	// Ends the holder, which lets the lock go and so frees the waiters
	// where nothing else could.
	t.Cleanup(func() {
		stdin.Close()
		holder.Wait()
	})
	waitFor(t, "the holder's lock", func() bool {
		return exec.Command("flock", "--exclusive", "--nonblock", file, "true").Run() != nil
	})

	before := threadsOf(t, d.Pid())
	const waiters = 32
	var waiting []*os.Process
	ended := make(chan error, waiters)
	// Lets the waiters go first where a check failed: killed, or given
	// the lock by the holder's end.
	t.Cleanup(func() {
		for _, p := range waiting {
			p.Kill()
		}
		stdin.Close()
		for range waiting {
			<-ended
		}
	})
	for range waiters {
		w := exec.Command("flock", "--exclusive", file, "true")
		if err := w.Start(); err != nil {
			t.Fatal(err)
		}
		waiting = append(waiting, w.Process)
		go func() { ended <- w.Wait() }()
	}
	for _, p := range waiting {
		waitFor(t, "a waiter blocked in flock(2)", func() bool { return blockedInLock(p.Pid) })
	}
	if after := threadsOf(t, d.Pid()); after-before >= waiters/2 {
		t.Errorf("the daemon went from %d to %d threads with %d processes waiting for a lock on its mount", before, after, waiters)
	}
	for _, p := range waiting {
		p.Kill()
	}
	deadline := time.After(30 * time.Second)
	for range waiting {
		select {
		case <-ended:
		case <-deadline:
			t.Fatal("processes waiting for a lock on the mount survived SIGKILL for 30 s")
		}
	}
	waiting = nil
}

// threadsOf is the number of threads of process pid.
func threadsOf(t *testing.T, pid int) int {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "Threads:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(rest))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no Threads in /proc/%d/status", pid)
	return 0
}

// blockedInLock reports whether process pid sleeps in the kernel, in a
// lock's wait (the kernel's own) or a FUSE request's (the daemon's).
func blockedInLock(pid int) bool {
	wchan, err := os.ReadFile(fmt.Sprintf("/proc/%d/wchan", pid))
	return err == nil && (strings.Contains(string(wchan), "lock") || string(wchan) == "request_wait_answer")
}

// waitFor polls cond until it holds, failing the test after a minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited a minute for %s", what)
		}
	}
}
