package upstream

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// How servers refuse (docs/architecture.md, invariant 20 "A refusal is an
// answer"; docs/control-planes.md, "How control planes refuse"). A server
// that does not speak a dialect, or does not serve a type, says so by
// ending the stream, each in its own words: the spec's UNIMPLEMENTED, or a
// plain Go error that gRPC sends as UNKNOWN with its text. The relay reads
// the words of the servers it knows, and nothing else: an error it cannot
// read as a refusal is a failure, retried with backoff.

// serverStatus is the gRPC status the server ended a stream with, found
// through the relay's wrapping; false for an error that is not one (the
// stream's context, a send's io.EOF).
func serverStatus(err error) (*status.Status, bool) {
	var gs interface{ GRPCStatus() *status.Status }
	if !errors.As(err, &gs) || gs.GRPCStatus() == nil {
		return nil, false
	}
	return gs.GRPCStatus(), true
}

// words is a server's refusal as the log, /readyz and clients quote it:
// its code and its message.
func words(err error) string {
	st, ok := serverStatus(err)
	if !ok {
		return xds.Clip(fmt.Sprint(err))
	}
	return fmt.Sprintf("%s %q", st.Code(), xds.Clip(st.Message()))
}

// refused reports whether err, ending a stream before any answer, is its
// server saying that it does not speak the stream's protocol ("Variants of
// the xDS Transport Protocol"): UNIMPLEMENTED, the spec's word and gRPC's
// for a service or method the server does not register; or UNKNOWN whose
// message says the method is not implemented, which is what a handler
// returning a plain Go error sends: go-control-plane up to v0.9.8
// (errors.New("not implemented") for every delta method), Gloo Edge's
// solo-kit, and Cilium's ErrNotImplemented (errors.New("not implemented"))
// for its per-type delta methods. No other first error is: a server that
// fails a stream with UNAVAILABLE, INTERNAL or PERMISSION_DENIED would
// fail it in any dialect, and the relay would speak the wrong one to it
// until it is found again.
func refused(err error) bool {
	st, ok := serverStatus(err)
	if !ok {
		return false
	}
	switch st.Code() {
	case codes.Unimplemented:
		return true
	case codes.Unknown:
		msg := strings.ToLower(st.Message())
		return strings.Contains(msg, "not implemented") || strings.Contains(msg, "unimplemented")
	}
	return false
}

// The words servers end a stream with when they do not serve the type it
// asked for, the type's name in the first group:
//   - go-control-plane's LinearCache (v0.10 and later), UNKNOWN: "request
//     type T does not match cache type U": T is the one refused;
//   - its MuxCache with no cache for the type, UNKNOWN: "no cache defined
//     for key T" (the key is the type URL when it classifies by type);
//   - its servers when a cache closed the watch (v0.9.8's LinearCache and
//     MuxCache do for a type they do not serve), UNAVAILABLE: "endpoints
//     watch failed" (v0.9.8, SotW), "T watch failed" (delta).
var typeWords = []*regexp.Regexp{
	regexp.MustCompile(`request type (\S+) does not match cache type`),
	regexp.MustCompile(`no cache defined for key (\S+)`),
	regexp.MustCompile(`^(\S+) watch failed$`),
}

// v098Words are v0.9.8's names for its types in "X watch failed".
var v098Words = map[string]string{
	"endpoints": resourcev3.EndpointType,
	"clusters":  resourcev3.ClusterType,
	"routes":    resourcev3.RouteType,
	"listeners": resourcev3.ListenerType,
	"secrets":   resourcev3.SecretType,
	"runtimes":  resourcev3.RuntimeType,
}

// typeRefused returns the type that err, ending a stream, says its server
// does not serve; "" if it says no such thing. pending reports the types
// the stream asked for and had no answer of: only one of them can be
// refused (a type answered is served). The server's words are read as
// typeWords says, or else, from UNKNOWN or INVALID_ARGUMENT, as the one
// pending type its message names. UNIMPLEMENTED refuses a method: on ADS
// the protocol (refused), on a per-type stream its type (sotwStream.read).
func typeRefused(err error, pending func(typeURL string) bool) string {
	st, ok := serverStatus(err)
	if !ok {
		return ""
	}
	msg := st.Message()
	for _, re := range typeWords {
		m := re.FindStringSubmatch(msg)
		if m == nil {
			continue
		}
		named := m[1]
		if t, ok := v098Words[named]; ok {
			named = t
		}
		for _, t := range xds.Types {
			if (named == t || named == strings.TrimPrefix(t, resourcev3.APITypePrefix)) && pending(t) {
				return t
			}
		}
		return ""
	}
	if c := st.Code(); c != codes.Unknown && c != codes.InvalidArgument {
		return ""
	}
	var found string
	for _, t := range xds.Types {
		if !pending(t) || !names(msg, strings.TrimPrefix(t, resourcev3.APITypePrefix)) {
			continue
		}
		if found != "" {
			return "" // two: which one is not said
		}
		found = t
	}
	return found
}

// names reports whether msg names the message full (a package and a name,
// as in a type URL) as a whole word.
func names(msg, full string) bool {
	for i := 0; ; {
		j := strings.Index(msg[i:], full)
		if j < 0 {
			return false
		}
		j += i
		end := j + len(full)
		if (j == 0 || !word(msg[j-1])) && (end == len(msg) || !word(msg[end])) {
			return true
		}
		i = j + 1
	}
}

// word reports whether b may be part of a proto message's full name.
func word(b byte) bool {
	return b == '.' || b == '_' || b >= '0' && b <= '9' || b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z'
}

// markAsked records that the stream asks for typeURL, if subscribe names
// anything.
func (s *session) markAsked(typeURL string, subscribe []string) {
	if len(subscribe) == 0 {
		return
	}
	if s.asked == nil {
		s.asked = map[string]bool{}
	}
	s.asked[typeURL] = true
}

// awaited reports whether the stream asked for typeURL and had no
// answer of it: the one type a refusal may name.
func (s *session) awaited(typeURL string) bool { return s.asked[typeURL] && !s.answered[typeURL] }

// leaveOut does not ask the server for names of typeURL (the wildcard
// among them as "*"): it said, in words, that it does not serve the type.
// Each name the cache neither holds nor knows not to exist gets
// UNAVAILABLE (gRFC A88: never a removal, since the relay cannot know
// whether it exists), whether clients want it or resources point at it
// (a client that asks for it later finds the error), and so does a
// wildcard not yet answered (cache.Change.WildcardUnavailable). Every
// name left out is counted.
func (s *session) leaveOut(typeURL string, names []string, words string) {
	server := s.c.servers[s.server].name
	msg := fmt.Sprintf("server %s of upstream %q does not serve %s: it ended the stream that asked for it with %s; the relay asks it again once a stream to it fails without an answer (it restarted, or moved)",
		server, s.c.opts.Upstream, xds.ShortName(typeURL), words)
	named := names
	if len(named) > 0 && named[0] == "*" {
		named = named[1:]
		if !s.c.opts.Cache.Synced(typeURL) && s.c.opts.Cache.WildcardUnavailable(typeURL) == "" {
			s.c.opts.Cache.Apply(typeURL, cache.Change{WildcardUnavailable: msg})
		}
	}
	if len(named) == 0 {
		return
	}
	s.c.opts.Metrics.UnservedNames.With(xds.ShortName(typeURL)).Add(int64(len(named)))
	if errs := s.c.giveUnavailable(typeURL, named, msg); len(errs) > 0 {
		// Told once, at warn, when the type was found not served
		// (found.unserve); these are counted.
		s.c.log.Debug("names of a type the server does not serve are not asked of it; UNAVAILABLE to clients", "type", xds.ShortName(typeURL),
			"names", len(errs), "first", xds.Clip(errs[0].Name), "server", server)
	}
}

// refusedType takes a stream of s that err ended as its server's refusal
// of a type the stream asked for and had no answer of (typeRefused): the
// server speaks the stream's protocol, and the type is asked of it no
// more until it is found again (found.unserve). It reports whether err was
// such a refusal: the stream is then opened again at once, without the
// type. Safe from a probe's goroutine: it reads only the session and
// writes only what is shared (found, the cache).
func (c *Client) refusedType(s *session, err error) bool {
	if s == nil {
		return false
	}
	typeURL := typeRefused(err, s.awaited)
	if typeURL == "" {
		return false
	}
	server := c.servers[s.server].name
	c.opts.found.answered(server, s.protocol)
	c.opts.found.unserve(server, typeURL, words(err))
	return true
}

// refusal reads the end of a stream of s (answered: it had answered) as
// its server's refusal, if it is one. again is set when the relay learned
// something and opens the next stream at once: a type the stream asked for
// that the next will not ask (refusedType), or auto's next protocol.
// refusedAll is set, to what was refused, when the server refused the
// protocol and there is none other to try: the configured one, or every
// one auto tries; the backoff is then due, and the server counts as one
// that cannot serve the group (refusedEvery), never as unreachable.
func (c *Client) refusal(s *session, answered bool, err error) (again bool, refusedAll string) {
	if s == nil {
		return false, ""
	}
	if c.refusedType(s, err) {
		c.reach.answered() // it spoke: reachable
		c.retried(err, "")
		c.opts.Metrics.Reconnects.With(c.opts.Group).Inc()
		c.log.Info("the stream is opened again without the type its server does not serve", "server", c.servers[s.server].name,
			"error", words(err))
		return true, ""
	}
	if answered || s.spoke || !refused(err) {
		return false, ""
	}
	w := words(err)
	if next := c.opts.found.refusedBy(c.servers[s.server].name, s.protocol, w); next != "" {
		c.retried(err, fmt.Sprintf("refused %s with %s; trying %s (upstream.protocol: auto)", s.protocol, w, next))
		return true, ""
	}
	return false, refusedWords(c.opts.found.configured, s.protocol, w)
}

// retried records a stream that ended refused and is opened again at once;
// refused says what was refused and what is tried next, for Status.
func (c *Client) retried(err error, refused string) {
	if !c.routed() {
		c.opts.Metrics.Streams.With(c.opts.Group).Set(0)
	}
	c.setStatus(func(st *Status) { st.Connected, st.LastError, st.Refused = false, fmt.Sprint(err), refused })
}

// refusedEvery records that server cur refused every protocol the relay
// may speak to it: it answered, but cannot serve the group. Once every
// server failed or refused, what is wanted and not cached is UNAVAILABLE,
// saying so (see reach).
func (c *Client) refusedEvery(cur int, refused string) {
	if c.reach.fail(cur, len(c.servers), refused) {
		c.markUnavailable()
	}
}

// tryRefused reports whether a probe's stream to a higher server that
// ended with err before any answer was refused, in a protocol or a type,
// and is to be tried again at once (see try). It runs on the probe's
// goroutine: it writes only what is shared.
func (c *Client) tryRefused(s *session, err error) bool {
	if s == nil {
		return false
	}
	if c.refusedType(s, err) {
		return true
	}
	return !s.spoke && refused(err) && c.opts.found.refusedBy(c.servers[s.server].name, s.protocol, words(err)) != ""
}
