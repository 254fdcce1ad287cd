package downstream

import (
	"context"
	"errors"
	"log/slog"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/xdsrelay/xdsrelay/internal/lockorder"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// Warnings about streams ended with an error are limited overall to
// endLogRate lines a second, in bursts of up to endLogBurst, so that a
// broken fleet cannot flood the log.
const (
	endLogRate  = 10
	endLogBurst = 20
)

// bucket is a token bucket of log lines that counts what it refuses.
// (This needs a count of refusals, which rate.Limiter does not keep.)
type bucket struct {
	// Read-only after newBucket (now is replaced by tests before use).
	rate, burst float64
	now         func() time.Time

	mu         lockorder.Mutex[bucketMu]
	tokens     float64   // guarded by mu
	last       time.Time // guarded by mu; when tokens was last refilled
	suppressed int       // guarded by mu; refusals since the last line allowed
}

func newBucket(rate, burst float64) *bucket {
	return &bucket{rate: rate, burst: burst, tokens: burst, now: time.Now}
}

// take reports whether a line may be written and, if so, how many were
// refused since the last one allowed.
func (b *bucket) take() (ok bool, suppressed int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	if !b.last.IsZero() {
		b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	}
	b.last = now
	if b.tokens < 1 {
		b.suppressed++
		return false, 0
	}
	b.tokens--
	suppressed, b.suppressed = b.suppressed, 0
	return true, suppressed
}

// streamEnd is what the log says about a stream or poll that ended.
type streamEnd struct {
	variant string
	typ     string       // the type URL of the last request, or the service's
	node    *corepb.Node // of the first request; nil if none arrived
	peer    string       // the client's address, if not in the gRPC context
}

// see notes the type of a request.
func (e *streamEnd) see(typeURL string) {
	if typeURL != "" {
		e.typ = typeURL
	}
}

// ended logs the end of a stream or poll: at warn, within the rate limit,
// when the relay ended it with an error status; at debug when it ended the
// ordinary way.
func (s *Server) ended(ctx context.Context, e streamEnd, err error) {
	if s.normalEnd(ctx, err) {
		if s.log.Enabled(ctx, slog.LevelDebug) {
			s.log.Debug("stream ended", append(e.attrs(ctx), "reason", errText(err))...)
		}
		return
	}
	ok, suppressed := s.endLog.take()
	if !ok {
		return
	}
	if suppressed > 0 {
		s.log.Warn("warnings about streams ended with an error were suppressed by the rate limit", "suppressed", suppressed)
	}
	st := status.Convert(err)
	s.log.Warn("stream ended with an error", append(e.attrs(ctx), "code", st.Code().String(), "message", xds.Clip(st.Message()))...)
}

func (e streamEnd) attrs(ctx context.Context) []any {
	typ := xds.Clip(e.typ)
	if xds.Known(e.typ) {
		typ = xds.ShortName(e.typ)
	}
	out := []any{"node", xds.Clip(e.node.GetId()), "variant", e.variant, "type", typ}
	if p, ok := peer.FromContext(ctx); ok {
		out = append(out, "peer", p.Addr.String())
	} else if e.peer != "" {
		out = append(out, "peer", e.peer)
	}
	return out
}

// normalEnd reports whether err ends a stream the ordinary way: the client
// closed its side or went away, a poll saw no change, or the relay is
// draining.
func (s *Server) normalEnd(ctx context.Context, err error) bool {
	switch {
	case err == nil, clientGone(ctx), errors.Is(err, errDraining), errors.Is(err, errNotModified):
		return true
	case status.Code(err) == codes.Canceled:
		return true
	case status.Code(err) == codes.Unavailable:
		return s.draining()
	}
	return false
}

// clientGone reports whether the stream's or call's context ended: the
// client went away or its deadline passed.
func clientGone(ctx context.Context) bool {
	cause := context.Cause(ctx)
	return cause != nil && (errors.Is(cause, context.Canceled) || errors.Is(cause, context.DeadlineExceeded))
}

func (s *Server) draining() bool {
	select {
	case <-s.drain:
		return true
	default:
		return false
	}
}

func errText(err error) string {
	if err == nil {
		return "closed by the client"
	}
	return xds.Clip(err.Error())
}
