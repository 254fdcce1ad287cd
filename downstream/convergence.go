package downstream

import (
	"time"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// Convergence: each change of a client's per-resource status (sent a new
// version, ACKed, NACKed, forgotten, the stream gone) moves the client in
// its group's counters, which the cache keeps beside its versions
// (cache/convergence.go; docs/architecture.md, invariant 19 "Count as it
// happens"), per resource and, through its watch, as one client
// (cache/clients.go). The moves are made where the status record is written, under
// its mutex, so that the counters say what CSDS says: pending is REQUESTED
// with a version, accepted ACKED, rejected NACKED. A stream keeps nothing
// for this but the time of its last ACK per type.

// standing is a status record's place in the counters.
func standing(version string, state ResourceState) cache.Standing {
	if version == "" {
		return cache.Standing{}
	}
	switch state {
	case Requested:
		return cache.Standing{Version: version, Answer: cache.Pending}
	case Acked:
		return cache.Standing{Version: version, Answer: cache.Accepted}
	case Nacked:
		return cache.Standing{Version: version, Answer: cache.Rejected}
	}
	return cache.Standing{}
}

// mover moves one type of a stream in its group's counters; call its
// methods with the stream status's mu held.
type mover struct {
	s       *streamStatus
	t       *typeStatus
	typeURL string
}

func (s *streamStatus) mover(typeURL string, t *typeStatus) mover {
	return mover{s: s, t: t, typeURL: typeURL}
}

// move moves name from one record to the next; received is when the
// change that brought to's version arrived, for a send.
func (mv mover) move(name string, from, to resStatus, received, now time.Time) {
	msg := ""
	if to.nack != nil {
		msg = to.nack.msg
	}
	mv.moveTo(name, standing(from.version, from.state), standing(to.version, to.state), msg, received, now)
}

// gone takes name out of the counters: the client no longer holds it.
func (mv mover) gone(name string, from resStatus) {
	mv.moveTo(name, standing(from.version, from.state), cache.Standing{}, "", time.Time{}, time.Time{})
}

func (mv mover) moveTo(name string, from, to cache.Standing, msg string, received, now time.Time) {
	if from == to || mv.s == nil || mv.s.cache == nil {
		return
	}
	m := cache.Mover{Client: mv.s.watch, Error: msg, Since: time.Unix(0, max(mv.s.opened, mv.t.accepted))}
	if from.Answer == cache.Rejected || to.Answer == cache.Rejected {
		m.Node = xds.Clip(mv.s.node.GetId())
	}
	if took := mv.s.cache.Move(mv.typeURL, name, from, to, received, now, m); took > 0 && mv.s.push != nil {
		mv.s.push.converged(mv.typeURL, took)
	}
}

// reshare moves the client from the shared state it was sent (if any) to
// st, sent now and pending (nil: none). The counters count a shared state
// once per client, not once per resource of it (cache.Cache.MoveShared).
func (mv mover) reshare(st *cache.State, now time.Time) {
	var received time.Time
	if st != nil {
		received = st.Received
	}
	fs := Requested // of no state: nothing to leave
	if mv.t.sh != nil {
		fs = mv.t.sh.state
	}
	mv.moveShared(mv.t.shared, fs, st, Requested, "", received, now)
}

// answerShared moves the client, standing with the shared state, from the
// state it had to the one its answer gave it.
func (mv mover) answerShared(from ResourceState, now time.Time) {
	sh := mv.t.sh
	msg := ""
	if sh.state == Nacked {
		msg = sh.nack
	}
	mv.moveShared(mv.t.shared, from, mv.t.shared, sh.state, msg, time.Time{}, now)
}

// unshare turns the client's count through the shared state into counts
// by name, as its records become per name (typeStatus.unshare).
func (mv mover) unshare() {
	if mv.s == nil || mv.s.cache == nil || mv.t.shared == nil {
		return
	}
	mv.s.cache.Unshare(mv.typeURL, mv.t.shared, answer(mv.t.sh.state))
}

// answer is a state's answer in the counters.
func answer(s ResourceState) cache.Answer { return standing("v", s).Answer }

// moveShared moves the client from the shared state from, at state fs,
// to to, at state ts (see cache.Cache.MoveShared).
func (mv mover) moveShared(from *cache.State, fs ResourceState, to *cache.State, ts ResourceState, msg string, received, now time.Time) {
	if mv.s == nil || mv.s.cache == nil || from == nil && to == nil {
		return
	}
	m := cache.Mover{Client: mv.s.watch, Error: msg, Since: time.Unix(0, max(mv.s.opened, mv.t.accepted))}
	if fs == Nacked || ts == Nacked {
		m.Node = xds.Clip(mv.s.node.GetId())
	}
	var observe func(time.Duration)
	if mv.s.push != nil {
		observe = func(took time.Duration) { mv.s.push.converged(mv.typeURL, took) }
	}
	mv.s.cache.MoveShared(mv.typeURL, from, answer(fs), to, answer(ts), received, now, m, observe)
}

// left takes the whole stream out of the counters: a client that leaves
// takes its counts with it.
func (s *streamStatus) left() {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	for typeURL, t := range s.types.all() {
		mv := s.mover(typeURL, t)
		mv.reshare(nil, now)
		t.shared = nil
		for n, r := range t.res.all() {
			mv.gone(n, r)
		}
		t.res.clear()
		clear(t.pending)
		t.pending = t.pending[:0]
	}
}
