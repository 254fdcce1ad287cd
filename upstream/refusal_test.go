package upstream

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/metrics"
	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// The words servers refuse in, as they send them (docs/control-planes.md,
// "How control planes refuse"), read as what they refuse; anything else is
// not a refusal.
func TestRefusalWords(t *testing.T) {
	const (
		cds = resourcev3.ClusterType
		eds = resourcev3.EndpointType
		lds = resourcev3.ListenerType
	)
	wrap := func(err error) error { return fmt.Errorf("upstream: %w", err) }
	for _, tc := range []struct {
		name    string
		err     error
		pending []string // asked, not answered
		dialect bool     // refused: the stream's protocol
		typ     string   // typeRefused
	}{
		{name: "go-control-plane v0.9.8 and solo-kit: delta not implemented",
			err: status.Error(codes.Unknown, "not implemented"), pending: []string{cds}, dialect: true},
		{name: "the spec's word", err: status.Error(codes.Unimplemented, "unknown service envoy.service.discovery.v3.AggregatedDiscoveryService"),
			pending: []string{cds}, dialect: true},
		{name: "generated handler", err: status.Error(codes.Unimplemented, "method DeltaAggregatedResources not implemented"), dialect: true},
		{name: "another unknown error", err: status.Error(codes.Unknown, "snapshot failed"), pending: []string{cds}},
		{name: "unavailable", err: status.Error(codes.Unavailable, "connection refused"), pending: []string{cds}},
		{name: "permission", err: status.Error(codes.PermissionDenied, "not implemented for you"), pending: []string{cds}},
		{name: "not a status: a send's EOF", err: wrap(io.EOF), pending: []string{cds}},
		{name: "not a status, however worded", err: errors.New("not implemented"), pending: []string{cds}},
		{name: "LinearCache: the request's type is the one refused",
			err:     wrap(status.Error(codes.Unknown, "request type "+eds+" does not match cache type "+cds)),
			pending: []string{eds}, typ: eds},
		{name: "LinearCache, before any answer: still the request's type",
			err:     status.Error(codes.Unknown, "request type "+eds+" does not match cache type "+cds),
			pending: []string{cds, eds}, typ: eds},
		{name: "LinearCache naming a type not asked on this stream",
			err:     status.Error(codes.Unknown, "request type "+lds+" does not match cache type "+cds),
			pending: []string{eds}},
		{name: "MuxCache", err: status.Error(codes.Unknown, "no cache defined for key "+eds), pending: []string{eds}, typ: eds},
		{name: "v0.9.8's closed watch", err: status.Error(codes.Unavailable, "endpoints watch failed"), pending: []string{eds}, typ: eds},
		{name: "delta server's closed watch", err: status.Error(codes.Unavailable, eds+" watch failed"), pending: []string{eds}, typ: eds},
		{name: "v0.9.8's closed watch of a type not asked", err: status.Error(codes.Unavailable, "routes watch failed"), pending: []string{eds}},
		{name: "invalid argument naming one type",
			err:     status.Error(codes.InvalidArgument, "unsupported type envoy.config.endpoint.v3.ClusterLoadAssignment"),
			pending: []string{cds, eds}, typ: eds},
		{name: "naming a type answered already", err: status.Error(codes.InvalidArgument, "unsupported type "+eds), pending: []string{cds}},
		{name: "unimplemented on ADS refuses the protocol, whatever it names",
			err: status.Error(codes.Unimplemented, "delta is not served for "+eds), pending: []string{eds}, dialect: true},
		{name: "naming two asked", err: status.Error(codes.Unknown, "neither "+cds+" nor "+eds), pending: []string{cds, eds}},
		{name: "a longer name is not the type",
			err:     status.Error(codes.InvalidArgument, "bad envoy.config.cluster.v3.ClusterX"),
			pending: []string{cds}},
		{name: "unavailable naming the type is no refusal", err: status.Error(codes.Unavailable, "draining "+eds), pending: []string{eds}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pending := func(typeURL string) bool {
				for _, p := range tc.pending {
					if p == typeURL {
						return true
					}
				}
				return false
			}
			if got := typeRefused(tc.err, pending); got != tc.typ {
				t.Errorf("typeRefused = %q, want %q", got, tc.typ)
			}
			if got := refused(tc.err); got != tc.dialect && tc.typ == "" {
				t.Errorf("refused = %v, want %v", got, tc.dialect)
			}
		})
	}
}

// answerThenFail is a control plane that answers each stream's first
// request, then ends the stream with the same error: the answer does not
// make the next stream's backoff start again.
type answerThenFail struct {
	discoverypb.UnimplementedAggregatedDiscoveryServiceServer
	streams atomic.Int64
}

func (s *answerThenFail) DeltaAggregatedResources(st grpc.BidiStreamingServer[discoverypb.DeltaDiscoveryRequest, discoverypb.DeltaDiscoveryResponse]) error {
	s.streams.Add(1)
	if _, err := st.Recv(); err != nil {
		return err
	}
	a, _ := anypb.New(testcp.Cluster("a"))
	if err := st.Send(&discoverypb.DeltaDiscoveryResponse{TypeUrl: resourcev3.ClusterType, Nonce: "1",
		Resources: []*discoverypb.Resource{{Name: "a", Version: "1", Resource: a}}}); err != nil {
		return err
	}
	return status.Error(codes.Internal, "shedding load")
}

// A server that answers every stream, then ends it with the same error,
// is reopened on a backoff that grows (Client.repeats): in 2 s, with a 50
// ms base delay growing 1.6 times to 1 s, at most 10 streams, where
// starting the backoff again at each answer opens about 40.
func TestBackoffGrowsWhileAnsweredStreamsEndTheSameWay(t *testing.T) {
	srv := &answerThenFail{}
	g := grpc.NewServer()
	discoverypb.RegisterAggregatedDiscoveryServiceServer(g, srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { defer close(served); _ = g.Serve(ln) }()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(); g.Stop(); <-served })
	c := cache.New(cache.Options{Retention: time.Minute})
	c.Watch(cache.NewWatch(), resourcev3.ClusterType, "a")
	startClient(t, Options{Conn: conn, Node: &corepb.Node{Id: "n"}, Cache: c, Metrics: NewMetrics(&metrics.Registry{}),
		Backoff: backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, MaxDelay: time.Second}})
	window := time.After(2 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if n := srv.streams.Load(); n > 10 {
			t.Fatalf("%d streams opened, want at most 10 in 2s", n)
		}
		select {
		case <-tick.C:
			continue
		case <-window:
		}
		break
	}
	if n := srv.streams.Load(); n < 3 {
		t.Fatalf("%d streams opened in 2s, want the backoff's few", n)
	}
}
