package loadtest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/anypb"
)

// soakTracker is what a soak's clients saw: first configs, the receipts of
// the updates (the fan-out of the current row's interval), what each
// client holds now, and counts.
type soakTracker struct {
	// Read-only after newSoakTracker.
	clients int
	names   []string      // the pool of names the clients subscribe among
	pool    int           // len(names)
	width   int           // names each subscribes to
	wake    chan struct{} // capacity 1: poked when a client is configured

	// What every client holds now: each client's goroutine writes its
	// own, the end of the run reads them all.
	first []atomic.Int32 // per client: the first name of its window over the pool
	hold  []atomic.Int32 // per client and name (i*pool+j): the update its last copy carries; -1: none
	// latest, per name of the pool, is the last update published to it
	// (0: the initial resource); the driver writes it.
	latest []atomic.Int64

	// Atomic.
	announced    atomic.Int64 // the last update announced, before it is sent
	nConfigured  atomic.Int64 // clients with a first config
	responses    atomic.Int64
	nacks        atomic.Int64
	reconnects   atomic.Int64
	resubscribes atomic.Int64
	faults       [nFaultKinds]atomic.Int64 // injected, by kind: restarts of the control plane, ...
	changes      atomic.Int64              // published
	failures     atomic.Int64              // streams that failed or were refused
	removals     atomic.Int64              // subscribed names told removed, which the control plane serves
	wentBack     atomic.Int64              // copies older than the one the client held

	mu       sync.Mutex
	pubAt    [soakMarks]time.Time // guarded by mu: when update seq was published, at seq%soakMarks...
	pubSeq   [soakMarks]int       // ...if pubSeq there is seq...
	pubSkip  [soakMarks]bool      // ...and whether its receipts are left out of the fan-out
	pending  []soakReceipt        // guarded by mu: receipts of updates not yet known published
	fanOut   []time.Duration      // guarded by mu: this interval's receipts
	firstErr error                // guarded by mu
	firstRm  string               // guarded by mu: the first removal, told as it was
}

// soakReceipt is a client's receipt, at t, of update seq of a name it
// subscribed to at since.
type soakReceipt struct {
	seq      int
	t, since time.Time
}

func newSoakTracker(clients int, pool []string, width int) *soakTracker {
	n := len(pool)
	st := &soakTracker{clients: clients, names: pool, pool: n, width: width, wake: make(chan struct{}, 1),
		first: make([]atomic.Int32, clients), hold: make([]atomic.Int32, clients*n), latest: make([]atomic.Int64, n)}
	for k := range st.hold {
		st.hold[k].Store(-1)
	}
	return st
}

// setFirst records the first name of client i's window.
func (st *soakTracker) setFirst(i, first int) { st.first[i].Store(int32(first % st.pool)) }

// holds records that client i now holds update v of name j; one older than
// what it held counts as going back.
func (st *soakTracker) holds(i, j, v int) {
	if old := st.hold[i*st.pool+j].Swap(int32(v)); v < int(old) {
		st.wentBack.Add(1)
	}
}

// removal records that client i was told that name j, which it subscribes
// to and the control plane serves, was removed (how: in which way); it
// holds nothing of it now.
func (st *soakTracker) removal(i, j int, name, how string) {
	st.hold[i*st.pool+j].Store(-1)
	st.removals.Add(1)
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.firstRm == "" {
		variant := "delta"
		if i%2 == 1 {
			variant = "SotW"
		}
		st.firstRm = fmt.Sprintf("client %d (%s) told %s was removed: %s", i, variant, name, how)
	}
}

// latestNow returns, per name of the pool, the last update published to
// it.
func (st *soakTracker) latestNow() []int64 {
	out := make([]int64, st.pool)
	for j := range out {
		out[j] = st.latest[j].Load()
	}
	return out
}

// version is the update a resource of the run carries (see seqCoding): 0
// for the initial one, -1 for one this run never published.
func (st *soakTracker) version(coding seqCoding, a *anypb.Any) int {
	mark := coding.seqOf(a)
	if mark <= 0 {
		return mark
	}
	return st.unwrap(mark)
}

// behind counts the clients that do not hold, of some name of their
// window, the last update published to it, and those names; example
// tells of the first.
func (st *soakTracker) behind() (clients, names int, example string) {
	for i := range st.clients {
		first, n := int(st.first[i].Load()), 0
		for k := range st.width {
			j := (first + k) % st.pool
			held, want := int64(st.hold[i*st.pool+j].Load()), st.latest[j].Load()
			if held == want {
				continue
			}
			if n++; clients == 0 && n == 1 {
				example = fmt.Sprintf("client %d holds update %d of %s, the control plane's last is %d (-1: nothing)", i, held, st.names[j], want)
			}
		}
		if n > 0 {
			clients, names = clients+1, names+n
		}
	}
	return clients, names, example
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
// the clients NACK; none if every is 0.
func (st *soakTracker) nack(every int) bool {
	if n := st.responses.Add(1); every <= 0 || n%int64(every) != 0 {
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
	st.latest[(seq-1)%st.pool].Store(int64(seq))
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

// firstRemoval tells of the first removal, if any.
func (st *soakTracker) firstRemoval() string {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.firstRm
}

// count copies the counts into sk.
func (st *soakTracker) count(sk *Soak) {
	sk.Changes, sk.Restarts = st.changes.Load(), st.faults[faultRestart].Load()
	sk.Silences, sk.Trickles, sk.Resets = st.faults[faultSilence].Load(), st.faults[faultTrickle].Load(), st.faults[faultReset].Load()
	sk.Reconnects, sk.Resubscribes = st.reconnects.Load(), st.resubscribes.Load()
	sk.Responses, sk.NACKs, sk.StreamFailures = st.responses.Load(), st.nacks.Load(), st.failures.Load()
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.firstErr != nil {
		sk.FirstError = st.firstErr.Error()
	}
}

func (st *soakTracker) progressLine(elapsed time.Duration, clients int) string {
	return fmt.Sprintf("xdsload: %4.0fs soak: configured %d/%d, %d changes, %d control-plane restarts, %d silences, %d trickles, %d resets, %d reconnects, %d resubscriptions, %d NACKs, %d stream failures, %d removals",
		elapsed.Seconds(), st.nConfigured.Load(), clients, st.changes.Load(), st.faults[faultRestart].Load(),
		st.faults[faultSilence].Load(), st.faults[faultTrickle].Load(), st.faults[faultReset].Load(),
		st.reconnects.Load(), st.resubscribes.Load(), st.nacks.Load(), st.failures.Load(), st.removals.Load())
}

func (st *soakTracker) rollingLine(elapsed time.Duration, clients int) string {
	behind, _, _ := st.behind()
	return fmt.Sprintf("xdsload: %4.0fs rolling restart: configured %d/%d, %d changes, %d stream failures, %d removals, %d clients behind the last change",
		elapsed.Seconds(), st.nConfigured.Load(), clients, st.changes.Load(), st.failures.Load(), st.removals.Load(), behind)
}
