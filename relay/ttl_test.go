package relay

import (
	"slices"
	"strings"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

func ttlNode(id string, features ...string) *corepb.Node {
	return &corepb.Node{Id: id, Cluster: "c1", ClientFeatures: features}
}

// "TTL": resources keep their upstream TTL downstream (Resource.ttl in
// incremental; wrapped in a Resource in SotW for clients advertising
// xds.config.supports-resource-in-sotw and -ttl); heartbeats refresh it and
// are not updates; with no heartbeat the resource is removed when the TTL
// runs out. go-control-plane sends no TTL over delta, so the control plane
// here is scripted.
func TestTTLAndHeartbeats(t *testing.T) {
	up := testcp.StartScripted(t)
	// One group for clients that differ in their features (merged on purpose).
	r := startRelay(t, up.Addr, func(c *Config) { c.Cache.Retention, c.Upstream.GroupBy = 40*time.Millisecond, []string{"cluster"} })

	ttlDelta := openDelta(t, r.Addr())
	ttlDelta.send(&discoverypb.DeltaDiscoveryRequest{Node: ttlNode("d-ttl", "xds.config.supports-resource-ttl"),
		TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: []string{"a"}})
	st := up.Stream(t)
	if req := st.Recv(); len(req.GetResourceNamesSubscribe()) != 1 {
		t.Fatalf("upstream subscribe: %v", req)
	}
	cla, _ := anypb.New(testcp.Endpoints("a", "10.0.0.1:80"))
	const ttl = 300 * time.Millisecond
	st.Send(&discoverypb.DeltaDiscoveryResponse{TypeUrl: resourcev3.EndpointType, Nonce: "1",
		Resources: []*discoverypb.Resource{{Name: "a", Version: "v1", Resource: cla, Ttl: durationpb.New(ttl)}}})
	st.Recv() // ACK
	got := ttlDelta.recv().GetResources()[0]
	if got.GetTtl().AsDuration() != ttl || got.GetResource() == nil {
		t.Fatalf("TTL client got %v", got)
	}

	plainDelta := openDelta(t, r.Addr())
	plainDelta.send(&discoverypb.DeltaDiscoveryRequest{Node: ttlNode("d-plain"), TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: []string{"a"}})
	if got := plainDelta.recv().GetResources()[0]; got.GetTtl() != nil {
		t.Fatalf("a client without TTL support got a TTL: %v", got)
	}
	ttlSotW := openSotW(t, r.Addr())
	ttlSotW.send(&discoverypb.DiscoveryRequest{Node: ttlNode("s-ttl", "xds.config.supports-resource-ttl", "xds.config.supports-resource-in-sotw"),
		TypeUrl: resourcev3.EndpointType, ResourceNames: []string{"a"}})
	wrapped := &discoverypb.Resource{}
	if a := ttlSotW.recv().GetResources()[0]; a.UnmarshalTo(wrapped) != nil || wrapped.GetTtl().AsDuration() != ttl {
		t.Fatalf("SotW TTL client got %v, want a Resource with the TTL", a)
	}
	plainSotW := openSotW(t, r.Addr())
	plainSotW.send(&discoverypb.DiscoveryRequest{Node: ttlNode("s-plain"), TypeUrl: resourcev3.EndpointType, ResourceNames: []string{"a"}})
	if a := plainSotW.recv().GetResources()[0]; a.GetTypeUrl() != resourcev3.EndpointType {
		t.Fatalf("plain SotW client got a %s", a.GetTypeUrl())
	}

	// Heartbeats: passed on to TTL clients as heartbeats, to no one else.
	for i := range 3 {
		time.Sleep(ttl / 2)
		st.Send(&discoverypb.DeltaDiscoveryResponse{TypeUrl: resourcev3.EndpointType, Nonce: "hb",
			Resources: []*discoverypb.Resource{{Name: "a", Version: "v1", Ttl: durationpb.New(ttl)}}})
		st.Recv() // ACK
		hb := ttlDelta.recv().GetResources()[0]
		if hb.GetResource() != nil || hb.GetVersion() != "v1" || hb.GetTtl().AsDuration() != ttl {
			t.Fatalf("heartbeat %d reached the TTL client as %v", i, hb)
		}
		ttlSotW.recv()
	}
	plainDelta.quiet(10 * time.Millisecond)
	plainSotW.quiet(10 * time.Millisecond)

	// No heartbeat: the resource expires and is removed.
	for _, s := range []*deltaStream{ttlDelta, plainDelta} {
		resp := s.recv()
		if len(resp.GetRemovedResources()) != 1 || resp.GetRemovedResources()[0] != "a" {
			t.Fatalf("after the TTL: %v", resp)
		}
	}
}

// Per-resource errors from upstream are passed on ("Not found": the
// upstream's removed_resources and per-resource errors are passed on).
func TestUpstreamResourceErrorsPassedOn(t *testing.T) {
	up := testcp.StartScripted(t)
	r := startRelay(t, up.Addr)
	d := openDelta(t, r.Addr())
	d.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "c1"), TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: []string{"broken"}})
	st := up.Stream(t)
	st.Recv()
	st.Send(&discoverypb.DeltaDiscoveryResponse{TypeUrl: resourcev3.EndpointType, Nonce: "1",
		ResourceErrors: []*discoverypb.ResourceError{{
			ResourceName: &discoverypb.ResourceName{Name: "broken"},
			ErrorDetail:  &status.Status{Code: int32(codes.NotFound), Message: "no such cluster"},
		}}})
	resp := d.recv()
	if errs := resp.GetResourceErrors(); len(errs) != 1 || errs[0].GetResourceName().GetName() != "broken" ||
		errs[0].GetErrorDetail().GetMessage() != "no such cluster" {
		t.Fatalf("delta client got %v", resp)
	}
	// A SotW client already answered is sent the error in a response.
	cla, _ := anypb.New(testcp.Endpoints("fine", "10.0.0.1:80"))
	s := openSotW(t, r.Addr())
	s.send(&discoverypb.DiscoveryRequest{Node: node("n2", "c1"), TypeUrl: resourcev3.EndpointType, ResourceNames: []string{"fine"}})
	for req := st.Recv(); !slices.Contains(req.GetResourceNamesSubscribe(), "fine"); req = st.Recv() {
	}
	st.Send(&discoverypb.DeltaDiscoveryResponse{TypeUrl: resourcev3.EndpointType, Nonce: "2",
		Resources: []*discoverypb.Resource{{Name: "fine", Version: "1", Resource: cla}}})
	first := s.recv()
	s.send(&discoverypb.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: []string{"fine", "broken"},
		VersionInfo: first.GetVersionInfo(), ResponseNonce: first.GetNonce()})
	if errs := s.recv().GetResourceErrors(); len(errs) != 1 || errs[0].GetErrorDetail().GetCode() != int32(codes.NotFound) {
		t.Fatalf("SotW client got %v", errs)
	}
	// A SotW client whose first answer would be the error alone is told by
	// the end of its stream, as a client that does not read resource_errors
	// understands (gRFC A57).
	fresh := openSotW(t, r.Addr())
	fresh.send(&discoverypb.DiscoveryRequest{Node: node("n3", "c1"), TypeUrl: resourcev3.EndpointType, ResourceNames: []string{"broken"}})
	if err := ended(t, fresh); grpcstatus.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "no such cluster") {
		t.Fatalf("fresh SotW client: stream ended with %v", err)
	}
}

// A control plane's own error for a name is its answer (docs/clients.md:
// resource errors are passed on): the does-not-exist timer leaves it be.
// Transient (UNAVAILABLE) or not, it is never overwritten by NOT_FOUND
// and a removal (docs/architecture.md, invariant 15).
func TestUpstreamResourceErrorsOutliveTheTimer(t *testing.T) {
	up := testcp.StartScripted(t)
	const timeout = 200 * time.Millisecond
	r := startRelay(t, up.Addr, func(c *Config) { c.Cache.NotFoundTimeout = timeout })
	d := openDelta(t, r.Addr())
	d.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "c1"), TypeUrl: resourcev3.EndpointType,
		ResourceNamesSubscribe: []string{"flaky", "denied"}})
	st := up.Stream(t)
	st.Recv()
	errOf := func(name string, code codes.Code) *discoverypb.ResourceError {
		return &discoverypb.ResourceError{ResourceName: &discoverypb.ResourceName{Name: name},
			ErrorDetail: &status.Status{Code: int32(code), Message: "the control plane's own"}}
	}
	st.Send(&discoverypb.DeltaDiscoveryResponse{TypeUrl: resourcev3.EndpointType, Nonce: "1",
		ResourceErrors: []*discoverypb.ResourceError{errOf("flaky", codes.Unavailable), errOf("denied", codes.PermissionDenied)}})
	got := map[string][]codes.Code{}
	for end := time.Now().Add(10 * timeout); time.Until(end) > 0; {
		var resp *discoverypb.DeltaDiscoveryResponse
		select {
		case resp = <-d.resps:
		case <-time.After(time.Until(end)):
		}
		if resp == nil {
			break
		}
		if len(resp.GetRemovedResources()) > 0 {
			t.Fatalf("the client was told %v were removed", resp.GetRemovedResources())
		}
		for _, e := range resp.GetResourceErrors() {
			n := e.GetResourceName().GetName()
			got[n] = append(got[n], codes.Code(e.GetErrorDetail().GetCode()))
		}
		d.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()})
	}
	if !slices.Equal(got["flaky"], []codes.Code{codes.Unavailable}) || !slices.Equal(got["denied"], []codes.Code{codes.PermissionDenied}) {
		t.Fatalf("errors sent over %v: %v, want the control plane's, once each", 10*timeout, got)
	}
}
