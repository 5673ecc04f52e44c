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

// TestMetricsHalfRequestsCannotStarveHealth: the same attacker sends only
// the start of a request on each connection and opens many more than the
// endpoint serves at a time. Each served one keeps its slot until the
// header timeout (5 s) and the rest wait in the backlog ahead of the
// probe, so the probe waited one header timeout per 16 of them: with 64
// such connections renewed as they were closed, three /healthz probes in
// a row took over 10 s (curl -m 10: 000). A probe that sends its request
// at once must be answered whatever the half-requests ahead of it.
func TestMetricsHalfRequestsCannotStarveHealth(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
	srv := serveMetrics(l, mux)
	defer srv.Close()

	for range 16 * maxMetricsConns {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Write([]byte("GET /healthz HTTP/1.1\r\nX-Slow: ")); err != nil {
			t.Fatal(err)
		}
	}

	// Well below what 15 rounds of the 5 s header timeout ahead of it take.
	probe := http.Client{Timeout: 15 * time.Second}
	resp, err := probe.Get("http://" + l.Addr().String() + "/healthz")
	if err != nil {
		t.Fatalf("liveness probe behind %d half-sent requests: %v", 16*maxMetricsConns, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("liveness probe: %s", resp.Status)
	}
}
