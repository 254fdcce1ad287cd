package upstream

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// asked is names subscribed together on the stream, not yet answered.
type asked struct {
	typeURL  string
	names    []string
	wildcard bool      // the wildcard was subscribed with them: timed only to see whether the stream answered at all (unheard)
	at       time.Time // when they were asked
	deadline time.Time
}

// notFound is the stream's does-not-exist timer ("Knowing When a Requested
// Resource Does Not Exist"): a name subscribed on the stream that upstream
// has neither sent nor removed within the timeout is taken not to exist,
// as gRPC (A57) and Envoy (initial_fetch_timeout) do, but only on the word
// of a stream known to be alive since the name was asked (see timedOut).
// Should it arrive later, it is applied like any update. Owned by the
// session loop.
type notFound struct {
	timeout time.Duration // 0: disabled
	queue   []asked       // by deadline: every batch gets the same timeout
	timer   *time.Timer   // armed for queue[0]; nil when the queue is empty
	// erred is, by type, the names still subscribed that upstream answered
	// with a resource error (gRFC A88), with its code, until the resource
	// arrives: an answer, which the timer leaves alone (see errored), and
	// which absence from a full state does not overrule (absent).
	erred map[string]map[string]int32
}

// asked starts the timer of what a request just subscribed: its names,
// and the wildcard, which is answered whole and never judged, but whose
// silence is said (unheard).
func (n *notFound) asked(typeURL string, subscribe []string) {
	wildcard := len(subscribe) > 0 && subscribe[0] == "*"
	n.again(asked{typeURL: typeURL, names: timed(subscribe), wildcard: wildcard, at: time.Now()})
}

// again queues a batch for a full timeout from now, keeping when it was
// asked.
func (n *notFound) again(a asked) {
	if n.timeout <= 0 || len(a.names) == 0 && !a.wildcard {
		return
	}
	a.deadline = time.Now().Add(n.timeout)
	n.queue = append(n.queue, a)
	n.arm()
}

func (n *notFound) arm() {
	if len(n.queue) == 0 || n.timer != nil {
		return
	}
	n.timer = time.NewTimer(time.Until(n.queue[0].deadline))
}

// C fires when the earliest deadline passes; nil (never) with none pending.
func (n *notFound) C() <-chan time.Time {
	if n.timer == nil {
		return nil
	}
	return n.timer.C
}

// stop releases the timer when the stream ends: a new stream asks again.
func (n *notFound) stop() {
	if n.timer != nil {
		n.timer.Stop()
		n.timer = nil
	}
	n.queue, n.erred = nil, nil
}

// errored notes names of typeURL that upstream answered with an error. An
// error is the control plane's answer for the name, as a resource or a
// removal is: the timer never overwrites it with NOT_FOUND and a removal.
// UNAVAILABLE above all is transient (gRFC A88), and is what a relay of the
// tier above says while its own control plane is out of reach: turned
// into a removal here, it would be a deletion invented by the relays'
// tiers (docs/architecture.md, invariant 15).
func (n *notFound) errored(typeURL string, errs []*cache.ResourceError) {
	if len(errs) == 0 {
		return
	}
	if n.erred == nil {
		n.erred = map[string]map[string]int32{}
	}
	names := n.erred[typeURL]
	if names == nil {
		names = map[string]int32{}
		n.erred[typeURL] = names
	}
	for _, e := range errs {
		names[e.Name] = e.Code
	}
}

// arrived drops the errors noted of names whose resource upstream has
// sent since: the error is over (gRFC A88).
func (n *notFound) arrived(typeURL string, names []string) {
	erred := n.erred[typeURL]
	if len(erred) == 0 {
		return
	}
	for _, name := range names {
		delete(erred, name)
	}
}

// unavailable reports whether upstream's last word on name, on this
// stream, is an error other than NOT_FOUND: the name is not known not to
// exist (docs/architecture.md, invariant 21).
func (n *notFound) unavailable(typeURL, name string) bool {
	code, ok := n.erred[typeURL][name]
	return ok && code != int32(codes.NotFound)
}

// forget drops what was noted of a name the stream no longer subscribes:
// asked again, it is timed anew.
func (n *notFound) forget(typeURL, name string) {
	delete(n.erred[typeURL], name)
}

// expired takes the batches whose deadline has passed.
func (n *notFound) expired(now time.Time) []asked {
	n.timer = nil
	i := 0
	for i < len(n.queue) && !n.queue[i].deadline.After(now) {
		i++
	}
	out := append([]asked(nil), n.queue[:i]...)
	clear(n.queue[:i]) // let the names go
	n.queue = n.queue[i:]
	n.arm()
	return out
}

// Silence is not an answer (docs/architecture.md, invariant 15). A name the
// timer finds unanswered is reported not to exist only if the stream has
// shown itself alive since the name was asked: a response received since, or a probe of its
// connection answered since. Otherwise clients get UNAVAILABLE for it
// (gRFC A88), never a removal, the connection is probed, and the name waits:
// the probe's answer, or the next response, decides it; a probe unanswered
// puts it back on the timer. A name reported not to exist on a stream that
// then ends in failure is taken back (withdraw): missing again, so that
// gRFC A71 falls back for it and clients get it when it arrives. While a
// response is partly received on the stream's connection, no name is
// judged (invariant 17, stall.go): it may be in that response.

// liveness is a probe of the stream's connection in flight: a health check
// on the same connection, whose answer, any answer, shows that the server's
// end is alive (a half-open connection answers nothing; a live server
// without the health service answers UNIMPLEMENTED).
type liveness struct {
	sent   time.Time
	result chan bool // capacity 1: written once
}

// probeConn probes conn until timeout; see liveness.
func probeConn(ctx context.Context, conn grpc.ClientConnInterface, timeout time.Duration) *liveness {
	p := &liveness{sent: time.Now(), result: make(chan bool, 1)}
	go func() {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		p.result <- answered(err)
	}()
	return p
}

// answered reports whether an RPC's error is the server's answer, not the
// connection's failure or the probe's timeout.
func answered(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return false
	}
	return true
}

// done delivers the probe's result; nil (never) without a probe.
func (p *liveness) done() <-chan bool {
	if p == nil {
		return nil
	}
	return p.result
}

// timedOut decides, for the batches whose time ran out, the names still
// subscribed that upstream has neither sent nor removed: on a stream
// known alive since they were asked they do not exist; otherwise they are
// UNAVAILABLE until the stream shows itself alive.
func (s *session) timedOut(now time.Time) {
	for _, a := range s.notFound.expired(now) {
		s.unheard(a)
		a.names = s.unanswered(a.typeURL, a.names)
		switch {
		case len(a.names) == 0:
		case s.partlyRead():
			s.waitWhole(a)
		case s.aliveSince(a.at):
			s.judge(a.typeURL, a.names)
		default:
			s.undecided = append(s.undecided, a)
			s.unavailable(a.typeURL, a.names)
			s.probeLiveness()
		}
	}
}

// unheard says, once a stream, that the control plane has answered
// nothing on it a whole cache.not_found_timeout after it was asked (a
// batch of the timer expired; the stream resumed nothing, to which a
// control plane with nothing new may rightly say nothing: "Incremental
// reconnect example"). A control plane that keys its config by node
// serves nothing to a node it does not know, and says nothing of it:
// go-control-plane's snapshot cache is keyed by node id, and the node the
// relay presents is the group's (upstream.node.id), never a client's. The
// warning names it, and it shows on the private /readyz until an answer
// comes (Status.Unheard).
func (s *session) unheard(a asked) {
	if s.warnedUnheard || !s.lastResponse.IsZero() || s.resumed {
		return
	}
	s.warnedUnheard = true
	node := s.c.opts.Node.GetId()
	s.c.setStatus(func(st *Status) {
		st.Unheard = fmt.Sprintf("no answer %s after it was asked for %s; node id presented %q (upstream.node.id)",
			s.notFound.timeout, xds.ShortName(a.typeURL), xds.Clip(node))
	})
	s.c.log.Warn(UnheardWarning,
		"server", s.c.servers[s.server].name, "protocol", s.protocol, "type", xds.ShortName(a.typeURL),
		"after", s.notFound.timeout, "node_id", xds.Clip(node), "key", "upstream.node.id",
		"why", "a control plane that keys its config by node (go-control-plane's snapshot cache: by node id) sends nothing to a node it does not know, and the node presented is the group's, never a client's",
		"fix", "set upstream.node.id to an id the control plane serves (\"{id}\" presents the clients' own, with id in upstream.group_by); or it serves none of the names asked",
		"doc", "docs/clients.md#client-kinds-are-kept-apart")
}

// UnheardWarning is the message of the warning that a stream has been
// answered nothing (session.unheard).
const UnheardWarning = "the control plane has answered nothing on this stream a whole cache.not_found_timeout after it was asked"

// probeLiveness probes the stream's connection, unless a probe is in
// flight: one sent before a name was asked cannot decide it, but the probe
// sent once that one is answered can (probed).
func (s *session) probeLiveness() {
	if s.probe == nil {
		s.probe = probeConn(s.ctx, s.c.servers[s.server].conn, s.c.opts.ProbeTimeout)
	}
}

// aliveSince reports whether the stream has shown itself alive after t.
func (s *session) aliveSince(t time.Time) bool {
	return s.lastResponse.After(t) || s.proven.After(t)
}

// probed takes the probe's result: the undecided names asked before it
// was sent are decided, and those asked since are probed for again; with
// no answer they all go back on the timer.
func (s *session) probed(alive bool) {
	sent := s.probe.sent
	s.probe = nil
	if alive {
		s.proven = sent
		s.decide()
		if len(s.undecided) > 0 {
			s.probeLiveness()
		}
		return
	}
	for _, a := range s.undecided {
		s.notFound.again(a)
	}
	s.undecided = nil
	s.c.log.Warn("the control plane's connection did not answer a probe: names it has not sent stay UNAVAILABLE to clients, not removed",
		"server", s.c.servers[s.server].name)
}

// decide judges the undecided names asked before the stream's latest proof
// of life; while a response is partly read, none.
func (s *session) decide() {
	if s.partlyRead() {
		for _, a := range s.undecided {
			s.waitWhole(a)
		}
		clear(s.undecided)
		s.undecided = s.undecided[:0]
		return
	}
	keep := s.undecided[:0]
	for _, a := range s.undecided {
		if !s.aliveSince(a.at) {
			keep = append(keep, a)
			continue
		}
		if names := s.unanswered(a.typeURL, a.names); len(names) > 0 {
			s.judge(a.typeURL, names)
		}
	}
	clear(s.undecided[len(keep):])
	s.undecided = keep
}

// unanswered keeps, of names of typeURL, those still subscribed that the
// cache neither holds nor knows not to exist, and that upstream has not
// answered with an error or with a version that waits for what it points
// at (cache.Lookup.Waiting).
func (s *session) unanswered(typeURL string, names []string) []string {
	sub := s.subs[typeURL]
	if sub == nil {
		return nil
	}
	erred := s.notFound.erred[typeURL]
	var out []string
	for i, l := range s.c.opts.Cache.Get(typeURL, names) {
		_, subscribed := sub.names[names[i]]
		_, answered := erred[names[i]]
		if subscribed && !answered && l.Resource == nil && !l.Absent && !l.Waiting {
			out = append(out, names[i])
		}
	}
	return out
}

// judge reports names as not existing, with a NOT_FOUND error that says
// why, and remembers them in case the stream proves dead (withdraw).
func (s *session) judge(typeURL string, names []string) {
	msg := fmt.Sprintf("the control plane did not send it within cache.not_found_timeout (%s)", s.notFound.timeout)
	errs := make([]*cache.ResourceError, len(names))
	for i, n := range names {
		errs[i] = xds.NewError(n, codes.NotFound, msg)
	}
	s.c.opts.Cache.Apply(typeURL, cache.Change{Removed: names, Errors: errs})
	if s.judged == nil {
		s.judged = map[string]map[string]struct{}{}
	}
	if s.judged[typeURL] == nil {
		s.judged[typeURL] = map[string]struct{}{}
	}
	for _, n := range names {
		s.judged[typeURL][n] = struct{}{}
	}
	s.c.log.Info("no answer from the control plane within cache.not_found_timeout; reported as not existing",
		"type", xds.ShortName(typeURL), "names", len(names), "first", xds.Clip(names[0]))
}

// unavailable gives names UNAVAILABLE errors, unless they have one.
func (s *session) unavailable(typeURL string, names []string) {
	errs := s.c.giveUnavailable(typeURL, names, "the control plane has not sent it, and its connection is not known to be alive")
	if len(errs) > 0 {
		s.c.log.Info("no answer within cache.not_found_timeout on a stream not known to be alive: UNAVAILABLE to clients, not removed; probing the connection",
			"type", xds.ShortName(typeURL), "names", len(errs), "first", xds.Clip(errs[0].Name), "server", s.c.servers[s.server].name)
	}
}

// withdraw takes back the names the timer judged on this stream, which
// has ended in failure: its silence may have been the network's.
func (s *session) withdraw() {
	for typeURL, judged := range s.judged {
		if len(judged) == 0 {
			continue
		}
		names := slices.Sorted(maps.Keys(judged))
		s.c.opts.Cache.Apply(typeURL, cache.Change{Unknown: names})
		s.c.log.Warn("names reported not to exist on a stream that then failed are missing again", "type", xds.ShortName(typeURL),
			"names", len(names), "first", xds.Clip(names[0]))
	}
	s.judged = nil
}
