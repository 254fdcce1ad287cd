package loadtest

import (
	"context"
	"math/rand/v2"
	"time"

	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// envoyBackoff spaces the attempts of a client whose stream was refused or
// lost as Envoy spaces its xDS stream's: exponential from 500ms up to 30s,
// doubling as Envoy's does, with grpc-go's jitter.
var envoyBackoff = backoff.Config{
	BaseDelay:  500 * time.Millisecond,
	Multiplier: 2,
	Jitter:     0.2,
	MaxDelay:   30 * time.Second,
}

// backoffDelay is the pause before retry n (0 for the first) under bc, as
// grpc-go computes it from a backoff.Config.
func backoffDelay(bc backoff.Config, n int) time.Duration {
	d, limit := float64(bc.BaseDelay), float64(bc.MaxDelay)
	for ; n > 0 && d < limit; n-- {
		d *= bc.Multiplier
	}
	d = min(d, limit)
	d *= 1 + bc.Jitter*(rand.Float64()*2-1)
	return time.Duration(max(d, 0))
}

// refused reports whether a stream ended because the server turned it away
// for now: the relay's admission limits (RESOURCE_EXHAUSTED) or a server
// that is going away or not there (UNAVAILABLE).
func refused(err error) bool {
	code := status.Code(err)
	return code == codes.ResourceExhausted || code == codes.Unavailable
}

// reopenAnswered runs client i's stream, and again each time it ends
// UNAVAILABLE after it was answered, as Envoy and gRPC reopen a stream
// whose connection the server closed (a drain, max connection age, a
// fleet's balance): after the backoff's first pause, counted
// (Result.Reconnects). Any other end, or one with no answer, is the
// client's.
func reopenAnswered(ctx context.Context, i int, tr *tracker, stream func() error) error {
	for {
		seen := tr.clients[i].responses
		err := stream()
		if ctx.Err() != nil || status.Code(err) != codes.Unavailable || tr.clients[i].responses == seen {
			return err
		}
		tr.reconnects.Add(1)
		if pause(ctx, backoffDelay(envoyBackoff, 0)) != nil {
			return err
		}
	}
}

// retryRefused runs client i's stream, and again after envoyBackoff each
// time the server refuses it, until it ends otherwise or ctx ends. As
// Envoy's, the backoff starts over once a stream got a response.
func retryRefused(ctx context.Context, i int, tr *tracker, stream func() error) error {
	for n := 0; ; n++ {
		seen := tr.clients[i].responses
		err := stream()
		if !refused(err) || ctx.Err() != nil {
			return err
		}
		if tr.clients[i].responses > seen {
			n = 0
		}
		tr.retry(i)
		if pause(ctx, backoffDelay(envoyBackoff, n)) != nil {
			return err
		}
	}
}
