package main

import (
	"crypto/subtle"
	"net"
	"net/http"
	"strings"
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
	metricsIdleTimeout  = 30 * time.Second
	metricsMaxHeader    = 16 << 10
)

// serveMetrics serves handler on l with bounded, timed-out connections and
// returns the server (Close it to stop).
func serveMetrics(l net.Listener, handler http.Handler) *http.Server {
	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: metricsHeaderTimeout,
		ReadTimeout:       metricsReadTimeout,
		WriteTimeout:      metricsWriteTimeout,
		IdleTimeout:       metricsIdleTimeout,
		MaxHeaderBytes:    metricsMaxHeader,
	}
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

// requireToken serves next only to requests carrying token as a bearer
// credential (Prometheus' `authorization: {credentials_file: FILE}`), so
// that metrics and profiles stay the node operator's although every local
// user reaches the port; a nil token lets every request through.
func requireToken(token []byte, next http.Handler) http.Handler {
	if token == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || subtle.ConstantTimeCompare([]byte(got), token) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="kvtierfs"`)
			http.Error(w, "a bearer token (--metrics-token-file) is required", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}
