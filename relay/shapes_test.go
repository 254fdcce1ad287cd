package relay

import (
	"context"
	"fmt"
	"slices"
	"testing"

	clustersvc "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointsvc "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	listenersvc "github.com/envoyproxy/go-control-plane/envoy/service/listener/v3"
	routesvc "github.com/envoyproxy/go-control-plane/envoy/service/route/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// fetcher subscribes to names of a type (nil: wildcard) and returns the
// names it is sent, however the variant carries them.
type fetcher func(t *testing.T, typeURL string, names []string) []string

// sotwFetcher speaks SotW on one stream per type (open gives it), or on one
// ADS stream for all (open returns the same stream).
func sotwFetcher(n string, open func(typeURL string) *sotwStream) fetcher {
	first := map[*sotwStream]bool{}
	return func(t *testing.T, typeURL string, names []string) []string {
		s := open(typeURL)
		req := &discoverypb.DiscoveryRequest{TypeUrl: typeURL, ResourceNames: names}
		if !first[s] {
			req.Node, first[s] = node(n, "c1"), true
		}
		s.send(req)
		for {
			resp := s.recv()
			s.send(&discoverypb.DiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResourceNames: names,
				VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()})
			if resp.GetTypeUrl() == typeURL && len(resp.GetResources()) > 0 {
				var got []string
				for _, a := range resp.GetResources() {
					got = append(got, resourceName(t, a))
				}
				slices.Sort(got)
				return got
			}
		}
	}
}

func deltaFetcher(n string, open func(typeURL string) *deltaStream) fetcher {
	first := map[*deltaStream]bool{}
	return func(t *testing.T, typeURL string, names []string) []string {
		s := open(typeURL)
		req := &discoverypb.DeltaDiscoveryRequest{TypeUrl: typeURL, ResourceNamesSubscribe: names}
		if !first[s] {
			req.Node, first[s] = node(n, "c1"), true
		}
		s.send(req)
		for {
			resp := s.recv()
			s.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()})
			if resp.GetTypeUrl() == typeURL && len(resp.GetResources()) > 0 {
				return deltaNames(resp)
			}
		}
	}
}

// Envoy-shaped clients (wildcard LDS and CDS, named RDS and EDS) and
// gRPC-shaped clients (everything named) get their configuration through
// each of the four variants ("Variants of the xDS Transport Protocol").
func TestClientShapesThroughEveryVariant(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Listener("l", "r"), testcp.Route("r", "c"), testcp.Cluster("c"), testcp.Endpoints("c", "10.0.0.1:80"))
	r := startRelay(t, cp.Addr)

	variants := map[string]func(t *testing.T, id string) fetcher{
		"SotW ADS": func(t *testing.T, id string) fetcher {
			s := openSotW(t, r.Addr())
			return sotwFetcher(id, func(string) *sotwStream { return s })
		},
		"incremental ADS": func(t *testing.T, id string) fetcher {
			s := openDelta(t, r.Addr())
			return deltaFetcher(id, func(string) *deltaStream { return s })
		},
		"SotW per type": func(t *testing.T, id string) fetcher {
			cc := dial(t, r.Addr())
			open := map[string]func(context.Context, ...grpc.CallOption) (grpc.BidiStreamingClient[discoverypb.DiscoveryRequest, discoverypb.DiscoveryResponse], error){
				resourcev3.ListenerType: listenersvc.NewListenerDiscoveryServiceClient(cc).StreamListeners,
				resourcev3.RouteType:    routesvc.NewRouteDiscoveryServiceClient(cc).StreamRoutes,
				resourcev3.ClusterType:  clustersvc.NewClusterDiscoveryServiceClient(cc).StreamClusters,
				resourcev3.EndpointType: endpointsvc.NewEndpointDiscoveryServiceClient(cc).StreamEndpoints,
			}
			return sotwFetcher(id, func(typeURL string) *sotwStream { return newStream(t, open[typeURL]) })
		},
		"incremental per type": func(t *testing.T, id string) fetcher {
			cc := dial(t, r.Addr())
			open := map[string]func(context.Context, ...grpc.CallOption) (grpc.BidiStreamingClient[discoverypb.DeltaDiscoveryRequest, discoverypb.DeltaDiscoveryResponse], error){
				resourcev3.ListenerType: listenersvc.NewListenerDiscoveryServiceClient(cc).DeltaListeners,
				resourcev3.RouteType:    routesvc.NewRouteDiscoveryServiceClient(cc).DeltaRoutes,
				resourcev3.ClusterType:  clustersvc.NewClusterDiscoveryServiceClient(cc).DeltaClusters,
				resourcev3.EndpointType: endpointsvc.NewEndpointDiscoveryServiceClient(cc).DeltaEndpoints,
			}
			return deltaFetcher(id, func(typeURL string) *deltaStream { return newStream(t, open[typeURL]) })
		},
	}
	shapes := map[string][]struct {
		typeURL string
		names   []string
		want    string
	}{
		"Envoy": {{resourcev3.ListenerType, nil, "l"}, {resourcev3.ClusterType, nil, "c"}, {resourcev3.EndpointType, []string{"c"}, "c"}, {resourcev3.RouteType, []string{"r"}, "r"}},
		"gRPC":  {{resourcev3.ListenerType, []string{"l"}, "l"}, {resourcev3.RouteType, []string{"r"}, "r"}, {resourcev3.ClusterType, []string{"c"}, "c"}, {resourcev3.EndpointType, []string{"c"}, "c"}},
	}
	for vname, open := range variants {
		for sname, steps := range shapes {
			t.Run(fmt.Sprintf("%s over %s", sname, vname), func(t *testing.T) {
				fetch := open(t, sname+"-"+vname)
				for _, st := range steps {
					// Per-type streams, fresh per type: a new stream in a
					// variant keyed by the same node joins the same group.
					if got := fetch(t, st.typeURL, st.names); !slices.Equal(got, []string{st.want}) {
						t.Fatalf("%s %v: got %v, want [%s]", st.typeURL, st.names, got, st.want)
					}
				}
			})
		}
	}
	// A gRPC shape that ran first named the Cluster; the Envoy shape's
	// wildcard after it opens the delta stream again once, a stream that
	// replaces the first (docs/control-planes.md, go-control-plane v0.10).
	var reopens float64
	for _, m := range scrape(t, r)["xdsrelay_upstream_delta_wildcard_reopens_total"].GetMetric() {
		reopens += m.GetCounter().GetValue()
	}
	if n := float64(cp.DeltaStreams.Load()) - reopens; n != 1 {
		t.Fatalf("control plane saw %v streams for every client of the group (%v reopened for a wildcard), want 1", n, reopens)
	}
}

// resourceName is the name of a resource sent in an Any.
func resourceName(t *testing.T, a *anypb.Any) string {
	t.Helper()
	m, err := a.UnmarshalNew()
	if err != nil {
		t.Fatal(err)
	}
	fields := m.ProtoReflect().Descriptor().Fields()
	for _, f := range []protoreflect.Name{"name", "cluster_name"} {
		if fd := fields.ByName(f); fd != nil {
			return m.ProtoReflect().Get(fd).String()
		}
	}
	t.Fatalf("%s has no name", a.GetTypeUrl())
	return ""
}
