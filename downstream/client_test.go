package downstream

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"google.golang.org/grpc"
)

// wait bounds every wait for something that must happen.
const wait = 10 * time.Second

// clientStream is a client's stream to the server under test: a goroutine
// reads its responses until it ends, and every wait on them is bounded.
type clientStream[Req, Resp any] struct {
	t     *testing.T
	st    grpc.BidiStreamingClient[Req, Resp]
	resps chan *Resp
	done  chan struct{}
	end   error // why Recv failed; set before done is closed
}

// openStream opens a stream with open; it is cancelled, and its reader
// waited for, when the test ends.
func openStream[Req, Resp any](t *testing.T, open func(context.Context, ...grpc.CallOption) (grpc.BidiStreamingClient[Req, Resp], error)) *clientStream[Req, Resp] {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	st, err := open(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	s := &clientStream[Req, Resp]{t: t, st: st, resps: make(chan *Resp, 16), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for {
			r, err := st.Recv()
			if err != nil {
				s.end = err
				return
			}
			select {
			case s.resps <- r:
			case <-ctx.Done():
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-s.done
	})
	return s
}

func (s *clientStream[Req, Resp]) send(r *Req) {
	s.t.Helper()
	// io.EOF: the server has ended the stream (a refusal can be faster
	// than the request); why is what recv or ended then says, as gRPC
	// gives a stream's status on receive only.
	if err := s.st.Send(r); err != nil && !errors.Is(err, io.EOF) {
		s.t.Fatalf("send: %v", err)
	}
}

// recv returns the next response, failing the test if the stream ends or
// none comes within wait.
func (s *clientStream[Req, Resp]) recv() *Resp {
	s.t.Helper()
	select {
	case r := <-s.resps:
		return r
	case <-s.done:
		select { // a response read before the end is still the next one
		case r := <-s.resps:
			return r
		default:
		}
		s.t.Fatalf("the stream ended while waiting for a response: %v", s.end)
	case <-time.After(wait):
		s.t.Fatal("no response in time")
	}
	return nil
}

// ended returns the status the stream ended with, failing the test if a
// response comes first or it does not end within wait.
func (s *clientStream[Req, Resp]) ended() error {
	s.t.Helper()
	select {
	case r := <-s.resps:
		s.t.Fatalf("a response where the stream should end: %v", r)
	case <-s.done:
	case <-time.After(wait):
		s.t.Fatal("the stream did not end in time")
	}
	select { // read before the end
	case r := <-s.resps:
		s.t.Fatalf("a response where the stream should end: %v", r)
	default:
	}
	return s.end
}

// quiet fails the test if a response comes, or the stream ends, within d.
func (s *clientStream[Req, Resp]) quiet(d time.Duration) {
	s.t.Helper()
	select {
	case r := <-s.resps:
		s.t.Fatalf("unexpected response: %v", r)
	case <-s.done:
		s.t.Fatalf("the stream ended: %v", s.end)
	case <-time.After(d):
	}
}
