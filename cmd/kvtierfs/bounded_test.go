package main

import (
	"errors"
	"testing"
	"time"
)

// TestBoundedGivesUp runs work that never returns: bounded gives up at its
// timeout with the hung error; work that returns passes its result on.
func TestBoundedGivesUp(t *testing.T) {
	never := make(chan struct{})
	defer close(never)
	_, err := bounded(10*time.Millisecond, func() error { return errors.New("stuck") },
		func() (int, error) { <-never; return 0, nil })
	if err == nil || err.Error() != "stuck" {
		t.Errorf("work that never returns: %v, want the hung error", err)
	}
	if v, err := bounded(time.Hour, func() error { return errors.New("stuck") }, func() (int, error) { return 7, nil }); v != 7 || err != nil {
		t.Errorf("work that returns: %d, %v", v, err)
	}
}
