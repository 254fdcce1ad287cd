package downstream

import (
	"context"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// An error is never absence (docs/architecture.md, invariant 21). A SotW
// Listener or Cluster response is the type's complete state: a name it
// leaves out is deleted by every client that does not read
// resource_errors, which is Envoy and gRPC before A88 or without
// ignore_resource_deletion ("Grouping Resources into Responses",
// "Deleting Resources": "a previously seen resource"). A client keeps
// what it has seen across streams (its first request on a new stream
// carries the version it accepted: "ACK/NACK and resource type instance
// version"), so a relay that restarted, or reached a client that had
// another, must not send a state that leaves out a name the client may
// hold while the relay merely lacks it.
//
// The names of a type's first request on the stream are the ones the
// client may hold (prior), until a state of the type is sent. Each is
// settled for that state if it is in it, or known not to be had (absent,
// or a data error: xds.DataError). Otherwise it is only unavailable: not
// yet received, or with a transient error (UNAVAILABLE...):
//   - If the first request carried a version_info (resumed), the client
//     holds a state of the type, and the relay holds the type's answer
//     back; the handler waits (pump.awaitHeld), reading no request, and
//     once Options.HeldWait (upstream.connect_timeout) has passed since
//     that request it ends the stream with UNAVAILABLE. Envoy's gRPC mux
//     and gRPC's XdsClient both keep their config through a stream that
//     ends, start no does-not-exist timer for what they hold, and
//     reconnect (another replica, or an A71 fallback, may hold the name);
//     a hold alone would leave a client's later subscriptions to its
//     timer. The relay never leaves the name out.
//   - Otherwise the client holds nothing of the type from an earlier
//     stream (a new client), or is a relay of a lower tier, which keeps no
//     version across streams and reads resource_errors: the state goes out
//     as soon as it would, each such name with its error, or with an
//     UNAVAILABLE the relay makes ("not received yet"), so that a relay
//     below keeps what it holds (upstream's absent) and a new client gets
//     what the relay has at once.
//
// Names subscribed later on the stream are new to the client and are not
// held for: a response may have been built before the request that named
// them ("Knowing When a Requested Resource Does Not Exist").

// notYetMessage is the message of the UNAVAILABLE the relay makes for a
// name it has not received, left out of a state (see above).
const notYetMessage = "xdsrelay has not received it from the control plane yet"

// firstNames are the names of a Listener or Cluster type's first request
// on the stream, until a state of the type is sent.
type firstNames struct {
	prior map[string]struct{}
	// holdUntil, if the request carried a version_info, is when the stream
	// ends if no state could be sent by then; zero otherwise.
	holdUntil time.Time
}

// expect notes, at the first request of a Listener or Cluster type on the
// stream, the names the client may hold, and whether it said it holds a
// state of the type (version, the request's version_info).
func (ss *sotwStream) expect(typeURL string, t *sotwType, version string) {
	if !xds.FullState(typeURL) || t.names.len() == 0 {
		return
	}
	f := &firstNames{prior: make(map[string]struct{}, t.names.len())}
	for n := range t.names.all() {
		if n != noName {
			f.prior[n] = struct{}{}
		}
	}
	if len(f.prior) == 0 {
		return
	}
	if version != "" {
		f.holdUntil = time.Now().Add(ss.srv.heldWait)
		atomic.AddInt32(&ss.holds, 1)
	}
	t.first = f
}

// unexpect drops a name the client no longer asks for from those held
// for.
func (ss *sotwStream) unexpect(t *sotwType, name string) {
	if t.first == nil {
		return
	}
	delete(t.first.prior, name)
	if len(t.first.prior) == 0 {
		ss.settled(t)
	}
}

// settled ends the type's wait on its first state: it has been sent, or
// nothing is held for any more.
func (ss *sotwStream) settled(t *sotwType) {
	if t.first == nil {
		return
	}
	if !t.first.holdUntil.IsZero() {
		atomic.AddInt32(&ss.holds, -1)
	}
	t.first = nil
}

// unsettled looks at the names held for in lookups, the state about to be
// sent: hold reports that it must not be sent (a resumed client, a name
// only unavailable); otherwise made are the errors the relay makes for the
// names not yet received, to go out with it.
func (ss *sotwStream) unsettled(t *sotwType, lookups []cache.Lookup) (hold bool, made []*cache.ResourceError) {
	f := t.first
	if f == nil {
		return false, nil
	}
	for _, l := range lookups {
		if _, ok := f.prior[l.Name]; !ok {
			continue
		}
		ss.refusedError(&l)
		if !onlyUnavailable(l) {
			continue
		}
		if !f.holdUntil.IsZero() {
			return true, nil
		}
		if l.Error == nil && t.errSent[l.Name] == nil {
			made = append(made, xds.NewError(l.Name, codes.Unavailable, notYetMessage))
		}
	}
	return false, made
}

// onlyUnavailable reports whether l is a name the relay does not have and
// does not know not to exist.
func onlyUnavailable(l cache.Lookup) bool {
	return l.Resource == nil && !l.Absent && l.Name != noName && (l.Error == nil || !xds.DataError(l.Error.Code))
}

// heldUntil is when the earliest held first state ends the stream; zero
// if none is held.
func (ss *sotwStream) heldUntil() time.Time {
	var until time.Time
	for _, t := range ss.types.all() {
		if f := t.first; f != nil && !f.holdUntil.IsZero() && (until.IsZero() || f.holdUntil.Before(until)) {
			until = f.holdUntil
		}
	}
	return until
}

// heldEnd is the end of a stream whose first state of a type stayed held
// past its bound: UNAVAILABLE, naming the type and a name it lacks, and
// counted (xdsrelay_downstream_held_ends_total). nil if every such type
// now lacks nothing: the flush the cache marked sends its state.
func (ss *sotwStream) heldEnd() error {
	for typeURL, t := range ss.types.all() {
		f := t.first
		if f == nil || f.holdUntil.IsZero() || time.Now().Before(f.holdUntil) {
			continue
		}
		short, name, why := xds.ShortName(typeURL), "", notYetMessage
		for _, l := range ss.cache.Get(typeURL, slices.Sorted(maps.Keys(f.prior))) {
			if ss.refusedError(&l); onlyUnavailable(l) {
				if name = l.Name; l.Error != nil {
					why = l.Error.Message
				}
				break
			}
		}
		if name == "" {
			continue
		}
		ss.srv.heldEnds.With(short).Inc()
		return status.Errorf(codes.Unavailable,
			"xdsrelay: %s %q is not available (%s), and a state of the world without it would delete it: the stream ends so that the client keeps what it has (waited %s)",
			short, xds.Clip(name), xds.Clip(why), ss.srv.heldWait)
	}
	return nil
}

// holder is a protocol that may hold a type's first state (sotwStream).
type holder interface {
	heldUntil() time.Time
	heldEnd() error
}

// awaitHeld holds the handler while the stream holds a Listener or Cluster
// type's first state (see above), until a flush sends it, ctx ends, or its
// bound passes: then the stream ends with the hold's error, which only the
// handler can return. h is the stream's protocol, nil if it holds nothing
// (incremental streams).
func (p *pump) awaitHeld(ctx context.Context, h holder) error {
	b := p.stream
	for h != nil && atomic.LoadInt32(&b.holds) > 0 {
		p.mu.Lock()
		if p.ended {
			err := p.err
			p.mu.Unlock()
			return err
		}
		until := h.heldUntil()
		if until.IsZero() {
			p.mu.Unlock()
			return nil
		}
		if !time.Now().Before(until) {
			err := h.heldEnd()
			if err != nil {
				p.ended, p.err = true, err
			}
			p.mu.Unlock()
			return err
		}
		wake := make(chan struct{})
		b.holdWake = wake
		p.mu.Unlock()
		t := time.NewTimer(time.Until(until))
		select {
		case <-wake:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
		t.Stop()
	}
	return nil
}

// heldWaitDefault is Options.HeldWait when it is zero: upstream's default
// connect timeout.
const heldWaitDefault = 10 * time.Second
