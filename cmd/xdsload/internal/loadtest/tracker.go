package loadtest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// tracker records what every client has seen. Sequence number 0 is the
// initial config; updates are numbered from 1.
type tracker struct {
	// Read-only after newTracker.
	n       int
	updates int
	wake    chan struct{} // capacity 1: poked when a count below changes

	// clients[i] is owned by whoever runs client i (the launcher sets
	// started first); everything else reads it after those have stopped.
	clients []clientLog
	// pub[seq] is owned by the publishing goroutine until the run ends.
	pub []time.Time

	connected  atomic.Int64
	configured atomic.Int64
	failed     atomic.Int64
	published  atomic.Int64   // updates announced, before they are sent
	early      atomic.Int64   // responses with an update not yet published
	foreign    atomic.Int64   // first configs with resources this run did not publish
	retries    atomic.Int64   // streams refused and tried again
	reconnects atomic.Int64   // streams ended after an answer and opened again
	retried    atomic.Int64   // clients that tried again at least once
	delivered  []atomic.Int64 // per seq: clients that have it
	// Clients that have the first config (or the last update) or failed:
	// what the driver waits on.
	settledFirst atomic.Int64
	settledLast  atomic.Int64

	mu       sync.Mutex
	firstErr error // guarded by mu
}

// clientLog is what one client saw, and when.
type clientLog struct {
	started, established, configured time.Time
	seq                              int // highest seen; -1 before the first config
	recv                             []time.Time
	responses                        int // received, on every stream
	retries                          int // streams refused and tried again
}

func newTracker(n, updates int) *tracker {
	tr := &tracker{
		n: n, updates: updates,
		wake:      make(chan struct{}, 1),
		clients:   make([]clientLog, n),
		pub:       make([]time.Time, updates+1),
		delivered: make([]atomic.Int64, updates+1),
	}
	for i := range tr.clients {
		tr.clients[i] = clientLog{seq: -1, recv: make([]time.Time, updates+1)}
	}
	return tr
}

func (tr *tracker) poke() {
	select {
	case tr.wake <- struct{}{}:
	default:
	}
}

func (tr *tracker) started(i int) { tr.clients[i].started = time.Now() }

// established records that client i's stream is open and subscribed.
func (tr *tracker) established(i int) {
	if c := &tr.clients[i]; c.established.IsZero() {
		c.established = time.Now()
		tr.connected.Add(1)
	}
}

// observe records that client i received, at t, a response whose newest
// resource carries seq: it has every update up to seq. A seq that is not
// published yet counts as the last one that is: such a resource cannot come
// from this run.
func (tr *tracker) observe(i, seq int, t time.Time) {
	c := &tr.clients[i]
	c.responses++
	if c.established.IsZero() {
		tr.established(i)
	}
	if p := int(tr.published.Load()); seq > p {
		tr.early.Add(1)
		seq = p
	}
	if c.seq < 0 {
		c.configured, c.seq = t, 0
		tr.configured.Add(1)
		tr.settledFirst.Add(1)
		tr.poke()
	}
	for s := c.seq + 1; s <= min(seq, tr.updates); s++ {
		c.recv[s] = t
		tr.delivered[s].Add(1)
		if s == tr.updates {
			tr.settledLast.Add(1)
		}
		tr.poke()
	}
	c.seq = max(c.seq, seq)
}

// foreignFirst records that client i's next response, if it is its first
// config, carries resources this run did not publish.
func (tr *tracker) foreignFirst(i int) {
	if tr.clients[i].seq < 0 {
		tr.foreign.Add(1)
	}
}

// retry records that client i's stream was refused and is tried again.
func (tr *tracker) retry(i int) {
	c := &tr.clients[i]
	if c.retries++; c.retries == 1 {
		tr.retried.Add(1)
	}
	tr.retries.Add(1)
}

// fail records that client i stopped for err before the run ended.
func (tr *tracker) fail(i int, err error) {
	c := &tr.clients[i]
	if c.seq < 0 {
		tr.settledFirst.Add(1)
	}
	if c.seq < tr.updates {
		tr.settledLast.Add(1)
	}
	tr.failed.Add(1)
	tr.mu.Lock()
	if tr.firstErr == nil {
		tr.firstErr = fmt.Errorf("client %d: %w", i, err)
	}
	tr.mu.Unlock()
	tr.poke()
}

// announce lets clients accept update seq; it comes before the update is
// sent, so that no client can have it earlier.
func (tr *tracker) announce(seq int) { tr.published.Store(int64(seq)) }

// wait returns once every client has settled, as count tells.
func (tr *tracker) wait(ctx context.Context, count *atomic.Int64) error {
	for count.Load() < int64(tr.n) {
		select {
		case <-tr.wake:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// fullyDelivered counts the updates that every client has.
func (tr *tracker) fullyDelivered() int {
	d := 0
	for s := 1; s <= tr.updates && tr.delivered[s].Load() == int64(tr.n); s++ {
		d++
	}
	return d
}

func (tr *tracker) progressLine(elapsed time.Duration) string {
	return fmt.Sprintf("xdsload: %4.0fs connected %d/%d configured %d/%d updates published %d/%d delivered to all %d failed %d",
		elapsed.Seconds(), tr.connected.Load(), tr.n, tr.configured.Load(), tr.n,
		tr.published.Load(), tr.updates, tr.fullyDelivered(), tr.failed.Load())
}
