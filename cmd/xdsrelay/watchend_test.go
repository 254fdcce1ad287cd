package main

import (
	"errors"
	"io"
	"testing"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// endedStream is a stream the server has ended (a connection closed to
// balance a fleet): Send finds it ended (io.EOF), as gRPC says it, and
// Recv returns a response left, then the status.
type endedStream struct {
	grpc.BidiStreamingClient[discoverypb.DiscoveryRequest, discoverypb.DiscoveryResponse]
	left int
}

func (s *endedStream) Send(*discoverypb.DiscoveryRequest) error { return io.EOF }

func (s *endedStream) Recv() (*discoverypb.DiscoveryResponse, error) {
	if s.left > 0 {
		s.left--
		return &discoverypb.DiscoveryResponse{}, nil
	}
	return nil, status.Error(codes.Unavailable, "error reading from server: EOF")
}

// A stream that ended as watch sends on it ends with the stream's status,
// not "send: EOF": a connection the server closed after it answered is
// UNAVAILABLE, which watch subscribes to again on a new stream.
func TestWatchSendOnAnEndedStreamSaysHowItEnded(t *testing.T) {
	err := ackLoop(&endedStream{left: 1}, &discoverypb.DiscoveryRequest{}, func(proto.Message) error { return nil },
		func(*discoverypb.DiscoveryResponse) *discoverypb.DiscoveryRequest {
			return &discoverypb.DiscoveryRequest{}
		})
	if status.Code(errors.Unwrap(err)) != codes.Unavailable {
		t.Fatalf("ackLoop on an ended stream: %v, want the stream's UNAVAILABLE, which watch opens again after", err)
	}
}
