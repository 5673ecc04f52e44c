package main

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// TestHealth answers /healthz for a serving mount, one not served, a store
// that fails and a store that hangs: only the first is 200, and a second
// probe of the hung store reports it without starting another.
func TestHealth(t *testing.T) {
	get := func(h http.Handler) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
		return rec.Code, rec.Body.String()
	}
	yes := func() bool { return true }
	if code, body := get(newHealth(yes, func() error { return nil })); code != 200 || body != "ok\n" {
		t.Errorf("healthy: %d %q", code, body)
	}
	if code, body := get(newHealth(func() bool { return false }, func() error { return nil })); code != 503 || !strings.Contains(body, "not served") {
		t.Errorf("not serving: %d %q", code, body)
	}
	if code, body := get(newHealth(yes, func() error { return errors.New("EIO") })); code != 503 || !strings.Contains(body, "the store: EIO") {
		t.Errorf("failing store: %d %q", code, body)
	}
	release := make(chan struct{})
	defer close(release)
	var probes atomic.Int32
	hung := newHealth(yes, func() error { probes.Add(1); <-release; return nil })
	if code, body := get(hung); code != 503 || !strings.Contains(body, "does not answer within") {
		t.Errorf("hung store: %d %q", code, body)
	}
	if code, body := get(hung); code != 503 || !strings.Contains(body, "has not answered for") {
		t.Errorf("hung store, second probe: %d %q", code, body)
	}
	if n := probes.Load(); n != 1 {
		t.Errorf("%d probes of a hung store, want 1", n)
	}
}
