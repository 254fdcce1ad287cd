package upstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	grpccodes "google.golang.org/grpc/codes"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// tracerName names the upstream's spans; the tracer is looked up from the
// global provider at use, so that a provider installed later is used.
const tracerName = "github.com/xdsrelay/xdsrelay/upstream"

// subscription is what the stream has subscribed to for one type.
type subscription struct {
	wildcard bool
	names    map[string]struct{}
	// awaitingWildcard is set from the wildcard subscribe until the first
	// response of the type: that response is the complete state.
	awaitingWildcard bool
	list             []string // names, sorted, for SotW requests; nil when names change
	// legacy is set on delta when the type's first request on the stream
	// asked the wildcard in the legacy form (split): the wildcard may come
	// back as "*" (wildcardAfterNames).
	legacy bool
}

// sorted is the subscription's names in order: the list a SotW request
// carries whole.
func (sub *subscription) sorted() []string {
	if sub.list == nil {
		sub.list = slices.Sorted(maps.Keys(sub.names))
	}
	return sub.list
}

// session is one upstream stream's state: owned by the session loop, the
// only caller of Send.
type session struct {
	// Read-only after open.
	c        *Client
	server   int // index in c.servers
	protocol Protocol
	opened   time.Time // when the stream was opened (stall.go, heard)
	// The stream: delta (st), or state of the world (sotw, which turns
	// it into the delta vocabulary: docs/architecture.md, invariant 16).
	st     grpc.BidiStreamingClient[discoverypb.DeltaDiscoveryRequest, discoverypb.DeltaDiscoveryResponse]
	sotw   *sotwStream
	resps  <-chan *xds.Received // see receive
	errc   <-chan error
	ctx    context.Context    // the stream's
	cancel context.CancelFunc // ends the stream

	// Owned by whoever runs the session: the client's loop, or a probe
	// until it hands the session over.
	subs     map[string]*subscription
	sentNode bool
	synced   bool // the first sync, of the whole interest, is done
	notFound notFound
	pending  *xds.Received     // received by a probe, not yet handled
	nonces   map[string]string // delta: by type, the last response's nonce (forward.go)
	// probing: the session proves a server reachable (see try), so each
	// type's resume leaves one cached name out for the server to answer.
	probing bool
	// What the stream asked and was answered, by type: a server's refusal
	// names one asked and not answered (refusal.go); spoke is set once
	// the server refused a type in its own words, which it says in the
	// stream's protocol.
	asked, answered map[string]bool
	spoke           bool
	// resumed is set once a type's first request carried the versions the
	// cache holds (a server with nothing new may answer nothing);
	// warnedUnheard once the stream's silence was said (notfound.go).
	resumed, warnedUnheard bool

	// Liveness, owned like the above, for the does-not-exist timer
	// (notfound.go): when the last response arrived, since when a probe of
	// the connection proved it alive, the names waiting for such a proof,
	// the probe in flight, and the names still subscribed that the timer
	// reported not to exist, by type.
	lastResponse time.Time
	proven       time.Time
	undecided    []asked
	probe        *liveness
	judged       map[string]map[string]struct{}
	// SotW: what the wildcard's first request of a type on the stream has
	// not heard of yet (sotw_sweep.go), owned like the above.
	sweeps sweeps
}

// close ends the stream and waits for its receiver and its liveness
// probe; nil is closed.
func (s *session) close() {
	if s == nil {
		return
	}
	s.notFound.stop()
	s.sweeps.stop()
	s.cancel()
	<-s.errc
	if s.sotw != nil {
		s.sotw.wait()
	}
	if s.probe != nil {
		<-s.probe.result // ended by the stream's context
		s.probe = nil
	}
}

// why is the stream's own error behind err: a send that failed with
// io.EOF only says that the stream ended, and its status (UNIMPLEMENTED,
// say) is what the receiver gets, within a bound.
func (s *session) why(err error) error {
	if !errors.Is(err, io.EOF) {
		return err
	}
	t := time.NewTimer(s.c.opts.ProbeTimeout)
	defer t.Stop()
	for {
		select {
		case r := <-s.resps:
			if r != nil {
				continue // the stream has ended: what it still delivers is not applied
			}
			if e := <-s.errc; e != nil {
				return fmt.Errorf("upstream: %w", e)
			}
			return err
		case <-t.C:
			return err
		}
	}
}

func (s *session) send(req *discoverypb.DeltaDiscoveryRequest) error {
	if !s.sentNode {
		// "Basic Protocol Overview": the node goes on the first request.
		req.Node, s.sentNode = s.c.opts.Node, true
	}
	if err := s.st.Send(req); err != nil {
		return fmt.Errorf("upstream: send: %w", err)
	}
	s.c.debugRequest(req)
	return nil
}

// sync moves the stream's subscriptions to the cache's union of interests.
// A type's first request carries initial_resource_versions from the cache,
// so that a resumed stream is sent only what changed ("Incremental
// reconnect example"). The wildcard a type's first request on the stream
// asks is the legacy form, in both protocols (split, sotwType.list);
// later, on delta, it is "*" or a new stream (wildcardAfterNames).
func (s *session) sync() error {
	changes, all := s.c.opts.Interest.InterestChanges()
	if s.synced && !all {
		return s.syncChanges(changes)
	}
	return s.syncAll()
}

// syncAll moves the stream's subscriptions to the whole interest, without
// taking the interest's changes (a probe's session syncs beside the
// running one).
func (s *session) syncAll() error {
	s.synced = true
	interest := s.c.opts.Interest.Interest()
	types := slices.Sorted(maps.Keys(interest))
	for t := range s.subs {
		if _, ok := interest[t]; !ok {
			types = append(types, t)
		}
	}
	for _, typeURL := range types {
		if err := s.syncType(typeURL, interest[typeURL]); err != nil {
			return err
		}
	}
	return nil
}

// syncChanges applies what changed in the interest since the last sync:
// work in proportion to the change, not to what the group holds. A type
// seen for the first time is subscribed whole (with its initial versions).
func (s *session) syncChanges(changes map[string]map[string]bool) error {
	for _, typeURL := range slices.Sorted(maps.Keys(changes)) {
		sub := s.subs[typeURL]
		if sub == nil {
			if err := s.syncType(typeURL, s.c.opts.Interest.TypeInterest(typeURL)); err != nil {
				return err
			}
			continue
		}
		ch := change{typeURL: typeURL}
		wildcard := false
		for n, wanted := range changes[typeURL] {
			_, has := sub.names[n]
			switch {
			case n == "*" && wanted && !sub.wildcard:
				if err := s.wildcardAfterNames(typeURL, sub); err != nil {
					return err
				}
				sub.wildcard, sub.awaitingWildcard, wildcard = true, true, true
			case n == "*" && !wanted && sub.wildcard:
				sub.wildcard = false
				s.sweeps.cancel(typeURL)
				ch.unsubscribe = append(ch.unsubscribe, n)
			case n == "*":
			case wanted && !has:
				sub.names[n], sub.list = struct{}{}, nil
				ch.subscribe = append(ch.subscribe, n)
			case !wanted && has:
				s.unsubscribed(typeURL, sub, n)
				ch.unsubscribe = append(ch.unsubscribe, n)
			}
		}
		slices.Sort(ch.subscribe)
		slices.Sort(ch.unsubscribe)
		if wildcard {
			ch.subscribe = append([]string{"*"}, ch.subscribe...)
		}
		if len(ch.subscribe) == 0 && len(ch.unsubscribe) == 0 {
			continue
		}
		if err := s.sendChange(ch, sub); err != nil {
			return err
		}
	}
	return nil
}

func (s *session) syncType(typeURL string, in cache.Interest) error {
	sub := s.subs[typeURL]
	first := sub == nil
	if first {
		if !in.Wildcard && len(in.Names) == 0 {
			return nil
		}
		sub = &subscription{names: make(map[string]struct{})}
		s.subs[typeURL] = sub
	}
	ch := change{typeURL: typeURL}
	if in.Wildcard && !sub.wildcard {
		if !first {
			if err := s.wildcardAfterNames(typeURL, sub); err != nil {
				return err
			}
		}
		ch.subscribe = append(ch.subscribe, "*")
		sub.awaitingWildcard = true
		// "How the client specifies what resources to return": only a
		// type's first request on the stream may ask the legacy wildcard.
		ch.legacy = first && s.sotw == nil
		sub.legacy = sub.legacy || ch.legacy
	}
	if !in.Wildcard && sub.wildcard {
		ch.unsubscribe = append(ch.unsubscribe, "*")
		s.sweeps.cancel(typeURL)
	}
	sub.wildcard = in.Wildcard
	want := make(map[string]struct{}, len(in.Names))
	for _, n := range in.Names {
		want[n] = struct{}{}
		if _, ok := sub.names[n]; !ok {
			ch.subscribe = append(ch.subscribe, n)
			sub.names[n], sub.list = struct{}{}, nil
		}
	}
	for n := range sub.names {
		if _, ok := want[n]; !ok {
			ch.unsubscribe = append(ch.unsubscribe, n)
			s.unsubscribed(typeURL, sub, n)
		}
	}
	if len(ch.subscribe) == 0 && len(ch.unsubscribe) == 0 {
		return nil
	}
	if first && s.sotw == nil && !s.c.opts.Fresh { // SotW has no resume
		ch.versions = s.c.opts.Cache.Versions(typeURL)
		maps.DeleteFunc(ch.versions, func(n, _ string) bool { return !s.c.owns(typeURL, n) })
		if s.probing {
			leaveOneOut(ch.versions, in.Names)
		}
		s.resumed = s.resumed || len(ch.versions) > 0
	}
	slices.Sort(ch.unsubscribe)
	return s.sendChange(ch, sub)
}

// wildcardAfterNames is what a delta stream does when the wildcard comes
// to typeURL, asked on the stream before (sub): the legacy form is then
// no longer a wildcard ("How the client specifies what resources to
// return"), so "*" must be sent. A server that knows "*" (go-control-plane
// since v0.11) answers it; one that takes it for a name (v0.10) never
// does, and the wildcard's clients would wait for ever. So, unless the
// type's first request on the stream was itself the legacy wildcard
// (which v0.10 never leaves: "*" again is harmless to it), the stream is
// opened again at once (reopenError, as on SotW), and its first request
// of the type asks the legacy wildcard. On delta the new stream resumes
// with the versions the relay holds, so the server sends only what
// changed.
func (s *session) wildcardAfterNames(typeURL string, sub *subscription) error {
	if s.sotw != nil || sub.legacy {
		return nil
	}
	return &reopenError{typeURL: typeURL, delta: true}
}

// unsubscribed drops name from sub, the stream's subscription of typeURL,
// and from what the timer judged on the stream: withdraw need not take it
// back.
func (s *session) unsubscribed(typeURL string, sub *subscription, name string) {
	delete(sub.names, name)
	sub.list = nil
	delete(s.judged[typeURL], name)
	s.notFound.forget(typeURL, name)
}

// sendChange sends a subscription change in as many requests as the
// control plane's limit asks for, and starts the does-not-exist timer of
// the names it subscribes.
func (s *session) sendChange(ch change, sub *subscription) error {
	if words, ok := s.c.opts.found.isUnserved(s.c.servers[s.server].name, ch.typeURL); ok {
		s.leaveOut(ch.typeURL, ch.subscribe, words)
		return nil
	}
	s.markAsked(ch.typeURL, ch.subscribe)
	if s.sotw != nil {
		return s.requestSotW(ch, sub)
	}
	if !s.sentNode {
		ch.node = s.c.opts.Node // counted in the first request's size
	}
	reqs, skipped := split(ch, s.c.opts.MaxRequestBytes)
	if len(skipped) > 0 {
		// A name too long for any request cannot be asked for; it stays
		// in sub.names, unanswered, so that the does-not-exist timer
		// reports it and no later sync asks for it again.
		s.c.log.Warn("names too long for upstream.max_request_bytes not subscribed", "type", ch.typeURL,
			"names", len(skipped), "upstream.max_request_bytes", s.c.opts.MaxRequestBytes)
	}
	s.notFound.asked(ch.typeURL, ch.subscribe)
	for i, req := range reqs {
		legacy := i == 0 && ch.legacy // the wildcard, naming nothing
		if !legacy && len(req.ResourceNamesSubscribe) == 0 && len(req.ResourceNamesUnsubscribe) == 0 && len(req.InitialResourceVersions) == 0 {
			continue
		}
		if err := s.send(req); err != nil {
			return err
		}
	}
	return nil
}

// timed is what of the names just subscribed the does-not-exist timer
// watches: the wildcard is answered whole, and a glob collection with its
// members, never by name.
func timed(subscribe []string) []string {
	named := subscribe
	if len(named) > 0 && named[0] == "*" {
		named = named[1:]
	}
	if slices.ContainsFunc(named, cache.IsGlob) {
		named = slices.DeleteFunc(slices.Clone(named), cache.IsGlob)
	}
	return named
}

// handle applies a response to the cache and ACKs it, or NACKs it naming the
// resources that could not be decoded; those keep their last good version,
// the others are applied ("ACK/NACK and resource type instance version").
func (s *session) handle(r *xds.Received) error {
	received := time.Now()
	// The stream is alive: any response shows it.
	s.lastResponse = received
	s.c.debugResponse(r) // before the resources are let go
	// The cache's and the streams' keys share one copy of the type URL.
	typeURL := xds.Canonical(r.TypeURL)
	short := xds.ShortName(typeURL)
	ctx, span := s.receiveSpan(r, short)
	defer span.End()
	s.c.opts.Metrics.Responses.With(short).Inc()
	var held map[string]string // SotW: the versions the cache holds, to skip what did not change
	if r.StateOfTheWorld {
		held = s.c.opts.Cache.Versions(typeURL)
	}
	if s.answered == nil {
		s.answered = map[string]bool{}
	}
	s.answered[typeURL] = true
	present := s.fullState(r, typeURL)
	s.sweeps.carried(typeURL, r) // before encode lets the resources go
	enc := s.encode(r, typeURL, short, held)
	if present != nil {
		r.RemovedResources = s.absent(r, typeURL, present, held)
	}
	if xds.Known(typeURL) {
		s.apply(ctx, r, typeURL, short, enc, cache.Change{Received: received, Trace: cacheTrace(span.SpanContext())})
	} else {
		enc.problems.add(fmt.Sprintf("unknown resource type %q", typeURL))
	}
	if len(s.undecided) > 0 {
		// Once the response is applied: what it carries is answered, not
		// judged not to exist on the way (notfound.go).
		s.decide()
	}
	var detail *status.Status
	if len(enc.problems.list) > 0 {
		span.SetStatus(codes.Error, "NACKed")
		s.c.opts.Metrics.NACKs.With(short).Inc()
		msg := enc.problems.String()
		s.c.log.Warn("rejecting upstream resources", "type", short, "error", msg)
		detail = &status.Status{Code: int32(grpccodes.InvalidArgument), Message: "xdsrelay: " + msg}
	}
	return s.ack(r, typeURL, detail)
}

// ack ACKs the response r (detail nil) or NACKs it ("ACK/NACK and resource
// type instance version"): on SotW with the version accepted and the whole
// name list; never for a SotW type the stream has not asked for, which
// a request would subscribe to (legacy wildcard).
func (s *session) ack(r *xds.Received, typeURL string, detail *status.Status) error {
	if s.sotw == nil {
		if s.nonces == nil {
			s.nonces = map[string]string{}
		}
		s.nonces[typeURL] = r.Nonce
		return s.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: typeURL, ResponseNonce: r.Nonce, ErrorDetail: detail})
	}
	sub := s.subs[typeURL]
	if sub == nil {
		return nil
	}
	return s.sotw.ack(typeURL, r.Nonce, r.SystemVersionInfo, detail, sub.wildcard, sub.sorted())
}

// encoded is a response's resources as the cache takes them.
type encoded struct {
	upserts    []*cache.Resource
	resent     []string // SotW: the same bytes again, not encoded
	heartbeats []*cache.Heartbeat
	foreign    []string // names another upstream serves
	problems   nackReasons
}

// encode encodes a response's resources, each once, letting each received
// one go once it is encoded: a large response is not held twice over.
// Names sent twice, of another upstream or of another type, and resources
// that do not decode are left out; the problems are what the NACK says.
func (s *session) encode(r *xds.Received, typeURL, short string, held map[string]string) encoded {
	out := encoded{problems: duplicates(r)}
	// The response's version, one string for all its resources: the
	// control plane's, of any length, and each resource keeps (and a
	// warm-restart file saves) its own copy of it, so it is clipped.
	upstream := xds.Clip(r.SystemVersionInfo)
	for i := range r.Resources {
		res := r.Resources[i]
		r.Resources[i] = xds.ReceivedResource{}
		switch _, dup := out.problems.names[res.Name]; {
		case dup:
			continue // neither instance is applied
		case !s.c.owns(typeURL, res.Name):
			out.foreign = append(out.foreign, res.Name)
		case res.Heartbeat:
			// A heartbeat: the TTL is refreshed, nothing changed ("TTL").
			if hb, err := res.EncodeHeartbeat(); err != nil {
				out.problems.add(err.Error())
			} else {
				out.heartbeats = append(out.heartbeats, hb)
			}
		case res.TypeURL != typeURL:
			out.problems.add(fmt.Sprintf("resource %q has type %s in a %s response", res.Name, res.TypeURL, short))
		case held != nil && !res.HasTTL() && held[res.Name] != "" && held[res.Name] == res.BytesVersion():
			// SotW: the same bytes again (every resource of a full state
			// but the changed ones) are no change; nothing to encode.
			out.resent = append(out.resent, res.Name)
		default:
			if e, err := res.Encode(); err != nil {
				out.problems.add(err.Error())
			} else {
				e.Upstream = upstream
				out.upserts = append(out.upserts, e)
			}
		}
	}
	return out
}

// apply applies a response of a known type to the cache, whole: its
// resources, removals, heartbeats and errors, in ch (which carries its
// receipt and trace).
func (s *session) apply(ctx context.Context, r *xds.Received, typeURL, short string, enc encoded, ch cache.Change) {
	ch.Upserts, ch.Resent, ch.Heartbeats, ch.Removed = enc.upserts, enc.resent, enc.heartbeats, r.RemovedResources
	if s.c.opts.Owns != nil {
		ch.Removed = slices.DeleteFunc(ch.Removed, func(n string) bool { return !s.c.owns(typeURL, n) })
	}
	if len(enc.foreign) > 0 {
		// Each name has one control plane (docs/architecture.md,
		// invariant 11): what this one sends of another's names is not
		// applied, nor NACKed.
		s.c.log.Warn("upstream sent names another upstream serves; ignored", "type", short,
			"names", len(enc.foreign), "first", xds.Clip(enc.foreign[0]))
	}
	for _, e := range r.ResourceErrors {
		if enc, err := xds.EncodeError(e); err == nil {
			ch.Errors = append(ch.Errors, enc)
		}
	}
	for _, u := range ch.Upserts {
		s.notFound.arrived(typeURL, []string{u.Name})
	}
	s.notFound.arrived(typeURL, ch.Resent)
	s.notFound.errored(typeURL, ch.Errors)
	if sub := s.subs[typeURL]; sub != nil && sub.awaitingWildcard {
		// The first response to a wildcard subscribe is the complete state.
		sub.awaitingWildcard, ch.Synced = false, true
	}
	start := time.Now()
	_, applying := otel.Tracer(tracerName).Start(ctx, "cache.apply")
	s.c.opts.Cache.Apply(typeURL, ch)
	applying.End()
	s.c.opts.Metrics.Apply.With(short).Observe(time.Since(start).Seconds())
}

// receiveSpan starts the span of one upstream response: the root of its own
// trace, not a child of the stream's, so that each update is one trace. The
// pushes that carry it link to it (cache.Trace).
func (s *session) receiveSpan(r *xds.Received, short string) (context.Context, trace.Span) {
	ctx, span := otel.Tracer(tracerName).Start(s.ctx, "upstream.receive", trace.WithNewRoot(),
		trace.WithSpanKind(trace.SpanKindConsumer))
	if !span.IsRecording() {
		return ctx, span
	}
	span.SetAttributes(attribute.String("xds.type", short), attribute.String("xds.group", s.c.opts.Group),
		attribute.String("xds.version", xds.Clip(r.SystemVersionInfo)),
		attribute.Int("xds.resources", len(r.Resources)), attribute.Int("xds.removed", len(r.RemovedResources)),
		attribute.Int("xds.bytes", r.Size))
	return ctx, span
}

// cacheTrace is what the cache keeps of a span: zero if it is not valid
// (tracing is off), so that the pushes do no span work.
func cacheTrace(sc trace.SpanContext) cache.Trace {
	if !sc.IsValid() {
		return cache.Trace{}
	}
	return cache.Trace{TraceID: sc.TraceID(), SpanID: sc.SpanID(), Sampled: sc.IsSampled()}
}

// nackReasons are why a response is NACKed.
type nackReasons struct {
	list  []string
	names map[string]struct{} // names that appear twice
}

func (p *nackReasons) add(msg string) { p.list = append(p.list, msg) }

// String joins the problems, clipped (xds.Clip): a response with a hundred
// thousand bad resources is not echoed back whole.
func (p *nackReasons) String() string {
	msg := strings.Join(p.list, "; ")
	if len(p.list) > 1 {
		msg = fmt.Sprintf("%d problems: %s", len(p.list), msg)
	}
	return xds.Clip(msg)
}

// duplicates finds the names a response holds twice ("Duplicate Resource
// Names": clients should NACK such a response). Neither instance is
// applied; the rest of the response is.
func duplicates(r *xds.Received) nackReasons {
	var p nackReasons
	seen := make(map[string]struct{}, len(r.Resources))
	for i := range r.Resources {
		n := r.Resources[i].Name
		if _, ok := seen[n]; !ok {
			seen[n] = struct{}{}
			continue
		}
		if _, reported := p.names[n]; reported {
			continue
		}
		if p.names == nil {
			p.names = make(map[string]struct{})
		}
		p.names[n] = struct{}{}
		p.add(fmt.Sprintf("resource %q appears more than once in the response", xds.Clip(n)))
	}
	return p
}

// leaveOneOut drops from a resume's versions the first of names it holds,
// or, for a wildcard that names none of them, the first it holds: a
// server that has nothing new sends no response to a resume ("Incremental
// reconnect example"), but must send a subscribed name the client lacks.
func leaveOneOut(versions map[string]string, names []string) {
	for _, n := range names { // sorted (cache.Interest)
		if _, ok := versions[n]; ok {
			delete(versions, n)
			return
		}
	}
	if len(versions) > 0 {
		delete(versions, slices.Min(slices.Collect(maps.Keys(versions))))
	}
}
