package main

import (
	"net"
	"net/http"
	"sync"
	"time"
)

// The metrics endpoint's bounds: whoever reaches the port (every local user
// on loopback) holds at most maxMetricsConns descriptors of the daemon, and
// none for long.
const (
	maxMetricsConns = 16
	// metricsHeaderTimeout bounds a request's headers: an idle or trickling
	// connection is closed after it.
	metricsHeaderTimeout = 5 * time.Second
	metricsReadTimeout   = 10 * time.Second
	// metricsWriteTimeout leaves room for a 30 s /debug/pprof/profile.
	metricsWriteTimeout = 60 * time.Second
	metricsMaxHeader    = 16 << 10
)

// serveMetrics serves handler on l with bounded, timed-out connections and
// returns the server (Close it to stop). A connection serves one request:
// kept alive, a client renewing it before its idle timeout held its slot
// for good, and a few such clients starved the liveness probe.
func serveMetrics(l net.Listener, handler http.Handler) *http.Server {
	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: metricsHeaderTimeout,
		ReadTimeout:       metricsReadTimeout,
		WriteTimeout:      metricsWriteTimeout,
		MaxHeaderBytes:    metricsMaxHeader,
	}
	srv.SetKeepAlivesEnabled(false)
	go srv.Serve(&limitListener{Listener: l, slots: make(chan struct{}, maxMetricsConns)})
	return srv
}

// limitListener accepts a connection only while fewer than cap(slots) are
// open; the others wait in the kernel's backlog, costing the daemon nothing.
type limitListener struct {
	net.Listener
	slots chan struct{}
}

func (l *limitListener) Accept() (net.Conn, error) {
	l.slots <- struct{}{}
	conn, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	return &slotConn{Conn: conn, release: func() { <-l.slots }}, nil
}

// slotConn gives its listener's slot back when it is first closed.
type slotConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *slotConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
