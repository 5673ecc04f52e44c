package mount_test

import (
	"encoding/json"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
	"github.com/kvtierfs/kvtierfs/integration/daemon"
	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

// TestNotifiesServiceManager runs the daemon as systemd runs a Type=notify
// service: READY=1 arrives on $NOTIFY_SOCKET once the mount serves, and
// STOPPING=1 when it is asked to stop.
func TestNotifiesServiceManager(t *testing.T) {
	socketPath := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: socketPath, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	mountpoint := filepath.Join(t.TempDir(), "mnt")

	type message struct {
		state      string
		mountLive  bool
		receiveErr error
	}
	messages := make(chan message, 4)
	go func() {
		buf := make([]byte, 4096)
		for {
			conn.SetReadDeadline(time.Now().Add(30 * time.Second))
			n, err := conn.Read(buf)
			if err != nil {
				messages <- message{receiveErr: err}
				return
			}
			var st unix.Statfs_t
			live := unix.Statfs(filepath.Join(mountpoint, ctlabi.Dir, ctlabi.StatsFile), &st) == nil && st.Type == unix.FUSE_SUPER_MAGIC
			messages <- message{state: string(buf[:n]), mountLive: live}
		}
	}()

	d := mounttest.Start(t, mounttest.Options{Mountpoint: mountpoint, Wrapper: []string{"env", "NOTIFY_SOCKET=" + socketPath}})
	m := <-messages
	if m.receiveErr != nil {
		t.Fatalf("no READY=1 from the daemon: %v", m.receiveErr)
	}
	if !strings.Contains(m.state, "READY=1") {
		t.Fatalf("first notification %q, want READY=1", m.state)
	}
	if !m.mountLive {
		t.Fatal("READY=1 arrived before the mount served its stats file")
	}
	if err := d.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	m = <-messages
	if m.receiveErr != nil || m.state != "STOPPING=1" {
		t.Fatalf("after SIGTERM: %q, %v; want STOPPING=1", m.state, m.receiveErr)
	}
}

// TestStatWatchIntoPipe runs `kvtierfs stat --watch` into a pipe while a
// block is stored: it prints one line per snapshot, the later ones with
// rates, and exits 0 on SIGINT.
func TestStatWatchIntoPipe(t *testing.T) {
	d := mounttest.Start(t, mounttest.Options{})
	out := &daemon.LogBuffer{}
	cmd := exec.Command(mounttest.Binary(), "stat", d.Mountpoint, "--watch", "--interval", "200ms")
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	storeBlock(t, openTier(t, d), newRegion(t, 1).Row(0), 1)
	// Wait for a second snapshot that sees the block; the count of lines is not asserted.
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if lines := strings.Split(strings.TrimSpace(out.String()), "\n"); len(lines) >= 2 && strings.Contains(lines[len(lines)-1], "blocks=1 ") {
			break
		}
	}
	cmd.Process.Signal(syscall.SIGINT)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("stat --watch exited with %v:\n%s", err, out.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	last := lines[len(lines)-1]
	if len(lines) < 2 || !strings.Contains(lines[0], "lookups_per_s=-") || !strings.Contains(last, "blocks=1 ") ||
		!strings.Contains(last, "lookups_per_s=") || strings.Contains(last, "lookups_per_s=-") || strings.Contains(out.String(), "\x1b[") {
		t.Fatalf("stat --watch into a pipe printed:\n%s", out.String())
	}
}

// TestJSONLogs runs a daemon with --log-format json: every line it prints is
// one JSON object, the mount among them.
func TestJSONLogs(t *testing.T) {
	d := mounttest.Start(t, mounttest.Options{Args: []string{"--log-format", "json"}})
	storeBlock(t, openTier(t, d), newRegion(t, 1).Row(0), 1)
	if err := d.Stop(); err != nil {
		t.Fatal(err)
	}
	messages := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(d.Log()), "\n") {
		var record struct {
			Level, Msg string
		}
		if err := json.Unmarshal([]byte(line), &record); err != nil || record.Level == "" {
			t.Fatalf("not a JSON log record: %q", line)
		}
		messages[record.Msg] = true
	}
	for _, want := range []string{"mounted", "unmounted"} {
		if !messages[want] {
			t.Errorf("no %q record in the JSON log:\n%s", want, d.Log())
		}
	}
}
