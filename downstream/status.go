package downstream

import (
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/lockorder"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// Per-client status: each stream records, as it sends and as its client
// ACKs or NACKs, what each subscribed name's client holds. The record is
// the stream's own, written by whichever goroutine runs the stream's
// protocol (handler or send worker, one at a time) where it already notes
// what it sent, and read under its mutex by CSDS and
// the admin endpoint (a read-only view, not a second copy of the protocol
// state).

// ResourceState is what a client holds of one resource.
type ResourceState uint8

// The states, as CSDS names them (envoy.admin.v3.ClientResourceStatus).
const (
	Requested    ResourceState = iota // subscribed, not sent yet
	Acked                             // the last response carrying it was ACKed
	Nacked                            // the last response carrying it was NACKed
	DoesNotExist                      // the client was told it does not exist
)

func (s ResourceState) String() string {
	return [...]string{"REQUESTED", "ACKED", "NACKED", "DOES_NOT_EXIST"}[s]
}

// resStatus is one name's record. state is the last one settled; a name
// sent and not yet acknowledged keeps it until the client answers nonce.
// It is kept small (48 bytes): a stream holds one per name.
type resStatus struct {
	version string
	nonce   uint64    // of the response that carried it, until answered; 0 if none
	sent    int64     // when it was last sent, in Unix nanoseconds; 0 if never
	nack    *nackNote // the client's NACK, while state is Nacked
	state   ResourceState
	named   bool // subscribed by name (not only through the wildcard)
}

// nackNote is a NACK's message and time, shared by the names it covers.
type nackNote struct {
	msg string
	at  time.Time
}

// sentAt is r's sent time; zero if never.
func (r resStatus) sentAt() time.Time { return fromUnix(r.sent) }

// unixNano is t in Unix nanoseconds, 0 for the zero time.
func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// fromUnix is the time of Unix nanoseconds n, the zero time for 0.
func fromUnix(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// typeStatus is a stream's record for one type.
//
// A client's answer is applied to the names it covers as it comes
// (apply), so that the group's counters move with it (convergence.go):
// the names still pending, a visit to each that the answer settles.
type typeStatus struct {
	res      inlineMap[resStatus] // by name
	pending  []string             // names sent and not yet answered
	wildcard bool
	// shared is the complete state last sent to a wildcard-only SotW
	// subscription, which keeps no per-name record (see flushWildcard);
	// sh, how it was sent and answered, made at the first such send and
	// kept (set whenever shared is).
	shared     *cache.State
	sh         *sharedSent
	ackVersion string      // version_info of the last ACK
	nack       *nackRecord // the last NACK; nil until the first
	accepted   int64       // when the client last ACKed, in Unix nanoseconds (see cache.Mover.Since)
}

// sharedSent is how a type's shared complete state was sent and answered:
// the response's nonce until answered, the state it left the client in,
// when, and the NACK's message. Only wildcard-only SotW streams have one.
type sharedSent struct {
	nonce uint64
	state ResourceState
	sent  time.Time
	nack  string
}

// nackRecord is a type's last NACK: the version_info it carried, its
// message and time. Most streams never NACK and hold none.
type nackRecord struct {
	version, msg string
	at           time.Time
}

// lastNack returns the type's last NACK, the zero one if none.
func (t *typeStatus) lastNack() nackRecord {
	if t.nack == nil {
		return nackRecord{}
	}
	return *t.nack
}

// apply applies a client's ACK or NACK (state, with note for a NACK) of
// the responses up to nonce to the pending names it covers: a name's fate
// is the first answer that covers its response.
func (t *typeStatus) apply(nonce uint64, state ResourceState, note *nackNote, now time.Time, mv mover) (covered Answered) {
	keep := t.pending[:0]
	for _, name := range t.pending {
		r, ok := t.res.get(name)
		if !ok || r.nonce == 0 {
			continue
		}
		if r.nonce > nonce {
			keep = append(keep, name)
			continue
		}
		covered.add(name, r.version)
		was := r
		r.state, r.nonce, r.nack = state, 0, note
		t.res.set(name, r)
		mv.move(name, was, r, time.Time{}, now)
	}
	clear(t.pending[len(keep):])
	t.pending = keep
	return covered
}

// Answered is what a client's answer covered: how many resources, and the
// first of them with the version it was sent at (a NACK's log line names
// what was rejected).
type Answered struct {
	Resources        int
	First, AtVersion string
}

func (a *Answered) add(name, version string) {
	if a.Resources == 0 {
		a.First, a.AtVersion = name, version
	}
	a.Resources++
}

// streamStatus is one stream's record, registered with the server while
// the stream runs.
type streamStatus struct {
	node    *corepb.Node // read-only
	variant string       // read-only
	cache   *cache.Cache // read-only: the group's cache
	watch   *cache.Watch // read-only: the stream's watch, whose standing the moves change (cache.Mover.Client)
	push    *pushMetrics // read-only: times to accept are observed there; nil: not observed
	opened  int64        // read-only: when the stream opened, in Unix nanoseconds

	mu    lockorder.Mutex[streamStatusMu]
	types byType[typeStatus]
}

// typ returns the type's record; call with mu held.
func (s *streamStatus) typ(typeURL string) *typeStatus {
	if t := s.types.get(typeURL); t != nil {
		return t
	}
	t := &typeStatus{}
	s.types.put(typeURL, t)
	return t
}

// subscribed records names subscribed by name.
func (s *streamStatus) subscribed(typeURL string, names []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.typ(typeURL)
	for _, n := range names {
		r, _ := t.res.get(n)
		r.named = true
		t.res.set(n, r)
	}
}

// unsubscribed forgets names no longer subscribed by name.
func (s *streamStatus) unsubscribed(typeURL string, names []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.typ(typeURL)
	mv := s.mover(typeURL, t)
	for _, n := range names {
		if r, ok := t.res.get(n); ok {
			t.res.remove(n)
			mv.gone(n, r)
		}
	}
}

// setWildcard records whether the type is subscribed with the wildcard.
func (s *streamStatus) setWildcard(typeURL string, on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.typ(typeURL)
	t.wildcard = on
	if !on {
		mv := s.mover(typeURL, t)
		mv.reshare(nil, time.Now())
		t.shared = nil
		t.res.removeFunc(func(n string, r resStatus) bool {
			if !r.named {
				mv.gone(n, r)
			}
			return !r.named
		})
	}
}

// sending opens the record of a response about to be sent on typeURL with
// nonce; it returns with mu held, released by done. full says the response
// is the type's complete state: what it omits the client no longer has.
func (s *streamStatus) sending(typeURL string, full bool) sendRec {
	return s.sendingFrom(typeURL, full, 0)
}

// sendingFrom is sending for a response read from a view of the cache
// whose latest change arrived at received (cache.View.Received, in Unix
// nanoseconds: a number, so that the view's lookups, which a flush keeps
// on its stack, are not taken to escape with it; 0 if unknown).
func (s *streamStatus) sendingFrom(typeURL string, full bool, received int64) sendRec {
	s.mu.Lock()
	t := s.typ(typeURL)
	mv := s.mover(typeURL, t)
	t.unshare(mv)
	if full {
		t.res.removeFunc(func(n string, r resStatus) bool {
			if !r.named {
				mv.gone(n, r)
			}
			return !r.named
		})
		for n, r := range t.res.all() {
			was := r
			r.version, r.state, r.nonce = "", Requested, 0
			t.res.set(n, r)
			mv.gone(n, was)
		}
	}
	return sendRec{t, mv, received}
}

// sendRec is the record of a response being sent: the type's, with what
// it moves in the cache's counters (convergence.go).
type sendRec struct {
	*typeStatus
	mv       mover
	received int64 // in Unix nanoseconds; 0 if unknown
}

func (s *streamStatus) done() { s.mu.Unlock() }

// unshare turns a shared sent state into per-name records.
func (t *typeStatus) unshare(mv mover) {
	if t.shared == nil {
		return
	}
	sh := t.sh
	var note *nackNote
	if sh.state == Nacked {
		note = &nackNote{msg: sh.nack, at: t.lastNack().at}
	}
	mv.unshare()
	for _, r := range t.shared.Resources {
		e, had := t.res.get(r.Name)
		if had {
			mv.gone(r.Name, e) // counted through the shared state from now on
		}
		e.version, e.state, e.sent, e.nack = r.Version, sh.state, sh.sent.UnixNano(), note
		if sh.nonce != 0 {
			e.nonce = sh.nonce
			t.pending = append(t.pending, r.Name)
		}
		t.res.set(r.Name, e)
	}
	t.shared = nil
}

// sent records that name at version goes out in the response nonce. A
// version the client has not had before is pending until it answers.
func (rec sendRec) sent(name, version string, nonce uint64, now time.Time) {
	t := rec.typeStatus
	r, _ := t.res.get(name)
	was := r
	if version != r.version {
		r.state, r.nack = Requested, nil
	}
	if r.nonce == 0 {
		if len(t.pending) >= 2*t.res.len()+16 {
			t.compact() // a client that never answers, with names coming and going
		}
		t.pending = append(t.pending, name)
	}
	r.version, r.nonce, r.sent = version, nonce, now.UnixNano()
	t.res.set(name, r)
	rec.mv.move(name, was, r, fromUnix(rec.received), now)
}

// compact drops from pending the names no longer waiting for an answer.
func (t *typeStatus) compact() {
	keep, seen := t.pending[:0], make(map[string]struct{}, t.res.len())
	for _, n := range t.pending {
		_, dup := seen[n]
		if r, ok := t.res.get(n); ok && r.nonce != 0 && !dup {
			keep = append(keep, n)
			seen[n] = struct{}{}
		}
	}
	clear(t.pending[len(keep):])
	t.pending = keep
}

// forget drops the record of a name the client no longer has, unless it
// is subscribed by name: what only the wildcard brought is not kept once
// gone, so that the record stays within what the stream holds.
func (rec sendRec) forget(name string) {
	if r, ok := rec.res.get(name); ok && !r.named {
		rec.res.remove(name)
		rec.mv.gone(name, r)
	}
}

// absent records that the client is told name does not exist.
func (rec sendRec) absent(name string, now time.Time) {
	t := rec.typeStatus
	r, ok := t.res.get(name)
	if !ok || !r.named {
		t.res.remove(name) // gone from the wildcard: not kept (see forget)
		rec.mv.gone(name, r)
		return
	}
	was := r
	r.version, r.state, r.nonce, r.sent, r.nack = "", DoesNotExist, 0, now.UnixNano(), nil
	t.res.set(name, r)
	rec.mv.gone(name, was)
}

// sentShared records the complete state st, sent as one response nonce.
func (s *streamStatus) sentShared(typeURL string, st *cache.State, nonce uint64, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.typ(typeURL)
	mv := s.mover(typeURL, t)
	t.res.removeFunc(func(n string, r resStatus) bool {
		if !r.named {
			mv.gone(n, r)
		}
		return !r.named
	})
	mv.reshare(st, now)
	if t.sh == nil {
		t.sh = &sharedSent{}
	}
	t.shared, t.sh.state, t.sh.nonce, t.sh.sent = st, Requested, nonce, now
}

// answered records the client's ACK (nack false) or NACK of the responses
// of typeURL up to nonce ("ACK/NACK and resource type instance version").
func (s *streamStatus) answered(typeURL, nonce, version string, nack bool, msg string, now time.Time) (covered Answered) {
	n, err := strconv.ParseUint(nonce, 10, 64)
	if err != nil || n == 0 {
		return covered // an initial request, or a nonce this stream never sent
	}
	state := Acked
	if nack {
		state = Nacked
		msg = xds.Clip(msg)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.typ(typeURL)
	mv := s.mover(typeURL, t)
	if nack {
		if t.nack == nil {
			t.nack = &nackRecord{}
		}
		*t.nack = nackRecord{version: version, msg: msg, at: now}
	} else {
		t.ackVersion = version
	}
	if sh := t.sh; t.shared != nil && sh.nonce != 0 && sh.nonce <= n {
		from := sh.state
		sh.state, sh.nonce = state, 0
		if nack {
			sh.nack = msg
		}
		mv.answerShared(from, now)
		if rs := t.shared.Resources; len(rs) > 0 {
			covered = Answered{Resources: len(rs), First: rs[0].Name, AtVersion: rs[0].Version}
		}
	}
	if len(t.pending) > 0 {
		var note *nackNote
		if nack {
			note = &nackNote{msg: msg, at: now}
		}
		if c := t.apply(n, state, note, now, mv); c.Resources > 0 {
			covered = c
		}
	}
	if !nack {
		t.accepted = now.UnixNano()
	}
	return covered
}

// ResourceStatus is what a client holds of one resource.
type ResourceStatus struct {
	Name    string
	Version string // sent; empty if none
	State   ResourceState
	Sent    time.Time // when it was last sent (or the client told it does not exist); zero if never
	// Error and ErrorAt are the client's NACK of the resource, if State
	// is Nacked.
	Error   string
	ErrorAt time.Time
}

// TypeStatus is a client's status for one type.
type TypeStatus struct {
	TypeURL     string
	Wildcard    bool
	Named       int    // names subscribed by name
	AckVersion  string // version_info of the last ACK
	NackVersion string // of the last NACK, with its message and time
	NackError   string
	NackAt      time.Time
	Resources   []ResourceStatus // sorted by name
}

// ClientStatus is one stream's view: its node, variant, group cache and
// per-type status.
type ClientStatus struct {
	Node    *corepb.Node
	Variant string
	Cache   *cache.Cache
	Types   []TypeStatus // sorted by type URL
}

// snapshot copies the stream's record.
func (s *streamStatus) snapshot() ClientStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := ClientStatus{Node: s.node, Variant: s.variant, Cache: s.cache}
	for typeURL, t := range s.types.all() {
		out.Types = append(out.Types, t.snapshot(typeURL))
	}
	slices.SortFunc(out.Types, func(a, b TypeStatus) int { return strings.Compare(a.TypeURL, b.TypeURL) })
	return out
}

// snapshot copies the type's record; call with the stream's mu held.
func (t *typeStatus) snapshot(typeURL string) TypeStatus {
	last := t.lastNack()
	ts := TypeStatus{TypeURL: typeURL, Wildcard: t.wildcard, AckVersion: t.ackVersion,
		NackVersion: last.version, NackError: last.msg, NackAt: last.at}
	for name, r := range t.res.all() {
		if r.named {
			ts.Named++
		}
		rs := ResourceStatus{Name: name, Version: r.version, State: r.state, Sent: r.sentAt()}
		if r.state == Nacked && r.nack != nil {
			rs.Error, rs.ErrorAt = r.nack.msg, r.nack.at
		}
		ts.Resources = append(ts.Resources, rs)
	}
	if t.shared != nil {
		for _, r := range t.shared.Resources {
			if _, ok := t.res.get(r.Name); ok {
				continue
			}
			rs := ResourceStatus{Name: r.Name, Version: r.Version, State: t.sh.state, Sent: t.sh.sent}
			if rs.State == Nacked {
				rs.Error, rs.ErrorAt = t.sh.nack, last.at
			}
			ts.Resources = append(ts.Resources, rs)
		}
	}
	slices.SortFunc(ts.Resources, func(a, b ResourceStatus) int { return strings.Compare(a.Name, b.Name) })
	return ts
}

// registry is the server's set of live streams.
type registry struct {
	mu      lockorder.Mutex[registryMu]
	streams map[*streamStatus]struct{}
}

func (r *registry) add(s *streamStatus) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.streams == nil {
		r.streams = map[*streamStatus]struct{}{}
	}
	r.streams[s] = struct{}{}
}

func (r *registry) remove(s *streamStatus) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.streams, s)
}

func (r *registry) list() []*streamStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Collect(maps.Keys(r.streams))
}

// Clients returns the status of every live xDS stream whose node keep
// accepts (all if keep is nil), ordered by node id.
func (s *Server) Clients(keep func(*corepb.Node) bool) []ClientStatus {
	var out []ClientStatus
	for _, st := range s.registry.list() {
		if keep == nil || keep(st.node) {
			out = append(out, st.snapshot())
		}
	}
	slices.SortFunc(out, func(a, b ClientStatus) int { return strings.Compare(a.Node.GetId(), b.Node.GetId()) })
	return out
}
