package testcp

import (
	"net"
	"testing"
	"time"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

type sotwADS = grpc.BidiStreamingServer[discoverypb.DiscoveryRequest, discoverypb.DiscoveryResponse]

// ScriptedSotW is a state-of-the-world ADS control plane played by the
// test, for what go-control-plane does not send over SotW (resource
// errors, as a relay of the tier above sends them): the test reads the
// relay's requests and writes the responses. Delta is refused with
// UNIMPLEMENTED.
type ScriptedSotW struct {
	discoverypb.UnimplementedAggregatedDiscoveryServiceServer
	Addr    string
	streams chan sotwADS
}

// StartScriptedSotW runs a scripted SotW control plane until the test
// ends.
func StartScriptedSotW(t testing.TB) *ScriptedSotW {
	t.Helper()
	s := &ScriptedSotW{streams: make(chan sotwADS, 4)}
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

// StreamAggregatedResources hands the stream to the test.
func (s *ScriptedSotW) StreamAggregatedResources(st sotwADS) error {
	s.streams <- st
	<-st.Context().Done()
	return nil
}

// DeltaAggregatedResources refuses delta, as a SotW-only server does.
func (s *ScriptedSotW) DeltaAggregatedResources(grpc.BidiStreamingServer[discoverypb.DeltaDiscoveryRequest, discoverypb.DeltaDiscoveryResponse]) error {
	return status.Error(codes.Unimplemented, "delta xDS is not implemented")
}

// Stream waits for the relay's next stream.
func (s *ScriptedSotW) Stream(t testing.TB) *ScriptedSotWStream {
	t.Helper()
	select {
	case st := <-s.streams:
		ss := &ScriptedSotWStream{t: t, st: st, reqs: make(chan *discoverypb.DiscoveryRequest, 100)}
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

// ScriptedSotWStream is one SotW stream from the relay.
type ScriptedSotWStream struct {
	t    testing.TB
	st   sotwADS
	reqs chan *discoverypb.DiscoveryRequest
}

// Recv returns the relay's next request.
func (s *ScriptedSotWStream) Recv() *discoverypb.DiscoveryRequest {
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
func (s *ScriptedSotWStream) Send(r *discoverypb.DiscoveryResponse) {
	s.t.Helper()
	if err := s.st.Send(r); err != nil {
		s.t.Fatal(err)
	}
}
