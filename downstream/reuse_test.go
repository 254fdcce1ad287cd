package downstream

import (
	"strconv"
	"strings"
	"testing"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointpb "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/xdsrelay/xdsrelay/cache"
)

// A response is used again once gRPC has written it (xds.Message), never
// before: streams sharing a connection, each sent a run of changes of a
// resource large enough for gRPC to count its buffer, without waiting for
// their ACKs, read every response whole and as it was sent to them. A
// response used again while gRPC still writes it would reach its client
// torn or carrying another stream's header, and -race sees its storage
// written while gRPC reads it.
func TestResponsesUsedAgainOnlyOnceWritten(t *testing.T) {
	const typeURL = resourcev3.EndpointType
	const streams, changes = 8, 60
	c := cache.New(cache.Options{})
	version := func(k int) string { return "v" + strconv.Itoa(k) }
	change := func(k int) {
		c.Apply(typeURL, cache.Change{Upserts: []*cache.Resource{encoded(t, typeURL, "cla-0", version(k), 4<<10)}, Synced: true})
	}
	_, cc := serveOn(t, Options{Groups: oneGroup{c}})
	ads := discoverypb.NewAggregatedDiscoveryServiceClient(cc)
	type client struct {
		st    *clientStream[discoverypb.DeltaDiscoveryRequest, discoverypb.DeltaDiscoveryResponse]
		nonce int // the last response's
		last  int // the version it carried
	}
	// check reads the next response of cl: one version of cla-0, whole,
	// with the stream's next nonce; it is ACKed.
	check := func(i int, cl *client) {
		t.Helper()
		r := cl.st.recv()
		nonce, err := strconv.Atoi(r.GetNonce())
		if err != nil || nonce != cl.nonce+1 {
			t.Fatalf("stream %d: nonce %q after %d", i, r.GetNonce(), cl.nonce)
		}
		cl.nonce = nonce
		if r.GetTypeUrl() != typeURL || len(r.GetResources()) != 1 || len(r.GetRemovedResources()) != 0 {
			t.Fatalf("stream %d: response %d is not one %s: %v resources, %v removed", i, nonce, typeURL,
				len(r.GetResources()), r.GetRemovedResources())
		}
		res := r.GetResources()[0]
		v, err := strconv.Atoi(strings.TrimPrefix(res.GetVersion(), "v"))
		if err != nil || v < cl.last || res.GetName() != "cla-0" {
			t.Fatalf("stream %d: response %d carries %q at %q after version %d", i, nonce, res.GetName(), res.GetVersion(), cl.last)
		}
		cl.last = v
		var cla endpointpb.ClusterLoadAssignment
		if err := res.GetResource().UnmarshalTo(&cla); err != nil {
			t.Fatalf("stream %d: response %d: %v", i, nonce, err)
		}
		if pad := cla.GetEndpoints()[0].GetLocality().GetSubZone(); !strings.HasPrefix(pad, res.GetVersion()) || len(pad) != 4<<10 {
			t.Fatalf("stream %d: response %d: version %s carries the content of another (%.8q, %d bytes)", i, nonce, res.GetVersion(), pad, len(pad))
		}
		cl.st.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: typeURL, ResponseNonce: r.GetNonce()})
	}
	clients := make([]*client, streams)
	for i := range clients {
		cl := &client{st: openStream(t, ads.DeltaAggregatedResources)}
		cl.st.send(&discoverypb.DeltaDiscoveryRequest{Node: &corepb.Node{Id: "reuse-" + strconv.Itoa(i)},
			TypeUrl: typeURL, ResourceNamesSubscribe: []string{"cla-0"}})
		clients[i] = cl
	}
	watched(t, c, typeURL, "cla-0")
	change(0)
	for i, cl := range clients {
		check(i, cl)
	}
	for k := 1; k <= changes; k++ {
		change(k)
	}
	// Changes that reach a stream while its last flush runs go out
	// together: each stream reads until it has the last.
	for i, cl := range clients {
		for cl.last < changes {
			check(i, cl)
		}
	}
}
