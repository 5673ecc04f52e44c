package main

import (
	"fmt"
	"net/http"
	"sync"
	"time"
)

// healthTimeout bounds how long /healthz waits for the store to answer.
const healthTimeout = 2 * time.Second

// health answers /healthz, for a liveness probe: 200 while the mount
// serves and its store answers, 503 with the cause otherwise. At most one
// probe of the store runs at a time: a hung store is reported as such
// instead of piling up probes.
type health struct {
	serving func() bool
	probe   func() error

	mu      sync.Mutex
	running bool
	since   time.Time
	result  chan error
}

func newHealth(serving func() bool, probe func() error) *health {
	return &health{serving: serving, probe: probe}
}

func (h *health) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := h.check(); err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	fmt.Fprintln(w, "ok")
}

// check returns nil when healthy, else the cause.
func (h *health) check() error {
	if !h.serving() {
		return fmt.Errorf("the mount is not served (starting or unmounting)")
	}
	h.mu.Lock()
	if h.running {
		since := h.since
		h.mu.Unlock()
		return fmt.Errorf("the store has not answered for %s (a hung disk or filesystem)", time.Since(since).Round(time.Millisecond))
	}
	h.running, h.since, h.result = true, time.Now(), make(chan error, 1)
	result := h.result
	h.mu.Unlock()
	go func() {
		err := h.probe()
		h.mu.Lock()
		h.running = false
		h.mu.Unlock()
		result <- err
	}()
	select {
	case err := <-result:
		if err != nil {
			return fmt.Errorf("the store: %w", err)
		}
		return nil
	case <-time.After(healthTimeout):
		return fmt.Errorf("the store does not answer within %s (a hung disk or filesystem)", healthTimeout)
	}
}
