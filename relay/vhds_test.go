package relay

import (
	"slices"
	"testing"
	"time"

	routepb "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	routesvc "github.com/envoyproxy/go-control-plane/envoy/service/route/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// VHDS on demand by alias ("Resource names", "Subscribing to Resources"):
// a client subscribes to a virtual host by an alias, the relay subscribes
// upstream by that alias, and the resource that comes back (under its own
// name, listing the alias) reaches the client with its aliases.
func TestVHDSAliases(t *testing.T) {
	up := testcp.StartScripted(t)
	r := startRelay(t, up.Addr)
	cc := dial(t, r.Addr())
	s := newStream(t, routesvc.NewVirtualHostDiscoveryServiceClient(cc).DeltaVirtualHosts)
	const alias = "local_route/www.example.com"
	s.send(&discoverypb.DeltaDiscoveryRequest{Node: node("envoy", "c1"), TypeUrl: resourcev3.VirtualHostType,
		ResourceNamesSubscribe: []string{alias}})
	st := up.Stream(t)
	if req := st.Recv(); !slices.Equal(req.GetResourceNamesSubscribe(), []string{alias}) {
		t.Fatalf("upstream subscribe: %v", req)
	}
	vh, _ := anypb.New(&routepb.VirtualHost{Name: "local_route/vh-1", Domains: []string{"www.example.com"}})
	st.Send(&discoverypb.DeltaDiscoveryResponse{TypeUrl: resourcev3.VirtualHostType, Nonce: "1",
		Resources: []*discoverypb.Resource{{Name: "local_route/vh-1", Version: "1", Resource: vh, Aliases: []string{alias}}}})
	got := s.recv().GetResources()
	if len(got) != 1 || got[0].GetName() != "local_route/vh-1" || !slices.Equal(got[0].GetAliases(), []string{alias}) {
		t.Fatalf("client got %v, want local_route/vh-1 with its alias", got)
	}
	// A change to the resource reaches the alias's subscriber too.
	vh2, _ := anypb.New(&routepb.VirtualHost{Name: "local_route/vh-1", Domains: []string{"www.example.com", "example.com"}})
	st.Send(&discoverypb.DeltaDiscoveryResponse{TypeUrl: resourcev3.VirtualHostType, Nonce: "2",
		Resources: []*discoverypb.Resource{{Name: "local_route/vh-1", Version: "2", Resource: vh2, Aliases: []string{alias}}}})
	if got := s.recv().GetResources(); len(got) != 1 || got[0].GetVersion() != "2" {
		t.Fatalf("after a change: %v", got)
	}
}

// On demand: a name subscribed before it exists upstream is sent when it
// springs into existence ("Knowing When a Requested Resource Does Not
// Exist": the server must remember what was requested).
func TestOnDemandNameArrivesLater(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("x"))
	r := startRelay(t, cp.Addr)
	s := openDelta(t, r.Addr())
	s.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "c1"), TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"later"}})
	s.quiet(100 * time.Millisecond)
	cp.Set(t, "c1", "2", testcp.Cluster("x"), testcp.Cluster("later"))
	if got := deltaNames(s.recv()); !slices.Equal(got, []string{"later"}) {
		t.Fatalf("got %v, want [later]", got)
	}
	so := openSotW(t, r.Addr())
	so.send(&discoverypb.DiscoveryRequest{Node: node("n2", "c1"), TypeUrl: resourcev3.EndpointType, ResourceNames: []string{"eds-later"}})
	so.quiet(100 * time.Millisecond)
	cp.Set(t, "c1", "3", testcp.Cluster("x"), testcp.Cluster("later"), testcp.Endpoints("eds-later", "10.0.0.1:80"))
	if n := len(so.recv().GetResources()); n != 1 {
		t.Fatalf("SotW on-demand: %d resources", n)
	}
}
