package main

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/user"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kvtierfs/kvtierfs/internal/sockdiag"
)

// listenMetrics binds --metrics-addr. Any local user may bind a free port
// first, to keep the daemon from starting or to answer its scrapes; the
// daemon then fails before it opens the store, naming who holds the port.
func listenMetrics(addr string) (net.Listener, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, explainListen("--metrics-addr", addr, err, "it keeps the daemon from serving there and would answer its scrapes",
			"choose another address, or --metrics-addr '' to disable metrics")
	}
	return l, nil
}

// explainListen describes a failed bind of flag's addr: for a port someone
// holds, the uid holding it (internal/sockdiag), and what that does (harm)
// when it is another user's; remedy says what the operator may do instead.
func explainListen(flag, addr string, err error, harm, remedy string) error {
	plain := fmt.Errorf("%s %s: %w (%s)", flag, addr, err, remedy)
	if !errors.Is(err, syscall.EADDRINUSE) {
		return plain
	}
	at, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil {
		return plain
	}
	uid, err := sockdiag.ListenerOwner(at)
	if err != nil {
		return plain
	}
	id := strconv.FormatUint(uint64(uid), 10)
	holder := "uid " + id
	if u, err := user.LookupId(id); err == nil {
		holder += " (" + u.Username + ")"
	}
	if int(uid) != os.Getuid() && uid != 0 {
		return fmt.Errorf("%s %s: the port is held by %s, another user: %s; end that process (ss -ltnp 'sport = :%d'), or %s",
			flag, addr, holder, harm, at.Port, remedy)
	}
	return fmt.Errorf("%s %s: the port is held by %s, perhaps another kvtierfs (ss -ltnp 'sport = :%d'); %s", flag, addr, holder, at.Port, remedy)
}

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
	limited := &limitListener{Listener: l, max: maxMetricsConns}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if c, ok := r.Context().Value(slotConnKey{}).(*slotConn); ok {
				c.requested.Store(true)
			}
			handler.ServeHTTP(w, r)
		}),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, slotConnKey{}, c)
		},
		ReadHeaderTimeout: metricsHeaderTimeout,
		ReadTimeout:       metricsReadTimeout,
		WriteTimeout:      metricsWriteTimeout,
		MaxHeaderBytes:    metricsMaxHeader,
	}
	srv.SetKeepAlivesEnabled(false)
	go srv.Serve(limited)
	return srv
}

// limitListener keeps at most max connections open. It accepts at once
// and, when all are taken, closes the oldest one that has not sent its
// request yet: waiting in the backlog instead, a probe queued behind
// half-sent requests waited one header timeout per max of them.
type limitListener struct {
	net.Listener
	max  int
	mu   sync.Mutex
	open []*slotConn // in accept order
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		conn, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		c := &slotConn{Conn: conn, l: l}
		if victim, ok := l.admit(c); ok {
			if victim != nil {
				victim.Close()
			}
			return c, nil
		}
		// Every slot serves a request, which ends within the write
		// timeout: this connection is refused rather than held.
		conn.Close()
	}
}

// admit files c among the open connections, making room by taking the
// oldest one that has not sent its request yet (victim, for the caller to
// close); ok is false when every slot serves a request.
func (l *limitListener) admit(c *slotConn) (victim *slotConn, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.open) >= l.max {
		for _, o := range l.open {
			if !o.requested.Load() {
				victim = o
				break
			}
		}
		if victim == nil {
			return nil, false
		}
	}
	l.open = append(l.open, c)
	return victim, true
}

// slotConnKey is the request context's key of its connection.
type slotConnKey struct{}

// slotConn gives its listener's slot back when it is first closed;
// requested is set once its request's headers arrived.
type slotConn struct {
	net.Conn
	l         *limitListener
	once      sync.Once
	requested atomic.Bool
}

func (c *slotConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.mu.Lock()
		defer c.l.mu.Unlock()
		for i, o := range c.l.open {
			if o == c {
				c.l.open = append(c.l.open[:i], c.l.open[i+1:]...)
				break
			}
		}
	})
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
