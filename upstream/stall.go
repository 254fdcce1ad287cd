package upstream

import (
	"errors"
	"fmt"
	"time"

	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// A stream stalled half-way through a response (docs/architecture.md,
// invariant 17; frames.go). The session asks its server's Frames: while a
// response is partly read on the connection, no name is judged missing
// (partlyRead); a response that has made no progress for StallTimeout
// stalls the streams that have received nothing since it began, which are
// ended and opened again (stalled). gRPC does not say which of a
// connection's streams a message is on, so every such stream is taken for
// it: a stream that was merely silent may be opened again with it, once, at
// the cost of a resume. A stream that has not answered, with nothing
// partly read, is never stalled: control planes stay silent about names
// they lack. The bound is on progress, not on a response's whole time: a
// trickle is not a stall. Progress stops too when the relay itself does
// not read (HTTP/2 flow control): a session busy applying one response
// for longer than the bound would find the next one stalled; applying
// takes milliseconds to seconds, the bound tens of seconds.

// DefaultStallTimeout is how long a response partly received may make no
// progress before its stream is ended as stalled, unless Options say
// otherwise: keepalive.time's order, so that a stream is found stalled
// about as soon as a connection that carries nothing is found dead
// (keepalive.time + timeout); a stall is checked for every quarter of it.
const DefaultStallTimeout = 30 * time.Second

// errStalled ends a stream stalled half-way through a response.
var errStalled = errors.New("upstream: stream stalled: a response began to arrive and made no progress for upstream.stall_timeout")

// frames is the watch of the session's server's connection; nil if none.
func (s *session) frames() *Frames { return s.c.servers[s.server].frames }

// partlyRead reports whether a response is partly read on the stream's
// connection: no name is judged missing meanwhile.
func (s *session) partlyRead() bool { return s.frames().partlyRead() }

// waitWhole puts names back on the timer while a response is partly read
// on the stream's connection: they may be in it (invariant 17). Clients
// get UNAVAILABLE meanwhile, never a removal; a name answered since (a
// resource, a removal, the control plane's own error) is left alone.
func (s *session) waitWhole(a asked) {
	if a.names = s.unanswered(a.typeURL, a.names); len(a.names) == 0 {
		return
	}
	if errs := s.c.giveUnavailable(a.typeURL, a.names, "a response from the control plane is partly received, and the resource may be in it"); len(errs) > 0 {
		s.c.log.Info("no answer within cache.not_found_timeout while a response is partly received: UNAVAILABLE to clients, not removed",
			"type", xds.ShortName(a.typeURL), "names", len(errs), "first", xds.Clip(errs[0].Name), "server", s.c.servers[s.server].name)
	}
	s.notFound.again(a)
}

// stallCheck is how often a session looks for a stall: nil (never)
// without a watch or a bound.
func (s *session) stallCheck() *time.Ticker {
	if s.frames() == nil || s.c.opts.StallTimeout <= 0 {
		return nil
	}
	return time.NewTicker(max(s.c.opts.StallTimeout/4, 10*time.Millisecond))
}

// tick is t's channel; nil (never) for nil.
func tick(t *time.Ticker) <-chan time.Time {
	if t == nil {
		return nil
	}
	return t.C
}

// stalled reports whether a response on the stream's connection has made
// no progress for StallTimeout and the stream has received nothing since
// it began; if so it logs and counts the stall, and returns why the
// stream ends.
func (s *session) stalled(now time.Time) error {
	began, ok := s.frames().stalled(now, s.c.opts.StallTimeout)
	if !ok || s.heard().After(began) {
		return nil
	}
	s.c.opts.Metrics.Stalls.With(s.c.opts.Upstream).Inc()
	s.c.log.Warn("a response from the control plane stopped half-way: the stream is ended and opened again",
		"server", s.c.servers[s.server].name, "began", began, "upstream.stall_timeout", s.c.opts.StallTimeout)
	return fmt.Errorf("%w (%s)", errStalled, s.c.opts.StallTimeout)
}

// heard is when the stream last showed that it carries responses: its
// last response, or its opening.
func (s *session) heard() time.Time {
	if s.lastResponse.After(s.opened) {
		return s.lastResponse
	}
	return s.opened
}
