package shared

import (
	"container/list"
	"errors"
	"sync"
	"time"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// writeBehind is the queue of blocks published locally and not yet in the
// shared store, bounded in bytes: a block that does not fit drops the oldest.
type writeBehind struct {
	mu      sync.Mutex
	queue   *list.List // of *pending, oldest first
	queued  map[string]*list.Element
	bytes   int64
	current int64 // bytes of the block being written now
	// admitted remembers blocks already queued or written, so the
	// looked-up admission queues a block once (bounded).
	admitted map[string]struct{}
	wake     chan struct{}
	// tokens is the rate budget left, refilled at Rate per second up to
	// one second's worth (or one block, if larger); refilled is when.
	tokens   float64
	refilled time.Time
	// behind samples bytes_behind to tell whether it keeps growing.
	behind [behindSamples]int64
	sample int
	lastAt time.Time
}

type pending struct {
	rel  string
	size int64
}

// behindSamples and behindEvery: bytes_behind growing over 6 samples 5 s
// apart (half a minute) raises a warning.
const (
	behindSamples = 6
	behindEvery   = 5 * time.Second
)

func (w *writeBehind) init() {
	w.queue = list.New()
	w.queued = make(map[string]*list.Element)
	w.admitted = make(map[string]struct{})
	w.wake = make(chan struct{}, 1)
}

// Published tells the level a block was published locally (size bytes).
// Under AdmitAll it is queued for write-behind.
func (l *Level) Published(rel string, size int64) {
	if l.cfg.Admit == AdmitAll {
		l.enqueue(rel, size, false)
	}
}

// LookedUp tells the level a local block answered a lookup. Under
// AdmitLookedUp its first lookup queues it for write-behind.
func (l *Level) LookedUp(rel string, size int64) {
	l.noteRecent(rel)
	if l.cfg.Admit == AdmitLookedUp {
		l.enqueue(rel, size, true)
	}
}

// enqueue queues a block unless it is queued already (or, once, was ever
// admitted: a lookup admits a block a single time), dropping the oldest
// queued blocks beyond the bound.
func (l *Level) enqueue(rel string, size int64, once bool) {
	w := &l.wb
	w.mu.Lock()
	_, queued := w.queued[rel]
	_, admitted := w.admitted[rel]
	if queued || once && admitted {
		w.mu.Unlock()
		return
	}
	if len(w.admitted) >= maxAdmitted {
		for k := range w.admitted {
			if len(w.admitted) < maxAdmitted/2 {
				break
			}
			if _, q := w.queued[k]; !q {
				delete(w.admitted, k)
			}
		}
	}
	w.admitted[rel] = struct{}{}
	for w.bytes+size > l.cfg.QueueBytes && w.queue.Len() > 0 {
		oldest := w.queue.Remove(w.queue.Front()).(*pending)
		delete(w.queued, oldest.rel)
		delete(w.admitted, oldest.rel)
		w.bytes -= oldest.size
		l.c.dropped.Add(1)
	}
	if size > l.cfg.QueueBytes {
		delete(w.admitted, rel)
		l.c.dropped.Add(1)
		w.mu.Unlock()
		return
	}
	w.queued[rel] = w.queue.PushBack(&pending{rel: rel, size: size})
	w.bytes += size
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// markAdmitted records a block the shared store holds (fetched from it), so
// that a later local lookup does not write it back.
func (w *writeBehind) markAdmitted(rel string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.admitted) < maxAdmitted {
		w.admitted[rel] = struct{}{}
	}
}

// next takes the oldest queued block, marking its bytes in flight.
func (w *writeBehind) next() (*pending, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	e := w.queue.Front()
	if e == nil {
		return nil, false
	}
	p := w.queue.Remove(e).(*pending)
	delete(w.queued, p.rel)
	w.bytes -= p.size
	w.current = p.size
	return p, true
}

// requeue puts a block back at the front after the shared store failed to
// take it, unless it was queued again meanwhile.
func (w *writeBehind) requeue(p *pending) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.current = 0
	if _, ok := w.queued[p.rel]; ok {
		return
	}
	w.queued[p.rel] = w.queue.PushFront(p)
	w.bytes += p.size
}

// finish ends the block in flight.
func (w *writeBehind) finish() {
	w.mu.Lock()
	w.current = 0
	w.mu.Unlock()
}

// snapshot returns the queue's blocks and bytes, the bytes in flight, and
// whether bytes_behind kept growing over the last samples.
func (w *writeBehind) snapshot() (blocks, bytes, inFlight int64, growing bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	growing = true
	for i := 1; i < behindSamples; i++ {
		a, b := w.behind[(w.sample+i-1)%behindSamples], w.behind[(w.sample+i)%behindSamples]
		if b <= a {
			growing = false
		}
	}
	return int64(w.queue.Len()), w.bytes, w.current, growing
}

// sampleBehind records bytes_behind every behindEvery.
func (w *writeBehind) sampleBehind(now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if now.Sub(w.lastAt) < behindEvery {
		return
	}
	w.lastAt = now
	w.behind[w.sample] = w.bytes + w.current
	w.sample = (w.sample + 1) % behindSamples
}

// writeLoop writes queued blocks behind, oldest first, within the rate
// budget. While the shared store is unreachable the queue waits (and keeps
// its bound); it drains once the prober finds the store back.
func (l *Level) writeLoop() {
	defer l.wg.Done()
	w := &l.wb
	for {
		w.sampleBehind(l.cfg.Clock.Now())
		p, ok := w.next()
		if !ok {
			select {
			case <-l.stop:
				return
			case <-w.wake:
			case <-l.bound.recovered:
			case <-l.cfg.Clock.After(behindEvery):
			}
			continue
		}
		if !l.takeTokens(p.size) {
			w.requeue(p)
			return
		}
		err := l.writeOne(p)
		switch {
		case retryable(err):
			w.requeue(p)
			select {
			case <-l.stop:
				return
			case <-l.bound.recovered:
			case <-l.cfg.Clock.After(l.cfg.Timeout):
			}
		default:
			if err != nil {
				l.cfg.Logger.Warn("write-behind to the shared store failed; block skipped", "path", p.rel, "err", err)
			}
			w.finish()
		}
	}
}

// writeOne copies one local block to the shared store.
func (l *Level) writeOne(p *pending) error {
	kind, name := block.Parse(p.rel)
	if kind != block.File {
		return nil
	}
	data, err := l.cfg.Local.ReadBlock(p.rel)
	if err != nil {
		// Evicted, replaced or corrupt locally: nothing to write.
		return nil
	}
	if err := l.bound.do(func() error { return l.put(p.rel, name, data) }); err != nil {
		if errors.Is(err, errTimedOut) {
			// The stuck call may still read the buffer: leave it to the GC.
			return err
		}
		l.cfg.Local.RecycleBlock(data)
		return err
	}
	l.cfg.Local.RecycleBlock(data)
	l.c.written.Add(1)
	l.c.writtenBytes.Add(int64(len(data)))
	l.reads.remember(p.rel, true, l.cfg.Clock.Now())
	return nil
}

// takeTokens waits until the rate budget covers n bytes; false once the level stops.
func (l *Level) takeTokens(n int64) bool {
	w := &l.wb
	for {
		now := l.cfg.Clock.Now()
		w.mu.Lock()
		burst := float64(max(l.cfg.Rate, n))
		if w.refilled.IsZero() {
			w.tokens = burst
		} else {
			w.tokens = min(burst, w.tokens+now.Sub(w.refilled).Seconds()*float64(l.cfg.Rate))
		}
		w.refilled = now
		if w.tokens >= float64(n) {
			w.tokens -= float64(n)
			w.mu.Unlock()
			return true
		}
		wait := time.Duration((float64(n) - w.tokens) / float64(l.cfg.Rate) * float64(time.Second))
		w.mu.Unlock()
		select {
		case <-l.stop:
			return false
		case <-l.cfg.Clock.After(wait):
		}
	}
}
