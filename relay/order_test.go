package relay

import (
	"slices"
	"testing"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// "Eventual consistency considerations": on an ADS stream, changes sent
// together reach the client make-before-break (CDS, EDS, LDS, RDS), and a
// client that keeps up gets each change as the control plane sent it, in
// its order, whatever that is. (Changes that pile up on a slow client go
// in the spec's order: downstream's pile-up tests.) The control plane is
// scripted to fix the order it sends in.
func TestADSKeepsUpstreamOrder(t *testing.T) {
	up := testcp.StartScripted(t)
	r := startRelay(t, up.Addr)
	s := openDelta(t, r.Addr())
	subs := []struct {
		typeURL, name string
		res           proto.Message
	}{
		{resourcev3.ClusterType, "c", testcp.Cluster("c")},
		{resourcev3.EndpointType, "c", testcp.Endpoints("c", "10.0.0.1:80")},
		{resourcev3.ListenerType, "l", testcp.Listener("l", "r")},
		{resourcev3.RouteType, "r", testcp.Route("r", "c")},
	}
	for i, sub := range subs {
		req := &discoverypb.DeltaDiscoveryRequest{TypeUrl: sub.typeURL, ResourceNamesSubscribe: []string{sub.name}}
		if i == 0 {
			req.Node = node("n", "c1")
		}
		s.send(req)
	}
	st := up.Stream(t)
	for range subs {
		st.Recv() // the relay's four subscriptions
	}
	send := func(version string, order ...int) {
		for _, i := range order {
			a, _ := anypb.New(subs[i].res)
			st.Send(&discoverypb.DeltaDiscoveryResponse{TypeUrl: subs[i].typeURL, Nonce: version + subs[i].name,
				Resources: []*discoverypb.Resource{{Name: subs[i].name, Version: version, Resource: a}}})
		}
	}
	receive := func() []string {
		var got []string
		for range subs {
			got = append(got, s.recv().GetTypeUrl())
		}
		return got
	}
	send("1", 0, 1, 2, 3)
	if got := receive(); !slices.Equal(got, []string{subs[0].typeURL, subs[1].typeURL, subs[2].typeURL, subs[3].typeURL}) {
		t.Fatalf("make-before-break order lost: %v", got)
	}
	for _, i := range []int{3, 2, 1, 0} {
		send("2", i)
		if got := s.recv().GetTypeUrl(); got != subs[i].typeURL {
			t.Fatalf("the control plane sent %s, the client got %s", subs[i].typeURL, got)
		}
	}
}
