package testcp

import (
	"net"
	"testing"
	"time"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
)

// Scripted is a delta-ADS control plane played by the test, for what
// go-control-plane does not send over delta (TTLs, heartbeats, resources
// that do not decode): the test reads the relay's requests and writes the
// responses.
type Scripted struct {
	discoverypb.UnimplementedAggregatedDiscoveryServiceServer
	Addr    string
	streams chan grpc.BidiStreamingServer[discoverypb.DeltaDiscoveryRequest, discoverypb.DeltaDiscoveryResponse]
}

// StartScripted runs a scripted control plane until the test ends.
func StartScripted(t testing.TB) *Scripted {
	t.Helper()
	s := &Scripted{streams: make(chan grpc.BidiStreamingServer[discoverypb.DeltaDiscoveryRequest, discoverypb.DeltaDiscoveryResponse], 4)}
	g := grpc.NewServer()
	discoverypb.RegisterAggregatedDiscoveryServiceServer(g, s)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.Addr = ln.Addr().String()
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(ln) }()
	t.Cleanup(func() { g.Stop(); <-done })
	return s
}

// DeltaAggregatedResources hands the stream to the test.
func (s *Scripted) DeltaAggregatedResources(st grpc.BidiStreamingServer[discoverypb.DeltaDiscoveryRequest, discoverypb.DeltaDiscoveryResponse]) error {
	s.streams <- st
	<-st.Context().Done()
	return nil
}

// Stream waits for the relay's next stream.
func (s *Scripted) Stream(t testing.TB) *ScriptedStream {
	t.Helper()
	select {
	case st := <-s.streams:
		ss := &ScriptedStream{t: t, st: st, reqs: make(chan *discoverypb.DeltaDiscoveryRequest, 100)}
		go func() {
			defer close(ss.reqs)
			for {
				r, err := st.Recv()
				if err != nil {
					return
				}
				ss.reqs <- r
			}
		}()
		return ss
	case <-time.After(10 * time.Second):
		t.Fatal("the relay opened no stream")
	}
	return nil
}

// ScriptedStream is one stream from the relay.
type ScriptedStream struct {
	t    testing.TB
	st   grpc.BidiStreamingServer[discoverypb.DeltaDiscoveryRequest, discoverypb.DeltaDiscoveryResponse]
	reqs chan *discoverypb.DeltaDiscoveryRequest
}

// Recv returns the relay's next request.
func (s *ScriptedStream) Recv() *discoverypb.DeltaDiscoveryRequest {
	s.t.Helper()
	select {
	case r, ok := <-s.reqs:
		if !ok {
			s.t.Fatal("the relay's stream ended")
		}
		return r
	case <-time.After(10 * time.Second):
		s.t.Fatal("no request from the relay")
	}
	return nil
}

// Send sends a response to the relay.
func (s *ScriptedStream) Send(r *discoverypb.DeltaDiscoveryResponse) {
	s.t.Helper()
	if err := s.st.Send(r); err != nil {
		s.t.Fatal(err)
	}
}

// Quiet fails the test if the relay sends a request within d.
func (s *ScriptedStream) Quiet(d time.Duration) {
	s.t.Helper()
	select {
	case r, ok := <-s.reqs:
		if ok {
			s.t.Fatalf("unexpected request from the relay: %v", r)
		}
	case <-time.After(d):
	}
}
