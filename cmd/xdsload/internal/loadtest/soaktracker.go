package loadtest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// soakTracker is what a soak's clients saw: first configs, the receipts of
// the updates (the fan-out of the current row's interval), and counts.
type soakTracker struct {
	// Read-only after newSoakTracker.
	clients int
	wake    chan struct{} // capacity 1: poked when a client is configured

	// Atomic.
	announced    atomic.Int64 // the last update announced, before it is sent
	nConfigured  atomic.Int64 // clients with a first config
	responses    atomic.Int64
	nacks        atomic.Int64
	reconnects   atomic.Int64
	resubscribes atomic.Int64
	restarts     atomic.Int64 // of the control plane
	changes      atomic.Int64 // published
	failures     atomic.Int64 // streams that failed or were refused

	mu       sync.Mutex
	pubAt    [soakMarks]time.Time // guarded by mu: when update seq was published, at seq%soakMarks...
	pubSeq   [soakMarks]int       // ...if pubSeq there is seq...
	pubSkip  [soakMarks]bool      // ...and whether its receipts are left out of the fan-out
	pending  []soakReceipt        // guarded by mu: receipts of updates not yet known published
	fanOut   []time.Duration      // guarded by mu: this interval's receipts
	firstErr error                // guarded by mu
}

// soakReceipt is a client's receipt, at t, of update seq of a name it
// subscribed to at since.
type soakReceipt struct {
	seq      int
	t, since time.Time
}

func newSoakTracker(clients int) *soakTracker {
	return &soakTracker{clients: clients, wake: make(chan struct{}, 1)}
}

// configured records a client's first config.
func (st *soakTracker) configured() {
	st.nConfigured.Add(1)
	select {
	case st.wake <- struct{}{}:
	default:
	}
}

// waitConfigured returns once every client has had a first config.
func (st *soakTracker) waitConfigured(ctx context.Context) error {
	for st.nConfigured.Load() < int64(st.clients) {
		select {
		case <-st.wake:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// nack counts a response and tells whether it is the one in every that
// the clients NACK.
func (st *soakTracker) nack(every int) bool {
	if st.responses.Add(1)%int64(every) != 0 {
		return false
	}
	st.nacks.Add(1)
	return true
}

func (st *soakTracker) streamError(i int, err error) {
	st.failures.Add(1)
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.firstErr == nil {
		st.firstErr = fmt.Errorf("client %d: %w", i, err)
	}
}

// announce lets clients take marks for update seq; it comes before the
// update is sent.
func (st *soakTracker) announce(seq int) { st.announced.Store(int64(seq)) }

// unwrap returns the update whose mark (seqCoding.seqOf, wrapped over
// soakMarks) a resource carries: the latest announced one with that mark.
// It is -1 for the initial resources (mark 0) and foreign ones; a client
// never lags soakMarks updates behind.
func (st *soakTracker) unwrap(mark int) int {
	p := int(st.announced.Load())
	if mark <= 0 || p <= 0 {
		return -1
	}
	lag := ((p-1)%soakMarks - (mark - 1) + soakMarks) % soakMarks
	if s := p - lag; s > 0 {
		return s
	}
	return -1
}

// published records that update seq was handed to the control plane at t,
// and the fan-out of the receipts that came before this was known; unless
// counted, its receipts are left out.
func (st *soakTracker) published(seq int, t time.Time, counted bool) {
	st.changes.Add(1)
	st.mu.Lock()
	defer st.mu.Unlock()
	k := seq % soakMarks
	st.pubAt[k], st.pubSeq[k], st.pubSkip[k] = t, seq, !counted
	st.pending = slices.DeleteFunc(st.pending, func(r soakReceipt) bool {
		if r.seq == seq {
			st.addLocked(r, k)
		}
		return r.seq <= seq
	})
}

// receipt records a client's receipt of update seq at t; it counts in the
// fan-out if the client was subscribed before the update was published.
func (st *soakTracker) receipt(seq int, t, since time.Time) {
	r := soakReceipt{seq: seq, t: t, since: since}
	st.mu.Lock()
	defer st.mu.Unlock()
	if k := seq % soakMarks; st.pubSeq[k] == seq {
		st.addLocked(r, k)
		return
	}
	st.pending = append(st.pending, r)
}

// addLocked counts r, a receipt of the update published in slot k.
func (st *soakTracker) addLocked(r soakReceipt, k int) {
	if pub := st.pubAt[k]; !st.pubSkip[k] && !r.since.After(pub) {
		st.fanOut = append(st.fanOut, max(r.t.Sub(pub), 0))
	}
}

// takeFanOut returns the p50 of the receipts since the last call, and how
// many there were.
func (st *soakTracker) takeFanOut() (time.Duration, int) {
	st.mu.Lock()
	lat := st.fanOut
	st.fanOut = nil
	st.mu.Unlock()
	slices.Sort(lat)
	return Percentile(lat, 50), len(lat)
}

// count copies the counts into sk.
func (st *soakTracker) count(sk *Soak) {
	sk.Changes, sk.Restarts = st.changes.Load(), st.restarts.Load()
	sk.Reconnects, sk.Resubscribes = st.reconnects.Load(), st.resubscribes.Load()
	sk.Responses, sk.NACKs, sk.StreamFailures = st.responses.Load(), st.nacks.Load(), st.failures.Load()
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.firstErr != nil {
		sk.FirstError = st.firstErr.Error()
	}
}

func (st *soakTracker) progressLine(elapsed time.Duration, clients int) string {
	return fmt.Sprintf("xdsload: %4.0fs soak: configured %d/%d, %d changes, %d control-plane restarts, %d reconnects, %d resubscriptions, %d NACKs, %d stream failures",
		elapsed.Seconds(), st.nConfigured.Load(), clients, st.changes.Load(), st.restarts.Load(),
		st.reconnects.Load(), st.resubscribes.Load(), st.nacks.Load(), st.failures.Load())
}
