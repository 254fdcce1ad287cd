package relay

import (
	"context"
	"slices"
	"testing"
	"time"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/xdsrelay/xdsrelay/internal/envoysim"
	"github.com/xdsrelay/xdsrelay/internal/faultproxy"
	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// rpcFails makes one RPC on cc with a deadline of bound and returns its
// error and how long it took to fail.
func rpcFails(t *testing.T, cc *grpc.ClientConn, bound time.Duration) (error, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	start := time.Now()
	_, err := testgrpc.NewTestServiceClient(cc).UnaryCall(ctx, &testgrpc.SimpleRequest{})
	return err, time.Since(start)
}

// A real gRPC client whose target sits under an authority no upstream of
// the relay serves fails its RPC at once: the relay knows the name does not
// exist and says so, rather than leave the client to its 15 s
// does-not-exist timer.
func TestGRPCClientUnknownAuthorityFailsFast(t *testing.T) {
	def := testcp.Start(t)
	partner := testcp.Start(t)
	r := startRelay(t, def.Addr, withUpstream("partner", partner.Addr, nil, []string{"partner.example.com"}))
	cc := grpcClientWith(t, federatedBootstrap(r.Addr(), "grpc-answers-1", "other.example.com"), "xds://other.example.com/greeter")
	err, took := rpcFails(t, cc, 10*time.Second)
	if err == nil || status.Code(err) == codes.DeadlineExceeded {
		t.Fatalf("RPC: %v after %v, want a fast failure", err, took)
	}
	t.Logf("the RPC failed after %v: %v", took, err)
	if took > time.Second {
		t.Errorf("the RPC failed after %v, want under 1s", took)
	}
}

// With the control plane unreachable and nothing cached, a real gRPC
// client's RPC fails at once with UNAVAILABLE; once the control plane is
// up, the client's next attempts succeed.
func TestGRPCClientUnreachableControlPlaneFailsFastThenWorks(t *testing.T) {
	cp := testcp.Start(t)
	backend := startBackend(t, "backend-1")
	cp.Set(t, "greeters", "1",
		testcp.Listener("greeter", "greeter-route"), testcp.Route("greeter-route", "greeter-cluster"),
		testcp.Cluster("greeter-cluster"), testcp.Endpoints("greeter-cluster", backend))
	cp.Stop()
	r := startRelay(t, cp.Addr, fastReconnect)
	cc := grpcXDSClient(t, r.Addr(), "grpc-client-1", "greeters", "xds:///greeter")
	err, took := rpcFails(t, cc, 10*time.Second)
	t.Logf("the RPC failed after %v: %v", took, err)
	if status.Code(err) != codes.Unavailable || took > time.Second {
		t.Fatalf("RPC: %v after %v, want UNAVAILABLE under 1s", err, took)
	}
	cp.Restart()
	rpcReaches(t, cc, "backend-1", func() {})
}

// While every server of the control plane is unreachable, a name the
// relay has not cached is UNAVAILABLE (gRFC A88), never removed: the relay
// cannot know whether it exists. The resource replaces the error once the
// control plane is back.
func TestUnavailableIsNotARemoval(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("a"))
	cp.Stop()
	r := startRelay(t, cp.Addr, fastReconnect)
	d := openDelta(t, r.Addr())
	d.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n1", "c1"), TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"a"}})
	resp := d.recv()
	errs := resp.GetResourceErrors()
	if len(errs) != 1 || errs[0].GetResourceName().GetName() != "a" || errs[0].GetErrorDetail().GetCode() != int32(codes.Unavailable) ||
		len(resp.GetRemovedResources()) > 0 || len(resp.GetResources()) > 0 {
		t.Fatalf("during the outage: %v", resp)
	}
	d.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResponseNonce: resp.GetNonce()})
	waitMetric(t, r, `xdsrelay_resource_errors_total{code="UNAVAILABLE",type="Cluster"} 1`)
	cp.Restart()
	resp = d.recv()
	if got := deltaNames(resp); !slices.Equal(got, []string{"a"}) || len(resp.GetRemovedResources()) > 0 {
		t.Fatalf("once the control plane is back: %v", resp)
	}
}

// A SotW stream that asks, in one request, for a served name and for an
// xdstp name no upstream serves is not ended while the served name is
// still coming (gRFC A57 would fail it too): the group is new, nothing is
// cached, and the NOT_FOUND known at once waits for the response that
// carries the served name. Asked alone, the unroutable name still ends its
// stream.
func TestErrorsWaitForANameStillComing(t *testing.T) {
	const unknown = "xdstp://other.example.com/envoy.config.endpoint.v3.ClusterLoadAssignment/x"
	def, partner := testcp.Start(t), testcp.Start(t)
	r := startRelay(t, def.Addr, withUpstream("partner", partner.Addr, nil, []string{"partner.example.com"}),
		func(c *Config) { c.Cache.NotFoundTimeout = time.Minute })
	s := openSotW(t, r.Addr())
	s.send(&discoverypb.DiscoveryRequest{Node: node("n1", "c1"), TypeUrl: resourcev3.EndpointType, ResourceNames: []string{"a", unknown}})
	// The unroutable name is known at once; the stream stays open, and
	// the error is not sent alone.
	waitMetric(t, r, `xdsrelay_unroutable_names_total{type="ClusterLoadAssignment"} 1`)
	select {
	case resp, ok := <-s.resps:
		if !ok {
			t.Fatalf("the stream ended while a name it asked for was still coming: %v", s.end)
		}
		t.Fatalf("a response before the served name arrived: %v", resp)
	case <-time.After(firstAnswerWait + 500*time.Millisecond):
	}
	def.Set(t, "c1", "1", testcp.Endpoints("a", "127.0.0.1:1"))
	resp := s.recv()
	errs := resp.GetResourceErrors()
	if names := resourceNames(t, resp); !slices.Equal(names, []string{"a"}) || len(errs) != 1 ||
		errs[0].GetResourceName().GetName() != unknown || errs[0].GetErrorDetail().GetCode() != int32(codes.NotFound) {
		t.Fatalf("got %v with errors %v, want [a] with NOT_FOUND for %s", names, errs, unknown)
	}
	alone := openSotW(t, r.Addr())
	alone.send(&discoverypb.DiscoveryRequest{Node: node("n2", "c1"), TypeUrl: resourcev3.EndpointType, ResourceNames: []string{unknown}})
	if err := ended(t, alone); status.Code(err) != codes.NotFound {
		t.Errorf("asked alone: %v, want NOT_FOUND", err)
	}
}

// A wildcard client of a relay that has nothing cached and cannot reach
// its control plane has no name to carry UNAVAILABLE: its stream, SotW or
// incremental, raw or Envoy-like (ADS or a per-type CDS stream), is ended
// with UNAVAILABLE instead, so that it retries (another replica, if it has
// one). A refused connection is known at once; an address that accepts
// and answers nothing, after upstream.connect_timeout. Once the relay is
// answered again, a wildcard client is served.
func TestWildcardOfAnUnreachableControlPlaneEnds(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("a"))
	cp.Set(t, "c2", "1", testcp.Cluster("a"))
	cp.Stop()
	r := startRelay(t, cp.Addr, fastReconnect)
	s := openSotW(t, r.Addr())
	s.send(&discoverypb.DiscoveryRequest{Node: node("envoy-1", "c1"), TypeUrl: resourcev3.ClusterType})
	if err := ended(t, s); status.Code(err) != codes.Unavailable {
		t.Errorf("SotW wildcard: %v, want UNAVAILABLE", err)
	}
	d := openDelta(t, r.Addr())
	d.send(&discoverypb.DeltaDiscoveryRequest{Node: node("envoy-2", "c2"), TypeUrl: resourcev3.ClusterType})
	if err := ended(t, d); status.Code(err) != codes.Unavailable {
		t.Errorf("delta wildcard: %v, want UNAVAILABLE", err)
	}

	// Envoy-like clients, whose first request is the Clusters' wildcard:
	// ADS in either variant, and a per-type CDS stream.
	for _, opts := range []envoysim.Options{{}, {Delta: true}, {PerType: true}} {
		opts.Node = node("envoy-sim", "c1")
		sim := startSim(t, r.Addr(), opts)
		select {
		case <-sim.Done():
			if status.Code(sim.Err()) != codes.Unavailable {
				t.Errorf("Envoy-like client %+v: %v, want UNAVAILABLE", opts, sim.Err())
			}
		case <-time.After(wait):
			t.Errorf("Envoy-like client %+v: its stream was not ended", opts)
		}
	}

	cp.Restart()
	eventually(t, "the relay to be answered again", func() bool { return r.groupCache(keyOf("c1")).Synced(resourcev3.ClusterType) })
	again := openSotW(t, r.Addr())
	again.send(&discoverypb.DiscoveryRequest{Node: node("envoy-1", "c1"), TypeUrl: resourcev3.ClusterType})
	if got := resourceNames(t, again.recv()); !slices.Equal(got, []string{"a"}) {
		t.Errorf("once the control plane is back: %v", got)
	}

	silent := startProxy(t, cp.Addr)
	silent.Set(faultproxy.Silent, 0)
	r2 := startRelay(t, silent.Addr, func(c *Config) { c.Upstream.ConnectTimeout = time.Second })
	s2 := openSotW(t, r2.Addr())
	s2.send(&discoverypb.DiscoveryRequest{Node: node("envoy-3", "c1"), TypeUrl: resourcev3.ClusterType})
	if err := ended(t, s2); status.Code(err) != codes.Unavailable {
		t.Errorf("SotW wildcard of a silent address: %v, want UNAVAILABLE", err)
	}
}
