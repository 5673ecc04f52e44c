package main

import (
	"bufio"
	"net"
	"net/http"
	"testing"
	"time"
)

// TestMetricsHeldConnectionsCannotStarveHealth: whoever reaches the metrics
// port (every local user on loopback; every pod that reaches the
// DaemonSet's 0.0.0.0:9477) opens as many connections as the endpoint
// serves at a time, sends one request on each and keeps them open. A
// liveness probe of /healthz must still be answered: it waited in the
// backlog for the idle timeout (30 s, renewed by one request every 29 s),
// longer than the DaemonSet's probe timeout (5 s), so three probes in a row
// failed and kubelet restarted a healthy daemon.
func TestMetricsHeldConnectionsCannotStarveHealth(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
	srv := serveMetrics(l, mux)
	defer srv.Close()

	for range maxMetricsConns {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}

	// Well below the 30 s idle timeout that used to free a slot.
	probe := http.Client{Timeout: 15 * time.Second}
	resp, err := probe.Get("http://" + l.Addr().String() + "/healthz")
	if err != nil {
		t.Fatalf("liveness probe while %d answered connections are held open: %v", maxMetricsConns, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("liveness probe: %s", resp.Status)
	}
}
