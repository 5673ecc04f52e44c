package shared

import (
	"errors"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// ErrUnreachable answers a call while the shared directory is marked
// unreachable: it was not tried.
var ErrUnreachable = errors.New("shared store unreachable")

// errTimedOut is a call that did not return within the bound.
var errTimedOut = errors.New("shared store call timed out")

// bound runs calls to the shared directory on a fixed set of workers, each
// call waited for (a worker, then its answer) at most timeout. A call past
// its bound marks the level unreachable: later calls fail at once with
// ErrUnreachable until the prober finds the directory answering again and
// no worker is still stuck in a call given up. Stuck calls hold at most the
// workers and their queue, so they never pile up.
type bound struct {
	timeout time.Duration
	jobs    chan *job
	// unreachable is set on a timeout and cleared by the prober; stuck
	// counts the workers still in a call whose caller gave up.
	unreachable atomic.Bool
	stuck       atomic.Int64
	timeouts    atomic.Int64
	// recovered is signalled (without blocking) when the prober clears unreachable.
	recovered chan struct{}

	probeMu sync.Mutex
	probing bool
	probe   func() error
	stop    chan struct{}
}

// job is one call handed to a worker. Its state moves from queued to
// running (a worker took it) to finished, or to abandoned when its caller
// gave up: a worker skips an abandoned job it had not started, and one that
// was running counts as stuck until it returns. progress is signalled by a
// call that advanced, which starts its bound again.
type job struct {
	fn       func() error
	done     chan error
	progress chan struct{}
	state    atomic.Int32
}

const (
	jobQueued int32 = iota
	jobRunning
	jobFinished
	jobAbandoned
)

func newBound(workers int, timeout time.Duration, probe func() error) *bound {
	b := &bound{timeout: timeout, jobs: make(chan *job, workers), recovered: make(chan struct{}, 1),
		probe: probe, stop: make(chan struct{})}
	for range workers {
		go b.work()
	}
	return b
}

func (b *bound) work() {
	for {
		select {
		case <-b.stop:
			return
		case j := <-b.jobs:
			if !j.state.CompareAndSwap(jobQueued, jobRunning) {
				continue
			}
			err := j.fn()
			if !j.state.CompareAndSwap(jobRunning, jobFinished) {
				// Given up while it ran: this worker is free again.
				b.unstuck()
			}
			j.done <- err
		}
	}
}

// close stops idle workers; those stuck in a call end when it returns.
func (b *bound) close() { close(b.stop) }

// do runs fn on a worker and waits for it at most the bound.
func (b *bound) do(fn func() error) error {
	return b.doProgressing(func(func()) error { return fn() })
}

// doProgressing runs fn like do, but the bound applies to progress: every
// call of the func fn is given starts it again, so a long call that keeps
// advancing (a large block's read, chunk by chunk) runs to its end while one
// that stalls for the bound is given up.
func (b *bound) doProgressing(fn func(progress func()) error) error {
	if !b.reachable() {
		return ErrUnreachable
	}
	j := &job{done: make(chan error, 1), progress: make(chan struct{}, 1)}
	j.fn = func() error {
		return fn(func() {
			select {
			case j.progress <- struct{}{}:
			default:
			}
		})
	}
	// The bound covers the wait for a worker too: calls stuck in a hung
	// filesystem hold every worker, and the next callers give up in time.
	t := time.NewTimer(b.timeout)
	defer t.Stop()
	select {
	case b.jobs <- j:
	case <-t.C:
		b.timeouts.Add(1)
		b.markUnreachable()
		return errTimedOut
	}
	for {
		select {
		case err := <-j.done:
			if unavailable(err) {
				// Answered, but the filesystem's client lost its servers.
				b.markUnreachable()
			}
			return err
		case <-j.progress:
			t.Reset(b.timeout)
		case <-t.C:
			if !j.state.CompareAndSwap(jobQueued, jobAbandoned) {
				if !j.state.CompareAndSwap(jobRunning, jobAbandoned) {
					// It finished just now: its answer is on its way.
					err := <-j.done
					if unavailable(err) {
						b.markUnreachable()
					}
					return err
				}
				b.stuck.Add(1)
			}
			b.timeouts.Add(1)
			b.markUnreachable()
			return errTimedOut
		}
	}
}

// unavailable reports an error meaning the shared filesystem cannot serve
// now (its client lost the servers, or it cannot take writes), rather than
// an answer about one file.
func unavailable(err error) bool {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return false
	}
	switch errno {
	case syscall.ENOTCONN, syscall.ETIMEDOUT, syscall.EHOSTDOWN, syscall.EHOSTUNREACH, syscall.ENETDOWN,
		syscall.ENETUNREACH, syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.ECONNABORTED, syscall.ESHUTDOWN,
		syscall.EIO, syscall.ENODEV, syscall.ENOSPC, syscall.EDQUOT, syscall.EROFS:
		return true
	}
	return false
}

// retryable reports whether a call failed for want of the shared store
// (timed out, skipped while unreachable, or unavailable): worth trying again
// once it is back.
func retryable(err error) bool {
	return errors.Is(err, ErrUnreachable) || errors.Is(err, errTimedOut) || unavailable(err)
}

// reachable reports whether calls are tried: no timeout since the prober's
// last success, and no worker stuck in a call given up.
func (b *bound) reachable() bool { return !b.unreachable.Load() && b.stuck.Load() == 0 }

// unstuck counts a stuck call returned, and tells the writer when that made
// the directory reachable again.
func (b *bound) unstuck() {
	if b.stuck.Add(-1) == 0 && !b.unreachable.Load() {
		b.signalRecovered()
	}
}

func (b *bound) signalRecovered() {
	select {
	case b.recovered <- struct{}{}:
	default:
	}
}

// markUnreachable marks the directory unreachable and starts the prober if none runs.
func (b *bound) markUnreachable() {
	b.unreachable.Store(true)
	b.probeMu.Lock()
	defer b.probeMu.Unlock()
	if !b.probing {
		b.probing = true
		go b.probeUntilBack()
	}
}

// probeUntilBack is the single prober: it tries the directory every bound,
// in its own goroutine, starting no new try while one is still stuck, and
// clears unreachable when a try succeeds within the bound.
func (b *bound) probeUntilBack() {
	var try chan error
	for {
		if try == nil {
			try = make(chan error, 1)
			go func(c chan error) { c <- b.probe() }(try)
		}
		t := time.NewTimer(b.timeout)
		select {
		case <-b.stop:
			t.Stop()
			return
		case err := <-try:
			t.Stop()
			try = nil
			if err == nil {
				b.probeMu.Lock()
				b.probing = false
				b.unreachable.Store(false)
				b.probeMu.Unlock()
				b.signalRecovered()
				return
			}
			select {
			case <-b.stop:
				return
			case <-time.After(b.timeout):
			}
		case <-t.C:
			// Still stuck: wait for it rather than start another.
		}
	}
}

// call runs fn under the bound and returns its result. The result travels
// through a channel, never a variable the caller shares with the worker: a
// call past its bound still writes after the caller moved on.
func call[T any](b *bound, fn func() (T, error)) (T, error) {
	return callProgressing(b, func(func()) (T, error) { return fn() })
}

// callProgressing is call under doProgressing's bound: fn calls progress as it advances.
func callProgressing[T any](b *bound, fn func(progress func()) (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1)
	err := b.doProgressing(func(progress func()) error {
		v, err := fn(progress)
		ch <- result{v, err}
		return err
	})
	select {
	case r := <-ch:
		return r.v, r.err
	default:
		var zero T
		return zero, err
	}
}
