// Package testcp runs a real go-control-plane server for tests: the control
// plane the relay is proven against. It also builds the resources a gRPC xDS
// client needs (listener → route → cluster → endpoints).
package testcp

import (
	"context"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clusterpb "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointpb "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerpb "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routepb "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerpb "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmpb "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	clustersvc "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointsvc "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	listenersvc "github.com/envoyproxy/go-control-plane/envoy/service/listener/v3"
	lrspb "github.com/envoyproxy/go-control-plane/envoy/service/load_stats/v3"
	routesvc "github.com/envoyproxy/go-control-plane/envoy/service/route/v3"
	secretsvc "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// ClusterHash keys snapshots by node.cluster.
type ClusterHash struct{}

// ID implements cachev3.NodeHash.
func (ClusterHash) ID(node *corepb.Node) string { return node.GetCluster() }

// ControlPlane is a go-control-plane server on 127.0.0.1:0 with a snapshot
// cache keyed by node.cluster.
type ControlPlane struct {
	Addr  string
	Cache cachev3.SnapshotCache

	// Counters, from the server's callbacks.
	DeltaStreams  atomic.Int64 // delta streams opened
	SotWStreams   atomic.Int64 // SotW streams opened
	DeltaRequests atomic.Int64 // delta requests received

	// LRS is its load reporting server, on the same server and port.
	LRS *LRS

	srv     serverv3.Server
	t       testing.TB
	opts    []grpc.ServerOption
	dialect Dialect

	mu       sync.Mutex
	live     map[streamKey]string // open streams: the cluster of their node ("" before it is read)
	nodes    []*corepb.Node       // node of every request that carried one (a stream's first), SotW or delta
	reqs     []*discoverypb.DeltaDiscoveryRequest
	sotwReqs []*discoverypb.DiscoveryRequest
	stop     func() // stops the serving gRPC server; nil while stopped
}

// Dialect is what a control plane speaks (upstream.protocol's values):
// delta and SotW ADS; SotW ADS only, refusing delta with UNIMPLEMENTED as
// Gloo and kgateway do; or the per-type SotW services only, no ADS, as
// Contour and Cilium do.
type Dialect string

// The dialects.
const (
	DialectDelta   Dialect = "delta"
	DialectSotW    Dialect = "sotw"
	DialectPerType Dialect = "sotw-per-type"
)

// Dialects are every dialect, for tests run once per protocol.
var Dialects = []Dialect{DialectDelta, DialectSotW, DialectPerType}

// StartDialect runs a control plane that speaks d.
func StartDialect(t testing.TB, d Dialect, opts ...grpc.ServerOption) *ControlPlane {
	t.Helper()
	return startKeyed(t, ClusterHash{}, d, opts...)
}

// sotwOnly is a go-control-plane server that refuses delta streams, as
// Gloo's does ("not implemented"), on ADS and on every per-type service.
type sotwOnly struct{ serverv3.Server }

// deltaStream is every delta method's stream.
type deltaStream = grpc.BidiStreamingServer[discoverypb.DeltaDiscoveryRequest, discoverypb.DeltaDiscoveryResponse]

var errNoDelta = status.Error(codes.Unimplemented, "delta xDS is not implemented")

func (sotwOnly) DeltaAggregatedResources(deltaStream) error { return errNoDelta }
func (sotwOnly) DeltaClusters(deltaStream) error            { return errNoDelta }
func (sotwOnly) DeltaEndpoints(deltaStream) error           { return errNoDelta }
func (sotwOnly) DeltaListeners(deltaStream) error           { return errNoDelta }
func (sotwOnly) DeltaRoutes(deltaStream) error              { return errNoDelta }
func (sotwOnly) DeltaSecrets(deltaStream) error             { return errNoDelta }

// Register registers the dialect's services of srv on g: ADS for delta;
// ADS refusing delta for sotw; the per-type services (CDS, EDS, LDS, RDS,
// SDS) refusing delta for sotw-per-type.
func Register(g *grpc.Server, d Dialect, srv serverv3.Server) {
	switch d {
	case DialectSotW:
		discoverypb.RegisterAggregatedDiscoveryServiceServer(g, sotwOnly{srv})
	case DialectPerType:
		so := sotwOnly{srv}
		clustersvc.RegisterClusterDiscoveryServiceServer(g, so)
		endpointsvc.RegisterEndpointDiscoveryServiceServer(g, so)
		listenersvc.RegisterListenerDiscoveryServiceServer(g, so)
		routesvc.RegisterRouteDiscoveryServiceServer(g, so)
		secretsvc.RegisterSecretDiscoveryServiceServer(g, so)
	default:
		discoverypb.RegisterAggregatedDiscoveryServiceServer(g, srv)
	}
}

// Start runs a control plane until the test ends.
func Start(t testing.TB) *ControlPlane {
	t.Helper()
	return StartWith(t)
}

// StartWith runs a control plane with server options (credentials, say).
func StartWith(t testing.TB, opts ...grpc.ServerOption) *ControlPlane {
	t.Helper()
	return StartKeyed(t, ClusterHash{}, opts...)
}

// StartKeyed runs a control plane whose snapshots are keyed by hash: Set's
// cluster argument is then hash's key.
func StartKeyed(t testing.TB, hash cachev3.NodeHash, opts ...grpc.ServerOption) *ControlPlane {
	t.Helper()
	return startKeyed(t, hash, DialectDelta, opts...)
}

func startKeyed(t testing.TB, hash cachev3.NodeHash, d Dialect, opts ...grpc.ServerOption) *ControlPlane {
	t.Helper()
	cp := &ControlPlane{Cache: cachev3.NewSnapshotCache(false, hash, nil), LRS: newLRS(), dialect: d}
	cb := serverv3.CallbackFuncs{
		DeltaStreamOpenFunc: func(_ context.Context, id int64, _ string) error {
			cp.DeltaStreams.Add(1)
			cp.opened(streamKey{true, id})
			return nil
		},
		StreamOpenFunc: func(_ context.Context, id int64, _ string) error {
			cp.SotWStreams.Add(1)
			cp.opened(streamKey{false, id})
			return nil
		},
		DeltaStreamClosedFunc: func(id int64, _ *corepb.Node) { cp.closed(streamKey{true, id}) },
		StreamClosedFunc:      func(id int64, _ *corepb.Node) { cp.closed(streamKey{false, id}) },
		StreamRequestFunc: func(id int64, r *discoverypb.DiscoveryRequest) error {
			cp.mu.Lock()
			if r.GetNode() != nil {
				cp.nodes = append(cp.nodes, r.GetNode())
				cp.named(streamKey{false, id}, r.GetNode())
			}
			cp.sotwReqs = append(cp.sotwReqs, r)
			cp.mu.Unlock()
			return nil
		},
		StreamDeltaRequestFunc: func(id int64, r *discoverypb.DeltaDiscoveryRequest) error {
			cp.DeltaRequests.Add(1)
			cp.mu.Lock()
			if r.GetNode() != nil {
				cp.nodes = append(cp.nodes, r.GetNode())
				cp.named(streamKey{true, id}, r.GetNode())
			}
			cp.reqs = append(cp.reqs, r)
			cp.mu.Unlock()
			return nil
		},
	}
	ctx, cancel := context.WithCancel(context.Background())
	cp.srv, cp.t, cp.opts = serverv3.NewServer(ctx, cp.Cache, cb), t, opts
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cp.Addr = ln.Addr().String()
	cp.serve(ln)
	t.Cleanup(func() {
		cp.Stop()
		cancel()
	})
	return cp
}

func (cp *ControlPlane) serve(ln net.Listener) {
	// Stop waits for the handlers, so that no go-control-plane goroutine
	// outlives the control plane (goleak).
	g := grpc.NewServer(append([]grpc.ServerOption{grpc.WaitForHandlers(true)}, cp.opts...)...)
	Register(g, cp.dialect, cp.srv)
	lrspb.RegisterLoadReportingServiceServer(g, cp.LRS)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = g.Serve(ln)
	}()
	cp.mu.Lock()
	cp.stop = func() { g.Stop(); <-done }
	cp.mu.Unlock()
}

// Stop kills the control plane: its connections are closed and its address
// refuses new ones, as in an outage. The snapshots are kept.
func (cp *ControlPlane) Stop() {
	cp.mu.Lock()
	stop := cp.stop
	cp.stop = nil
	cp.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// Restart brings a stopped control plane back on the same address.
func (cp *ControlPlane) Restart() {
	cp.t.Helper()
	var ln net.Listener
	var err error
	for range 100 { // the port may take a moment to be free again
		if ln, err = net.Listen("tcp", cp.Addr); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		cp.t.Fatalf("restart control plane: %v", err)
	}
	cp.serve(ln)
}

// streamKey is a stream of the server: delta or SotW, and its id.
type streamKey struct {
	delta bool
	id    int64
}

func (cp *ControlPlane) opened(k streamKey) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if cp.live == nil {
		cp.live = map[streamKey]string{}
	}
	cp.live[k] = ""
}

func (cp *ControlPlane) closed(k streamKey) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	delete(cp.live, k)
}

// named records the cluster of an open stream's node; call with mu held.
func (cp *ControlPlane) named(k streamKey, n *corepb.Node) {
	if _, open := cp.live[k]; open {
		cp.live[k] = n.GetCluster()
	}
}

// Open counts the streams open now, delta and SotW, by the cluster of
// their node ("" for a stream whose node has not arrived).
func (cp *ControlPlane) Open() map[string]int {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	out := map[string]int{}
	for _, c := range cp.live {
		out[c]++
	}
	return out
}

// RestartAs brings a stopped control plane back on the same address,
// speaking d: another version of the server at the same place.
func (cp *ControlPlane) RestartAs(d Dialect) {
	cp.t.Helper()
	cp.dialect = d // read by serve, on this goroutine
	cp.Restart()
}

// Nodes returns the node of every stream's first request (SotW or delta).
func (cp *ControlPlane) Nodes() []*corepb.Node {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return append([]*corepb.Node(nil), cp.nodes...)
}

// Requests returns every delta request received.
func (cp *ControlPlane) Requests() []*discoverypb.DeltaDiscoveryRequest {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return append([]*discoverypb.DeltaDiscoveryRequest(nil), cp.reqs...)
}

// SotWRequests returns every state-of-the-world request received, of every
// stream.
func (cp *ControlPlane) SotWRequests() []*discoverypb.DiscoveryRequest {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return append([]*discoverypb.DiscoveryRequest(nil), cp.sotwReqs...)
}

// Set publishes a snapshot for the nodes of cluster (the hash's key, with
// StartKeyed).
func (cp *ControlPlane) Set(t testing.TB, cluster, version string, rs ...types.Resource) {
	t.Helper()
	byType := map[resourcev3.Type][]types.Resource{}
	for _, r := range rs {
		a, err := anypb.New(r)
		if err != nil {
			t.Fatal(err)
		}
		byType[a.GetTypeUrl()] = append(byType[a.GetTypeUrl()], r)
	}
	snap, err := cachev3.NewSnapshot(version, byType)
	if err != nil {
		t.Fatal(err)
	}
	if err := cp.Cache.SetSnapshot(context.Background(), cluster, snap); err != nil {
		t.Fatal(err)
	}
}

func adsSource() *corepb.ConfigSource {
	return &corepb.ConfigSource{
		ResourceApiVersion:    corepb.ApiVersion_V3,
		ConfigSourceSpecifier: &corepb.ConfigSource_Ads{Ads: &corepb.AggregatedConfigSource{}},
	}
}

// Listener is an API listener, as a gRPC client dialing xds:///name wants,
// whose routes come from RDS.
func Listener(name, route string) *listenerpb.Listener {
	router, _ := anypb.New(&routerpb.Router{})
	hcm, _ := anypb.New(&hcmpb.HttpConnectionManager{
		RouteSpecifier: &hcmpb.HttpConnectionManager_Rds{Rds: &hcmpb.Rds{
			RouteConfigName: route, ConfigSource: adsSource(),
		}},
		HttpFilters: []*hcmpb.HttpFilter{{
			Name: "router", ConfigType: &hcmpb.HttpFilter_TypedConfig{TypedConfig: router},
		}},
	})
	return &listenerpb.Listener{Name: name, ApiListener: &listenerpb.ApiListener{ApiListener: hcm}}
}

// Route sends everything to cluster.
func Route(name, cluster string) *routepb.RouteConfiguration {
	return &routepb.RouteConfiguration{
		Name: name,
		VirtualHosts: []*routepb.VirtualHost{{
			Name: name, Domains: []string{"*"},
			Routes: []*routepb.Route{{
				Match:  &routepb.RouteMatch{PathSpecifier: &routepb.RouteMatch_Prefix{Prefix: "/"}},
				Action: &routepb.Route_Route{Route: &routepb.RouteAction{ClusterSpecifier: &routepb.RouteAction_Cluster{Cluster: cluster}}},
			}},
		}},
	}
}

// Cluster is an EDS cluster whose endpoints come over ADS.
func Cluster(name string) *clusterpb.Cluster {
	return &clusterpb.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterpb.Cluster_Type{Type: clusterpb.Cluster_EDS},
		EdsClusterConfig:     &clusterpb.Cluster_EdsClusterConfig{EdsConfig: adsSource()},
		ConnectTimeout:       durationpb.New(1e9),
		LbPolicy:             clusterpb.Cluster_ROUND_ROBIN,
	}
}

// Endpoints places addrs ("host:port") in one locality of cluster.
func Endpoints(cluster string, addrs ...string) *endpointpb.ClusterLoadAssignment {
	var lbs []*endpointpb.LbEndpoint
	for _, a := range addrs {
		host, portStr, _ := net.SplitHostPort(a)
		port, _ := strconv.Atoi(portStr)
		lbs = append(lbs, &endpointpb.LbEndpoint{
			HostIdentifier: &endpointpb.LbEndpoint_Endpoint{Endpoint: &endpointpb.Endpoint{
				Address: &corepb.Address{Address: &corepb.Address_SocketAddress{SocketAddress: &corepb.SocketAddress{
					Address: host, PortSpecifier: &corepb.SocketAddress_PortValue{PortValue: uint32(port)},
				}}},
			}},
		})
	}
	return &endpointpb.ClusterLoadAssignment{
		ClusterName: cluster,
		Endpoints: []*endpointpb.LocalityLbEndpoints{{
			Locality:            &corepb.Locality{Region: "test"},
			LbEndpoints:         lbs,
			LoadBalancingWeight: wrapperspb.UInt32(1),
		}},
	}
}

// Linear is a go-control-plane server whose clusters and endpoints are
// each kept in a LinearCache, served over ADS and the per-type CDS and EDS
// services (SotW and delta): a control plane that sends a resource only
// when it changed, as most do. The load tool serves its Envoy runs from
// one too.
type Linear struct {
	Addr      string
	Clusters  *cachev3.LinearCache
	Endpoints *cachev3.LinearCache

	stop func()
}

// StartLinear runs a LinearCache control plane until the test ends.
func StartLinear(t testing.TB) *Linear {
	t.Helper()
	l, err := ServeLinear("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Stop)
	return l
}

// ServeLinear runs a LinearCache control plane on addr, with the gRPC
// server options opts, until Stop.
func ServeLinear(addr string, opts ...grpc.ServerOption) (*Linear, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	l := &Linear{Addr: ln.Addr().String(), Clusters: cachev3.NewLinearCache(resourcev3.ClusterType),
		Endpoints: cachev3.NewLinearCache(resourcev3.EndpointType)}
	mux := &cachev3.MuxCache{
		Classify:      func(r *cachev3.Request) string { return r.GetTypeUrl() },
		ClassifyDelta: func(r *cachev3.DeltaRequest) string { return r.GetTypeUrl() },
		Caches:        map[string]cachev3.Cache{resourcev3.ClusterType: l.Clusters, resourcev3.EndpointType: l.Endpoints},
	}
	ctx, cancel := context.WithCancel(context.Background())
	srv := serverv3.NewServer(ctx, mux, nil)
	// Stop waits for the handlers: no go-control-plane goroutine outlives
	// the server (goleak).
	g := grpc.NewServer(append([]grpc.ServerOption{grpc.WaitForHandlers(true)}, opts...)...)
	discoverypb.RegisterAggregatedDiscoveryServiceServer(g, srv)
	clustersvc.RegisterClusterDiscoveryServiceServer(g, srv)
	endpointsvc.RegisterEndpointDiscoveryServiceServer(g, srv)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = g.Serve(ln)
	}()
	var once sync.Once
	l.stop = func() {
		once.Do(func() {
			g.Stop()
			<-done
			cancel()
		})
	}
	return l, nil
}

// Stop ends the server: its streams and connections, and its goroutines.
func (l *Linear) Stop() { l.stop() }

// OneType is a go-control-plane server whose one cache is a LinearCache of
// one type, served over ADS (SotW and delta) and the per-type services of
// CDS, EDS, LDS and RDS: a control plane of one type, as many are built
// (docs/control-planes.md, "How control planes refuse"). A stream that asks
// it for another type is ended with Unknown "request type X does not match
// cache type Y", the library's own words. Streams counts every stream
// opened, at the server.
type OneType struct {
	Addr    string
	Cache   *cachev3.LinearCache
	Streams atomic.Int64 // streams opened, delta and SotW, ADS and per-type

	stop func()
}

// StartOneType runs a one-type control plane of typeURL until the test
// ends.
func StartOneType(t testing.TB, typeURL string) *OneType {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o := &OneType{Addr: ln.Addr().String(), Cache: cachev3.NewLinearCache(typeURL)}
	count := func(context.Context, int64, string) error {
		o.Streams.Add(1)
		return nil
	}
	cb := serverv3.CallbackFuncs{StreamOpenFunc: count, DeltaStreamOpenFunc: count}
	ctx, cancel := context.WithCancel(context.Background())
	srv := serverv3.NewServer(ctx, o.Cache, cb)
	g := grpc.NewServer(grpc.WaitForHandlers(true))
	discoverypb.RegisterAggregatedDiscoveryServiceServer(g, srv)
	clustersvc.RegisterClusterDiscoveryServiceServer(g, srv)
	endpointsvc.RegisterEndpointDiscoveryServiceServer(g, srv)
	listenersvc.RegisterListenerDiscoveryServiceServer(g, srv)
	routesvc.RegisterRouteDiscoveryServiceServer(g, srv)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = g.Serve(ln)
	}()
	o.stop = func() {
		g.Stop()
		<-done
		cancel()
	}
	t.Cleanup(o.stop)
	return o
}

// Set puts resources in the cache, each under its own name.
func (o *OneType) Set(t testing.TB, rs ...types.Resource) {
	t.Helper()
	for _, r := range rs {
		if err := o.Cache.UpdateResource(cachev3.GetResourceName(r), r); err != nil {
			t.Fatal(err)
		}
	}
}
