package upstream

import (
	"errors"
	"fmt"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// What a session does differently on a state-of-the-world stream: it asks
// for each type's whole list, and reads absence from full-state responses.
// Everything else (the cache's vocabulary, the timer, fallback, the
// guard) is the same as on delta (docs/architecture.md, invariant 16).

// requestSotW sends typeURL's whole subscription, after a change ch to
// it. A SotW request cannot be split: when the list is larger than
// upstream.max_request_bytes, the names just subscribed that do not fit
// are not asked for; they get a RESOURCE_EXHAUSTED error that names the
// key, and are counted. What was already subscribed stays asked. Under
// the wildcard no name goes upstream (sotwType.list): when the wildcard
// leaves, every name the type keeps is asked for the first time, and may
// be refused.
func (s *session) requestSotW(ch change, sub *subscription) error {
	max := s.c.opts.MaxRequestBytes
	if size := s.sotw.requestSize(ch.typeURL, sub.wildcard, sub.sorted()); size > max {
		subscribed := ch.subscribe
		if !sub.wildcard && slices.Contains(ch.unsubscribe, "*") {
			subscribed = sub.sorted()
		}
		s.refuseTooMany(ch.typeURL, sub, subscribed, size, max)
	}
	s.notFound.asked(ch.typeURL, ch.subscribe)
	if sub.wildcard && slices.Contains(ch.subscribe, "*") {
		s.startSweep(ch.typeURL) // the wildcard's first request on the stream
	}
	err := s.sotw.request(ch.typeURL, sub.wildcard, sub.sorted())
	if errors.Is(err, errNoSotWService) {
		// VHDS and LEDS, or a service the server refused: asked of nothing.
		s.unavailableType(ch.typeURL, sub)
		return nil
	}
	return err
}

// unavailableType gives the names of a type the per-type control plane
// does not serve UNAVAILABLE (never a removal: the relay cannot know
// whether they exist).
func (s *session) unavailableType(typeURL string, sub *subscription) {
	msg := fmt.Sprintf("the control plane speaks the per-type state-of-the-world services, and %s is %s",
		xds.ShortName(typeURL), errNoSotWService)
	if errs := s.c.giveUnavailable(typeURL, sub.sorted(), msg); len(errs) > 0 {
		s.c.log.Warn("type cannot be asked of a per-type state-of-the-world control plane; its names are UNAVAILABLE to clients",
			"type", xds.ShortName(typeURL), "names", len(errs), "server", s.c.servers[s.server].name)
	}
}

// unservedType takes a per-type service the server refused with why
// (UNIMPLEMENTED, or the type refused in its own words): the type is
// asked of the server no more until it is found again (found.unserve),
// and its names are UNAVAILABLE (leaveOut). Once every type asked has been
// refused with UNIMPLEMENTED and nothing has answered, the server serves
// no per-type service: the stream fails with the refusal, as a stream
// refused whole does. A type refused in words shows that the server
// speaks the per-type services.
func (s *session) unservedType(typeURL string, why error) error {
	server := s.c.servers[s.server].name
	s.c.opts.found.unserve(server, typeURL, words(why))
	if status.Code(why) != codes.Unimplemented {
		s.spoke = true
		s.c.opts.found.answered(server, s.protocol)
	}
	delete(s.sotw.streams, typeURL) // ended: a later request would find it closed
	if s.lastResponse.IsZero() && !s.spoke && s.sotw.refusedAll() {
		return fmt.Errorf("upstream: %w", status.Error(codes.Unimplemented, "every per-type service asked was refused"))
	}
	if sub := s.subs[typeURL]; sub != nil {
		names := sub.sorted()
		if sub.wildcard {
			names = append([]string{"*"}, names...)
		}
		s.leaveOut(typeURL, names, words(why))
	}
	return nil
}

// refuseTooMany drops from sub the names of subscribed, the newest first,
// until the list, of size bytes now, fits in max (each name taken off
// takes its own bytes: work in proportion to what is refused).
func (s *session) refuseTooMany(typeURL string, sub *subscription, subscribed []string, size, max int) {
	var refused []string
	for i := len(subscribed) - 1; i >= 0 && size > max; i-- {
		if n := subscribed[i]; n != "*" {
			delete(sub.names, n)
			sub.list = nil
			size -= nameSize(n)
			refused = append(refused, n)
		}
	}
	if len(refused) == 0 {
		return
	}
	msg := fmt.Sprintf("the state-of-the-world request for %s would exceed upstream.max_request_bytes (%d): a SotW request carries every name and cannot be split",
		xds.ShortName(typeURL), max)
	errs := make([]*cache.ResourceError, len(refused))
	for i, n := range refused {
		errs[i] = xds.NewError(n, codes.ResourceExhausted, msg)
	}
	s.c.opts.Cache.Apply(typeURL, cache.Change{Errors: errs})
	s.c.opts.Metrics.ListTooLarge.With(xds.ShortName(typeURL)).Add(int64(len(refused)))
	s.c.log.Error("names not subscribed: "+msg, "type", xds.ShortName(typeURL), "names", len(refused),
		"first", xds.Clip(refused[0]), "upstream.max_request_bytes", max)
}

// fullState is, for a SotW response of Listener or Cluster, the names it
// holds: whatever else the stream is subscribed to and the cache holds is
// removed ("Deleting Resources"). nil for any other response: absence
// from it says nothing, and only the does-not-exist timer, on a live
// stream, may say a name does not exist (invariant 15).
func (s *session) fullState(r *xds.Received, typeURL string) map[string]struct{} {
	if !r.StateOfTheWorld || !xds.FullState(typeURL) || s.subs[typeURL] == nil {
		return nil
	}
	present := make(map[string]struct{}, len(r.Resources))
	for i := range r.Resources {
		present[r.Resources[i].Name] = struct{}{}
	}
	return present
}

// absent is what a full-state response r of typeURL removes: the names
// the cache holds from this upstream that the stream is subscribed to
// (every one, under the wildcard) and the response left out. A name never
// received is not removed by absence: a response may have been built
// before the request that named it; the does-not-exist timer decides it.
// Nor is a name the response, or an earlier one on the stream, answered
// with an error other than NOT_FOUND: a relay of the tier above that
// cannot fetch it says UNAVAILABLE beside the state it can send, and an
// error is never absence (docs/architecture.md, invariant 21; gRFC A88:
// the client keeps what it has). A removal passes the guard like any
// other (cache release step).
func (s *session) absent(r *xds.Received, typeURL string, present map[string]struct{}, held map[string]string) []string {
	sub := s.subs[typeURL]
	erred := responseErrors(r)
	var out []string
	for name := range held {
		if _, ok := present[name]; ok || !s.c.owns(typeURL, name) {
			continue
		}
		if code, ok := erred[name]; ok && code != int32(codes.NotFound) || !ok && s.notFound.unavailable(typeURL, name) {
			continue
		}
		if _, named := sub.names[name]; named || sub.wildcard {
			out = append(out, name)
		}
	}
	return out
}

// responseErrors is the codes of r's resource errors, by name; nil if it
// has none.
func responseErrors(r *xds.Received) map[string]int32 {
	if len(r.ResourceErrors) == 0 {
		return nil
	}
	out := make(map[string]int32, len(r.ResourceErrors))
	for _, e := range r.ResourceErrors {
		out[e.GetResourceName().GetName()] = e.GetErrorDetail().GetCode()
	}
	return out
}
