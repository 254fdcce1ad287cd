package relay

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	routepb "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/faultproxy"
	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// An error is never absence (docs/architecture.md, invariant 21).

// partnerX is Cluster x, under the authority only the partner control
// plane serves: the one out of reach in these tests.
const partnerX = "xdstp://partner.example.com/envoy.config.cluster.v3.Cluster/x"

// regional is the default control plane serving Cluster y and the
// partner serving x (partnerX), for group c1, behind a proxy, and the
// options of a regional relay in front of both, with a connect timeout
// of a second.
type regional struct {
	def, partner *testcp.ControlPlane
	proxy        *faultproxy.Proxy // in front of partner
	opts         []func(*Config)
}

func regionalSetup(t *testing.T) *regional {
	t.Helper()
	g := &regional{def: testcp.Start(t), partner: testcp.Start(t)}
	g.def.Set(t, "c1", "1", tierCluster("y", 1))
	g.partner.Set(t, "c1", "1", tierCluster(partnerX, 1))
	g.proxy = startProxy(t, g.partner.Addr)
	g.opts = []func(*Config){fastReconnect, withUpstream("partner", g.proxy.Addr, nil, []string{"partner.example.com"}),
		func(c *Config) {
			c.Upstreams[0].ReconnectBaseDelay, c.Upstreams[0].ReconnectMaxDelay = 20*time.Millisecond, 100*time.Millisecond
			c.Upstream.ConnectTimeout, c.Upstreams[0].ConnectTimeout = time.Second, time.Second
		}}
	return g
}

// outages are the ways x's control plane is out of reach: it refuses
// connections (the relay knows x UNAVAILABLE at once), or it is silent
// (the relay knows after upstream.connect_timeout, having sent what it
// has meanwhile). Each returns how it comes back.
var outages = []struct {
	name string
	out  func(t *testing.T, g *regional) (back func())
}{
	{"refused", func(t *testing.T, g *regional) func() {
		g.partner.Stop()
		return g.partner.Restart
	}},
	{"silent", func(t *testing.T, g *regional) func() {
		g.proxy.Set(faultproxy.Silent, 0)
		return func() { g.proxy.Set(faultproxy.Pass, 0) }
	}},
}

// noRemoval reads s for d, ACKing each response, and fails the test if
// one removes anything.
func noRemoval(t *testing.T, s *deltaStream, d time.Duration) {
	t.Helper()
	for end := time.Now().Add(d); time.Until(end) > 0; {
		var resp *discoverypb.DeltaDiscoveryResponse
		select {
		case r, ok := <-s.resps:
			if !ok {
				t.Fatalf("the client's stream ended: %v", s.end)
			}
			resp = r
		case <-time.After(time.Until(end)):
			return
		}
		if rm := resp.GetRemovedResources(); len(rm) > 0 {
			t.Fatalf("the client was told %v were removed", rm)
		}
		s.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()})
	}
}

// A zone relay holds Clusters x and y from a regional relay, over SotW
// (upstream.protocol: sotw) or delta. The regional relay restarts with
// nothing cached while x's control plane is out of reach: it can send y
// (changed meanwhile) and says x is UNAVAILABLE. The zone relay keeps x,
// and its clients are never told x was removed; x's changes reach them
// once its control plane is back.
func TestTierKeepsWhatTheRegionalCannotFetch(t *testing.T) {
	for _, protocol := range []string{"sotw", "delta"} {
		for _, o := range outages {
			t.Run(protocol+"/"+o.name, func(t *testing.T) {
				g := regionalSetup(t)
				region := startRelay(t, g.def.Addr, g.opts...)
				zone := startRelay(t, region.Addr(), fastReconnect, func(c *Config) { c.Upstream.Protocol = protocol })
				c := openDelta(t, zone.Addr())
				c.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "c1"), TypeUrl: resourcev3.ClusterType,
					ResourceNamesSubscribe: []string{partnerX, "y"}})
				if got := collectDelta(c, 2); !slices.Equal(got, []string{partnerX, "y"}) {
					t.Fatalf("through the tiers: %v", got)
				}

				back := o.out(t, g)
				addr := region.Addr()
				shutdown(t, region)
				g.def.Set(t, "c1", "2", tierCluster("y", 2))
				tierRestart(t, addr, g.def.Addr, g.opts...)
				tierRecvCluster(t, c, "y", 2, wait) // the zone relay reads the regional's new state
				noRemoval(t, c, 2*time.Second)      // past the regional's connect timeout
				if l := zone.groupCache(keyOf("c1")).Get(resourcev3.ClusterType, []string{partnerX})[0]; l.Resource == nil {
					t.Fatalf("the zone relay holds x as %+v", l)
				}

				g.partner.Set(t, "c1", "2", tierCluster(partnerX, 42))
				back()
				tierRecvCluster(t, c, partnerX, 42, wait)
			})
		}
	}
}

// soleCache is the cache of the relay's one group; nil unless it has
// exactly one.
func (r *Relay) soleCache() *cache.Cache {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.groups) != 1 {
		return nil
	}
	for _, g := range r.groups {
		return g.cache
	}
	return nil
}

// splitRoute sends UnaryCall to cluster unary and everything else to
// cluster rest: a gRPC client then watches both.
func splitRoute(name, unary, rest string) *routepb.RouteConfiguration {
	to := func(prefix, cluster string) *routepb.Route {
		return &routepb.Route{
			Match:  &routepb.RouteMatch{PathSpecifier: &routepb.RouteMatch_Prefix{Prefix: prefix}},
			Action: &routepb.Route_Route{Route: &routepb.RouteAction{ClusterSpecifier: &routepb.RouteAction_Cluster{Cluster: cluster}}},
		}
	}
	return &routepb.RouteConfiguration{Name: name, VirtualHosts: []*routepb.VirtualHost{{
		Name: name, Domains: []string{"*"},
		Routes: []*routepb.Route{to("/grpc.testing.TestService/UnaryCall", unary), to("/", rest)},
	}}}
}

// A real gRPC client whose bootstrap lacks ignore_resource_deletion (gRFC
// A53), so that a Cluster left out of a SotW state is deleted, routes its
// RPCs to Cluster x, which only the partner control plane serves. Its
// relay restarts with nothing cached while the partner is out of reach.
// The client comes back with the versions it holds; the relay never sends
// it a Cluster state without x: it holds it, ends the stream within
// upstream.connect_timeout, and again on each reconnect, while the client
// keeps x and its RPCs keep reaching x's backend. Once the partner is
// back, the state goes out and the holds stop.
func TestGRPCClientKeepsAClusterTheRelayCannotFetch(t *testing.T) {
	g := regionalSetup(t)
	xBackend, yBackend := startBackend(t, "backend-x"), startBackend(t, "backend-y")
	x := testcp.Cluster(partnerX)
	x.EdsClusterConfig.ServiceName = partnerX // gRPC wants an xdstp cluster's EDS name set
	g.partner.Set(t, "greeters", "1", x, testcp.Endpoints(partnerX, xBackend))
	g.def.Set(t, "greeters", "1", testcp.Listener("greeter", "greeter-route"), splitRoute("greeter-route", partnerX, "y"),
		testcp.Cluster("y"), testcp.Endpoints("y", yBackend))
	region := startRelay(t, g.def.Addr, g.opts...)
	cc := grpcClientWith(t, federatedBootstrap(region.Addr(), "grpc-held-1", "partner.example.com"), "xds:///greeter")
	rpcReaches(t, cc, "backend-x", func() {})

	back := outages[0].out(t, g) // refused
	addr := region.Addr()
	shutdown(t, region)
	restarted := tierRestart(t, addr, g.def.Addr, g.opts...)
	client := testgrpc.NewTestServiceClient(cc)
	held := func() float64 {
		return value(scrape(t, restarted), "xdsrelay_downstream_held_ends_total", map[string]string{"type": "Cluster"})
	}
	start := time.Now()
	for time.Since(start) < 3*time.Second || held() < 2 {
		if time.Since(start) > 30*time.Second {
			t.Fatalf("after %v, %v streams ended on a held Cluster state, want 2", time.Since(start), held())
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{})
		cancel()
		if err != nil || resp.GetHostname() != "backend-x" {
			t.Fatalf("%v after the restart, an RPC got %q, %v: the client lost x", time.Since(start), resp.GetHostname(), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("RPCs reached x for %v across %v ends of held streams", time.Since(start), held())

	back()
	eventually(t, "the relay to hold x again", func() bool {
		c := restarted.soleCache()
		return c != nil && c.Get(resourcev3.ClusterType, []string{partnerX})[0].Resource != nil
	})
	rpcReaches(t, cc, "backend-x", func() {})
	ends := held()
	time.Sleep(2 * time.Second) // two connect timeouts: a held stream would have ended
	if n := held(); n != ends {
		t.Errorf("%v more held streams ended once x was back", n-ends)
	}
}

// wildcardEndpoints is a relay with a cache.retention of retention in
// front of a proxy to addr, speaking protocol, and a delta client of it
// under the endpoints' wildcard that has received want.
func wildcardEndpoints(t *testing.T, addr, protocol string, retention time.Duration, want ...string) (*faultproxy.Proxy, *deltaStream) {
	t.Helper()
	proxy := startProxy(t, addr)
	r := startRelay(t, proxy.Addr, fastReconnect, func(c *Config) { c.Cache.Retention, c.Upstream.Protocol = retention, protocol })
	s := openDelta(t, r.Addr())
	s.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "c1"), TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: []string{"*"}})
	if got := collectDelta(s, len(want)); !slices.Equal(got, want) {
		t.Fatalf("wildcard endpoints: %v, want %v", got, want)
	}
	return proxy, s
}

// removedWithin reads s, ACKing each response, until name is removed,
// failing the test if anything else is or if bound passes first.
func removedWithin(t *testing.T, s *deltaStream, name string, bound time.Duration) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for {
		resp := s.recvWithin(time.Until(deadline))
		for _, n := range resp.GetRemovedResources() {
			if n != name {
				t.Fatalf("the client was told %s was removed, waiting for %s", n, name)
			}
			return
		}
		s.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()})
	}
}

// Endpoints under the wildcard, from a state-of-the-world control plane
// whose snapshot cache sends every one in each response (go-control-plane's
// SotW ADS and per-type services): a set the control plane stops sending
// is not removed by its absence from a response (SotW endpoint responses
// are not complete states); the relay's next stream, asked with no
// version, is sent all there is, and what it does not send within
// cache.retention is removed. What it sends is never removed.
func TestWildcardEndpointsFromASnapshotServer(t *testing.T) {
	for _, d := range []testcp.Dialect{testcp.DialectSotW, testcp.DialectPerType} {
		t.Run(string(d), func(t *testing.T) {
			const retention = 500 * time.Millisecond
			cp := testcp.StartDialect(t, d)
			cp.Set(t, "c1", "1", testcp.Endpoints("a", "10.0.0.1:80"), testcp.Endpoints("b", "10.0.0.2:80"))
			proxy, s := wildcardEndpoints(t, cp.Addr, "auto", retention, "a", "b")

			cp.Set(t, "c1", "2", testcp.Endpoints("a", "10.0.0.1:80"))
			noRemoval(t, s, 3*retention) // left out of a response: kept
			proxy.Reset()                // a new stream
			removedWithin(t, s, "b", wait)
			noRemoval(t, s, 3*retention)
		})
	}
}

// Endpoints under the wildcard, from a control plane that sends only what
// changed (go-control-plane's LinearCache over SotW): a set it does not
// send again, however long and however many other changes go by, is never
// removed, nor when a new stream is sent it again; one it deleted, which
// SotW cannot say, is removed once a new stream does not send it within
// cache.retention.
func TestWildcardEndpointsFromAChangesOnlyServer(t *testing.T) {
	const retention = 500 * time.Millisecond
	l := testcp.StartLinear(t)
	set := func(name, addr string) {
		t.Helper()
		if err := l.Endpoints.UpdateResource(name, testcp.Endpoints(name, addr)); err != nil {
			t.Fatal(err)
		}
	}
	set("a", "10.0.0.1:80")
	set("b", "10.0.0.2:80")
	proxy, s := wildcardEndpoints(t, l.Addr, "sotw", retention, "a", "b")

	for i := range 6 { // a changes, b is never sent again: 3 retentions
		set("a", fmt.Sprintf("10.0.0.1:%d", 81+i))
		noRemoval(t, s, retention/2)
	}
	proxy.Reset() // a new stream: both are sent again
	noRemoval(t, s, 3*retention)

	if err := l.Endpoints.DeleteResource("b"); err != nil {
		t.Fatal(err)
	}
	noRemoval(t, s, 2*retention) // SotW cannot say it
	proxy.Reset()
	removedWithin(t, s, "b", wait)
	noRemoval(t, s, 2*retention)
}
