package relay

import (
	"slices"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointpb "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

const (
	ledsGlob = "xdstp://mesh.example.com/envoy.config.endpoint.v3.LbEndpoint/payments/*"
	ledsEP1  = "xdstp://mesh.example.com/envoy.config.endpoint.v3.LbEndpoint/payments/ep1"
	ledsEP2  = "xdstp://mesh.example.com/envoy.config.endpoint.v3.LbEndpoint/payments/ep2"
)

func lbEndpoint(t *testing.T, port uint32) *anypb.Any {
	t.Helper()
	a, err := anypb.New(&endpointpb.LbEndpoint{HostIdentifier: &endpointpb.LbEndpoint_Endpoint{Endpoint: &endpointpb.Endpoint{
		Address: &corepb.Address{Address: &corepb.Address_SocketAddress{SocketAddress: &corepb.SocketAddress{
			Address: "10.0.0.1", PortSpecifier: &corepb.SocketAddress_PortValue{PortValue: port}}}}}}})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// LEDS end to end: a delta client subscribes to an xdstp glob collection of
// LbEndpoints through the relay. The relay subscribes the glob upstream (a
// scripted control plane: go-control-plane serves no glob collections),
// and passes the collection's members on as they come and go; a second
// client subscribing to the glob is served the members from the cache,
// with no new upstream subscription.
func TestLEDSGlobCollection(t *testing.T) {
	up := testcp.StartScripted(t)
	r := startRelay(t, up.Addr)

	first := openDelta(t, r.Addr())
	first.send(&discoverypb.DeltaDiscoveryRequest{Node: node("envoy-1", "c1"), TypeUrl: xds.LbEndpointType,
		ResourceNamesSubscribe: []string{ledsGlob}})
	st := up.Stream(t)
	if req := st.Recv(); !slices.Equal(req.GetResourceNamesSubscribe(), []string{ledsGlob}) {
		t.Fatalf("upstream subscription: %v", req.GetResourceNamesSubscribe())
	}
	st.Send(&discoverypb.DeltaDiscoveryResponse{TypeUrl: xds.LbEndpointType, Nonce: "1", Resources: []*discoverypb.Resource{
		{Name: ledsEP1, Version: "1", Resource: lbEndpoint(t, 81)},
		{Name: ledsEP2, Version: "1", Resource: lbEndpoint(t, 82)},
	}})
	if ack := st.Recv(); ack.GetErrorDetail() != nil {
		t.Fatalf("relay NACKed: %v", ack.GetErrorDetail())
	}
	if got := deltaNames(first.recv()); !slices.Equal(got, []string{ledsEP1, ledsEP2}) {
		t.Fatalf("first client got %v", got)
	}

	// A member leaves the collection.
	st.Send(&discoverypb.DeltaDiscoveryResponse{TypeUrl: xds.LbEndpointType, Nonce: "2", RemovedResources: []string{ledsEP1}})
	st.Recv()
	resp := first.recv()
	if !slices.Equal(resp.GetRemovedResources(), []string{ledsEP1}) || len(resp.GetResources()) != 0 {
		t.Fatalf("after the removal: %v removed, %v sent", resp.GetRemovedResources(), deltaNames(resp))
	}

	// A second client of the group is served the collection from the cache.
	second := openDelta(t, r.Addr())
	second.send(&discoverypb.DeltaDiscoveryRequest{Node: node("envoy-2", "c1"), TypeUrl: xds.LbEndpointType,
		ResourceNamesSubscribe: []string{ledsGlob}})
	if got := deltaNames(second.recv()); !slices.Equal(got, []string{ledsEP2}) {
		t.Fatalf("second client got %v", got)
	}
	st.Quiet(100 * time.Millisecond) // the second client reaches no control plane
	// A member of another collection is not sent to them.
	other := "xdstp://mesh.example.com/envoy.config.endpoint.v3.LbEndpoint/other/ep9"
	st.Send(&discoverypb.DeltaDiscoveryResponse{TypeUrl: xds.LbEndpointType, Nonce: "3", Resources: []*discoverypb.Resource{
		{Name: other, Version: "1", Resource: lbEndpoint(t, 89)}}})
	st.Recv()
	first.quiet(100 * time.Millisecond)
}
