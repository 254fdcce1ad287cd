package downstream

import (
	"context"

	clustersvc "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointsvc "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	extensionsvc "github.com/envoyproxy/go-control-plane/envoy/service/extension/v3"
	listenersvc "github.com/envoyproxy/go-control-plane/envoy/service/listener/v3"
	routesvc "github.com/envoyproxy/go-control-plane/envoy/service/route/v3"
	runtimesvc "github.com/envoyproxy/go-control-plane/envoy/service/runtime/v3"
	secretsvc "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"

	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// The per-type services ("RPC Services and Methods for Each Variant"): the
// same streams as ADS, each fixed to one resource type. A client's per-type
// streams join the same group its ADS stream would, by their node. The
// methods below have one shape on purpose: gRPC's generated interfaces
// want a method per service and variant, and each is one line naming its
// type.

type (
	sotwServer  = grpc.BidiStreamingServer[discoverypb.DiscoveryRequest, discoverypb.DiscoveryResponse]
	deltaServer = grpc.BidiStreamingServer[discoverypb.DeltaDiscoveryRequest, discoverypb.DeltaDiscoveryResponse]
)

var (
	_ discoverypb.AggregatedDiscoveryServiceServer       = (*Server)(nil)
	_ listenersvc.ListenerDiscoveryServiceServer         = (*Server)(nil)
	_ routesvc.RouteDiscoveryServiceServer               = (*Server)(nil)
	_ routesvc.ScopedRoutesDiscoveryServiceServer        = (*Server)(nil)
	_ routesvc.VirtualHostDiscoveryServiceServer         = (*Server)(nil)
	_ clustersvc.ClusterDiscoveryServiceServer           = (*Server)(nil)
	_ endpointsvc.EndpointDiscoveryServiceServer         = (*Server)(nil)
	_ endpointsvc.LocalityEndpointDiscoveryServiceServer = (*Server)(nil)
	_ secretsvc.SecretDiscoveryServiceServer             = (*Server)(nil)
	_ runtimesvc.RuntimeDiscoveryServiceServer           = (*Server)(nil)
	_ extensionsvc.ExtensionConfigDiscoveryServiceServer = (*Server)(nil)
)

// Register registers every xDS service on g: ADS, the per-type services,
// the Client Status Discovery Service (CSDS) and, with load groups, the
// load reporting service (LRS).
func (s *Server) Register(g *grpc.Server) {
	s.registerCSDS(g)
	s.registerLoads(g)
	discoverypb.RegisterAggregatedDiscoveryServiceServer(g, s)
	listenersvc.RegisterListenerDiscoveryServiceServer(g, s)
	routesvc.RegisterRouteDiscoveryServiceServer(g, s)
	routesvc.RegisterScopedRoutesDiscoveryServiceServer(g, s)
	routesvc.RegisterVirtualHostDiscoveryServiceServer(g, s)
	clustersvc.RegisterClusterDiscoveryServiceServer(g, s)
	endpointsvc.RegisterEndpointDiscoveryServiceServer(g, s)
	endpointsvc.RegisterLocalityEndpointDiscoveryServiceServer(g, s)
	secretsvc.RegisterSecretDiscoveryServiceServer(g, s)
	runtimesvc.RegisterRuntimeDiscoveryServiceServer(g, s)
	extensionsvc.RegisterExtensionConfigDiscoveryServiceServer(g, s)
}

// StreamAggregatedResources serves SotW ADS.
func (s *Server) StreamAggregatedResources(st sotwServer) error {
	return s.serveSotW(st, "", "sotw-ads")
}

// DeltaAggregatedResources serves incremental ADS.
func (s *Server) DeltaAggregatedResources(st deltaServer) error {
	return s.serveDelta(st, "", "delta-ads")
}

// StreamListeners serves SotW LDS.
func (s *Server) StreamListeners(st sotwServer) error {
	return s.serveSotW(st, resourcev3.ListenerType, "sotw")
}

// DeltaListeners serves incremental LDS.
func (s *Server) DeltaListeners(st deltaServer) error {
	return s.serveDelta(st, resourcev3.ListenerType, "delta")
}

// FetchListeners answers a polling LDS request.
func (s *Server) FetchListeners(ctx context.Context, r *discoverypb.DiscoveryRequest) (*discoverypb.DiscoveryResponse, error) {
	return s.fetchGRPC(ctx, r, resourcev3.ListenerType)
}

// StreamRoutes serves SotW RDS.
func (s *Server) StreamRoutes(st sotwServer) error {
	return s.serveSotW(st, resourcev3.RouteType, "sotw")
}

// DeltaRoutes serves incremental RDS.
func (s *Server) DeltaRoutes(st deltaServer) error {
	return s.serveDelta(st, resourcev3.RouteType, "delta")
}

// FetchRoutes answers a polling RDS request.
func (s *Server) FetchRoutes(ctx context.Context, r *discoverypb.DiscoveryRequest) (*discoverypb.DiscoveryResponse, error) {
	return s.fetchGRPC(ctx, r, resourcev3.RouteType)
}

// StreamScopedRoutes serves SotW SRDS.
func (s *Server) StreamScopedRoutes(st sotwServer) error {
	return s.serveSotW(st, resourcev3.ScopedRouteType, "sotw")
}

// DeltaScopedRoutes serves incremental SRDS.
func (s *Server) DeltaScopedRoutes(st deltaServer) error {
	return s.serveDelta(st, resourcev3.ScopedRouteType, "delta")
}

// FetchScopedRoutes answers a polling SRDS request.
func (s *Server) FetchScopedRoutes(ctx context.Context, r *discoverypb.DiscoveryRequest) (*discoverypb.DiscoveryResponse, error) {
	return s.fetchGRPC(ctx, r, resourcev3.ScopedRouteType)
}

// DeltaVirtualHosts serves VHDS, which is incremental only.
func (s *Server) DeltaVirtualHosts(st deltaServer) error {
	return s.serveDelta(st, resourcev3.VirtualHostType, "delta")
}

// StreamClusters serves SotW CDS.
func (s *Server) StreamClusters(st sotwServer) error {
	return s.serveSotW(st, resourcev3.ClusterType, "sotw")
}

// DeltaClusters serves incremental CDS.
func (s *Server) DeltaClusters(st deltaServer) error {
	return s.serveDelta(st, resourcev3.ClusterType, "delta")
}

// FetchClusters answers a polling CDS request.
func (s *Server) FetchClusters(ctx context.Context, r *discoverypb.DiscoveryRequest) (*discoverypb.DiscoveryResponse, error) {
	return s.fetchGRPC(ctx, r, resourcev3.ClusterType)
}

// StreamEndpoints serves SotW EDS.
func (s *Server) StreamEndpoints(st sotwServer) error {
	return s.serveSotW(st, resourcev3.EndpointType, "sotw")
}

// DeltaEndpoints serves incremental EDS.
func (s *Server) DeltaEndpoints(st deltaServer) error {
	return s.serveDelta(st, resourcev3.EndpointType, "delta")
}

// FetchEndpoints answers a polling EDS request.
func (s *Server) FetchEndpoints(ctx context.Context, r *discoverypb.DiscoveryRequest) (*discoverypb.DiscoveryResponse, error) {
	return s.fetchGRPC(ctx, r, resourcev3.EndpointType)
}

// DeltaLocalityEndpoints serves LEDS, which is incremental only.
func (s *Server) DeltaLocalityEndpoints(st deltaServer) error {
	return s.serveDelta(st, xds.LbEndpointType, "delta")
}

// StreamSecrets serves SotW SDS.
func (s *Server) StreamSecrets(st sotwServer) error {
	return s.serveSotW(st, resourcev3.SecretType, "sotw")
}

// DeltaSecrets serves incremental SDS.
func (s *Server) DeltaSecrets(st deltaServer) error {
	return s.serveDelta(st, resourcev3.SecretType, "delta")
}

// FetchSecrets answers a polling SDS request.
func (s *Server) FetchSecrets(ctx context.Context, r *discoverypb.DiscoveryRequest) (*discoverypb.DiscoveryResponse, error) {
	return s.fetchGRPC(ctx, r, resourcev3.SecretType)
}

// StreamRuntime serves SotW RTDS.
func (s *Server) StreamRuntime(st sotwServer) error {
	return s.serveSotW(st, resourcev3.RuntimeType, "sotw")
}

// DeltaRuntime serves incremental RTDS.
func (s *Server) DeltaRuntime(st deltaServer) error {
	return s.serveDelta(st, resourcev3.RuntimeType, "delta")
}

// FetchRuntime answers a polling RTDS request.
func (s *Server) FetchRuntime(ctx context.Context, r *discoverypb.DiscoveryRequest) (*discoverypb.DiscoveryResponse, error) {
	return s.fetchGRPC(ctx, r, resourcev3.RuntimeType)
}

// StreamExtensionConfigs serves SotW ECDS.
func (s *Server) StreamExtensionConfigs(st sotwServer) error {
	return s.serveSotW(st, resourcev3.ExtensionConfigType, "sotw")
}

// DeltaExtensionConfigs serves incremental ECDS.
func (s *Server) DeltaExtensionConfigs(st deltaServer) error {
	return s.serveDelta(st, resourcev3.ExtensionConfigType, "delta")
}

// FetchExtensionConfigs answers a polling ECDS request.
func (s *Server) FetchExtensionConfigs(ctx context.Context, r *discoverypb.DiscoveryRequest) (*discoverypb.DiscoveryResponse, error) {
	return s.fetchGRPC(ctx, r, resourcev3.ExtensionConfigType)
}
