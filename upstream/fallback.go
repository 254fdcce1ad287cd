package upstream

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// probe tries, beside a stream on a fallback server, the servers of higher
// priority (gRFC A71: return to a higher server once it is reachable). Its
// goroutine is stopped and waited for by stop.
type probe struct {
	cancel context.CancelFunc
	result chan *session // capacity 1: written once, on every path
}

// startProbe tries servers 0 to below-1 in turn; the first whose stream
// answers is the result, its session open and subscribed to the whole
// interest, its first response pending.
func (c *Client) startProbe(ctx context.Context, below int) *probe {
	ctx, cancel := context.WithCancel(ctx)
	p := &probe{cancel: cancel, result: make(chan *session, 1)}
	go func() {
		var found *session
		defer func() { p.result <- found }()
		for i := 0; i < below && found == nil && ctx.Err() == nil; i++ {
			found = c.try(ctx, i)
		}
	}()
	return p
}

// done delivers the probe's result once; never for a nil probe.
func (p *probe) done() <-chan *session {
	if p == nil {
		return nil
	}
	return p.result
}

// stop ends a probe whose result was not taken, closing what it found.
func (p *probe) stop() {
	if p == nil {
		return
	}
	p.cancel()
	(<-p.result).close()
}

// try opens a stream to server i and subscribes; the server is reachable
// if the stream opens and, when something was asked, answers within
// FallbackRecheck. It returns the session, or nil.
func (c *Client) try(ctx context.Context, i int) *session {
	for range Protocols {
		s, refused := c.tryIn(ctx, i)
		if !refused {
			return s
		}
	}
	return nil
}

// tryIn is try in the protocol server i is to be spoken in; refused
// reports that the server refused it and auto has another to try.
func (c *Client) tryIn(ctx context.Context, i int) (s *session, refused bool) {
	s, err := c.open(ctx, i)
	if err != nil {
		return nil, false
	}
	s.probing = true
	if err := s.why(s.syncAll()); err != nil {
		s.close()
		return nil, c.tryRefused(s, err)
	}
	if len(s.subs) == 0 {
		return s, false // nothing to ask: an open stream is a reachable server
	}
	t := time.NewTimer(c.opts.FallbackRecheck)
	defer t.Stop()
	for err == nil && s.pending == nil {
		select {
		case r := <-s.resps:
			switch {
			case r == nil:
				err = fmt.Errorf("upstream: %w", <-s.errc)
			case r.Unserved != nil: // one per-type service refused: not an answer
				err = s.unservedType(r.TypeURL, r.Unserved)
			default:
				s.pending = r
			}
		case <-t.C:
			err = errNoAnswer
		case <-ctx.Done():
			err = ctx.Err()
		}
	}
	if s.pending != nil {
		return s, false
	}
	s.close()
	return nil, ctx.Err() == nil && c.tryRefused(s, err)
}

// errNoAnswer is a probe's stream that did not answer within
// FallbackRecheck.
var errNoAnswer = errors.New("upstream: no answer within the fallback recheck")
