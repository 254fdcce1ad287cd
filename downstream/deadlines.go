package downstream

import (
	"time"

	"github.com/xdsrelay/xdsrelay/internal/lockorder"
)

// deadlines is limits.first_request_timeout for every pending stream at
// once: one queue, one timer and one goroutine (while anything is pending)
// instead of a timer per stream. Every stream waits the same timeout, so
// deadlines come in the order streams open: the queue is first in, first
// out, and the goroutine sleeps until the oldest is due.
type deadlines struct {
	// Read-only after newDeadlines.
	timeout time.Duration
	now     func() time.Time

	mu      lockorder.Mutex[deadlinesMu]
	queue   []*firstWait // oldest first; guarded by mu
	head    int          // queue[head:] may be pending; guarded by mu
	running bool         // the goroutine is running; guarded by mu
	waiting int          // waits neither stopped nor told; guarded by mu

	wake chan struct{} // capacity 1: the last wait stopped, the goroutine may end
}

// firstWait is one stream waiting for its first request.
type firstWait struct {
	d       *deadlines
	due     time.Time
	expired chan<- struct{} // capacity 1; told once the deadline passes
	done    bool            // stopped or told: guarded by d.mu
}

func newDeadlines(timeout time.Duration) *deadlines {
	return &deadlines{timeout: timeout, now: time.Now, wake: make(chan struct{}, 1)}
}

// add starts a stream's wait: expired is told once timeout passes, unless
// stop is called first.
func (d *deadlines) add(expired chan<- struct{}) *firstWait {
	w := &firstWait{d: d, due: d.now().Add(d.timeout), expired: expired}
	d.mu.Lock()
	d.queue = append(d.queue, w)
	d.waiting++
	start := !d.running
	d.running = true
	d.mu.Unlock()
	if start {
		go d.run()
	}
	return w
}

// stop ends the wait: its deadline no longer fires. The last wait to stop
// wakes the goroutine, so that it ends without waiting for a deadline.
func (w *firstWait) stop() {
	d := w.d
	d.mu.Lock()
	last := false
	if !w.done {
		w.done = true
		d.waiting--
		last = d.waiting == 0
	}
	d.mu.Unlock()
	if last {
		select {
		case d.wake <- struct{}{}:
		default:
		}
	}
}

// run tells the streams whose deadline passed, oldest first, until none
// is pending; then it ends (an idle relay has no such goroutine).
func (d *deadlines) run() {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		d.mu.Lock()
		now := d.now()
		for d.head < len(d.queue) {
			w := d.queue[d.head]
			if !d.fireLocked(w, now) {
				break
			}
			d.queue[d.head] = nil
			d.head++
		}
		if d.waiting == 0 {
			clear(d.queue)
			d.queue, d.head, d.running = d.queue[:0], 0, false
			d.mu.Unlock()
			return
		}
		if d.head > len(d.queue)/2 {
			// Compact: what is done stays behind the head, not in memory.
			n := copy(d.queue, d.queue[d.head:])
			clear(d.queue[n:])
			d.queue, d.head = d.queue[:n], 0
		}
		wait := d.queue[d.head].due.Sub(now)
		d.mu.Unlock()
		t.Reset(wait)
		select {
		case <-t.C:
		case <-d.wake:
			t.Stop() // no stale tick follows (Go 1.23 timers)
		}
	}
}

// fireLocked tells the stream its deadline passed, if it has; it reports
// whether the wait is over (told, or stopped).
func (d *deadlines) fireLocked(w *firstWait, now time.Time) bool {
	if w.done {
		return true
	}
	if now.Before(w.due) {
		return false
	}
	w.done = true
	d.waiting--
	w.expired <- struct{}{} // capacity 1, told once
	return true
}

// newFirstDeadlines is the queue of limits.first_request_timeout; nil when
// it is 0 (no bound).
func newFirstDeadlines(timeout time.Duration) *deadlines {
	if timeout <= 0 {
		return nil
	}
	return newDeadlines(timeout)
}
