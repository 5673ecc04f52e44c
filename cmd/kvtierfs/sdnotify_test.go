package main

import (
	"fmt"
	"net"
	"os"
	"testing"
	"time"
)

// TestSdNotifyAbstractSocket sends to an abstract-namespace socket, the
// form systemd uses ("@…"), and does nothing without NOTIFY_SOCKET.
func TestSdNotifyAbstractSocket(t *testing.T) {
	name := fmt.Sprintf("@kvtierfs-notify-test-%d", os.Getpid())
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: "\x00" + name[1:], Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	t.Setenv("NOTIFY_SOCKET", name)
	if err := sdNotify("READY=1"); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := conn.Read(buf)
	if err != nil || string(buf[:n]) != "READY=1" {
		t.Fatalf("received %q, %v; want READY=1", buf[:n], err)
	}
	t.Setenv("NOTIFY_SOCKET", "")
	if err := sdNotify("READY=1"); err != nil {
		t.Fatalf("without NOTIFY_SOCKET: %v, want nothing done", err)
	}
	t.Setenv("NOTIFY_SOCKET", "/nonexistent/notify")
	if err := sdNotify("READY=1"); err == nil {
		t.Fatal("a missing NOTIFY_SOCKET went unreported")
	}
}
