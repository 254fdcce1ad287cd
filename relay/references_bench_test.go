package relay

import (
	"fmt"
	"testing"
	"time"

	routepb "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// BenchmarkNewRouteFirstRPC is what fetching what a Route points at
// (docs/architecture.md, invariant 18 "Make before break, whatever the
// order upstream") buys a real gRPC client: each operation publishes, at
// the control plane, the client's Route moved to a new Cluster with its
// endpoints, all in one snapshot, and ends at the first RPC answered by
// the new Cluster's backend (two backends take turns, so the answer tells
// which route served it). With consistency on, the relay fetches the new
// Cluster as the Route's reference and holds the Route until the Cluster
// and its endpoints are cached; off, the client asks for the Cluster once
// it has the Route, and the relay fetches it then. The control plane
// answers at once, or 20 ms late (each response it sends is delayed), as a
// distant one does.
//
//	go test -run '^$' -bench NewRouteFirstRPC -benchtime 20x -count 3 ./relay
func BenchmarkNewRouteFirstRPC(b *testing.B) {
	for _, delay := range []time.Duration{0, 20 * time.Millisecond} {
		for _, maxWait := range []time.Duration{time.Minute, 0} {
			name := "consistency=on"
			if maxWait == 0 {
				name = "consistency=off"
			}
			b.Run(fmt.Sprintf("%s/cp-delay=%v", name, delay), func(b *testing.B) { benchNewRouteFirstRPC(b, maxWait, delay) })
		}
	}
}

// lateStream delays every message the control plane sends.
type lateStream struct {
	grpc.ServerStream
	delay time.Duration
}

func (s lateStream) SendMsg(m any) error {
	time.Sleep(s.delay)
	return s.ServerStream.SendMsg(m)
}

func benchNewRouteFirstRPC(b *testing.B, maxWait, delay time.Duration) {
	cp := testcp.StartWith(b, grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		return h(srv, lateStream{ss, delay})
	}))
	backends := [2]string{startBackend(b, "backend-0"), startBackend(b, "backend-1")}
	publish := func(i int) {
		cluster := fmt.Sprint("cluster-", i)
		cp.Set(b, "greeters", fmt.Sprint(i+2),
			testcp.Listener("greeter", "greeter-route"), testcp.Route("greeter-route", cluster),
			testcp.Cluster(cluster), testcp.Endpoints(cluster, backends[(i+2)%2]))
	}
	publish(-1) // cluster--1 on backend-1
	r := startRelay(b, cp.Addr, func(c *Config) { c.Consistency.MaxWait = maxWait })
	client := testgrpc.NewTestServiceClient(grpcXDSClient(b, r.Addr(), "grpc-bench-1", "greeters", "xds:///greeter"))
	firstRPC(b, client, "backend-1")
	b.ResetTimer()
	for i := range b.N {
		publish(i)
		firstRPC(b, client, fmt.Sprint("backend-", i%2))
	}
}

// firstRPC makes RPCs until one is answered by the backend named want,
// polling faster than rpcReaches: the time to the first is what is timed.
func firstRPC(b *testing.B, client testgrpc.TestServiceClient, want string) {
	if _, lastErr, ok := reachWithin(client, want, 100*time.Microsecond); !ok {
		b.Fatalf("no RPC reached %s within %v (last error %v)", want, wait, lastErr)
	}
}

// BenchmarkDanglingRouteChange is what a reference that never comes costs
// each change of the RouteConfiguration that holds it: each operation
// publishes, at the control plane, the Route changed (another prefix,
// still pointing at a Cluster the control plane never sends), and ends
// when a delta client of the Route has it. The relay runs with its default
// consistency.max_wait; the first version, which waits it out, is not
// timed.
//
//	go test -run '^$' -bench DanglingRouteChange -benchtime 10x -count 3 ./relay
func BenchmarkDanglingRouteChange(b *testing.B) {
	cp := testcp.Start(b)
	publish := func(i int) {
		rc := testcp.Route("r", "never-sent")
		rc.VirtualHosts[0].Routes[0].GetMatch().PathSpecifier = &routepb.RouteMatch_Prefix{Prefix: fmt.Sprint("/v", i)}
		cp.Set(b, "c1", fmt.Sprint(i), rc)
	}
	publish(0)
	r := startRelay(b, cp.Addr, func(c *Config) { c.Consistency = Default().Consistency })
	c := newStream(b, discoverypb.NewAggregatedDiscoveryServiceClient(dial(b, r.Addr())).DeltaAggregatedResources)
	c.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "c1"), TypeUrl: resourcev3.RouteType, ResourceNamesSubscribe: []string{"r"}})
	recvAckB(c, Default().Consistency.MaxWait+wait)
	b.ResetTimer()
	for i := range b.N {
		publish(i + 1)
		recvAckB(c, Default().Consistency.MaxWait+wait)
	}
}

// recvAckB receives a delta response within bound and ACKs it.
func recvAckB(s *deltaStream, bound time.Duration) {
	resp := s.recvWithin(bound)
	s.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()})
}
