package main

import (
	"fmt"
	"net"
	"os"
)

// sdNotify sends a state change ("READY=1", "STOPPING=1", "STATUS=…") to
// the service manager that started the daemon, as sd_notify(3) does: one
// datagram to the unix socket named by $NOTIFY_SOCKET ('@' for the abstract
// namespace). Without $NOTIFY_SOCKET (not run by systemd with Type=notify)
// it does nothing.
func sdNotify(state string) error {
	socket := os.Getenv("NOTIFY_SOCKET")
	if socket == "" {
		return nil
	}
	addr := &net.UnixAddr{Name: socket, Net: "unixgram"}
	if socket[0] == '@' {
		addr.Name = "\x00" + socket[1:]
	}
	conn, err := net.DialUnix("unixgram", nil, addr)
	if err != nil {
		return fmt.Errorf("notifying the service manager at NOTIFY_SOCKET=%s: %w", socket, err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(state)); err != nil {
		return fmt.Errorf("notifying the service manager at NOTIFY_SOCKET=%s: %w", socket, err)
	}
	return nil
}
