package upstream

import (
	"reflect"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/metrics"
	"github.com/xdsrelay/xdsrelay/internal/testcp"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// Responses are decoded by hand out of gRPC's frames (xds.Received), and
// the cache holds what xds.Encode gives of each resource, byte for byte.
func TestReceivedResourcesAreEncodedAsBefore(t *testing.T) {
	srv, conn := startScripted(t)
	c := cache.New(cache.Options{Retention: time.Minute})
	names := []string{"plain", "ttl", "unversioned", "metadata"}
	c.Watch(cache.NewWatch(), resourcev3.ClusterType, names...)
	st := runClient(t, srv, Options{Conn: conn, Node: &corepb.Node{Id: "n"}, Cache: c, Metrics: NewMetrics(&metrics.Registry{})})
	recvReq(t, st)
	cluster := func(name string) *anypb.Any {
		a, _ := anypb.New(testcp.Cluster(name))
		return a
	}
	sent := []*discoverypb.Resource{
		{Name: "plain", Version: "1", Resource: cluster("plain")},
		{Name: "ttl", Version: "1", Resource: cluster("ttl"), Ttl: durationpb.New(time.Hour), Aliases: []string{"alias"}},
		{Name: "unversioned", Resource: cluster("unversioned")},
		{Name: "metadata", Version: "1", Resource: cluster("metadata"), CacheControl: &discoverypb.Resource_CacheControl{DoNotCache: true},
			Metadata: &corepb.Metadata{FilterMetadata: map[string]*structpb.Struct{"f": {}}}},
	}
	if err := st.Send(&discoverypb.DeltaDiscoveryResponse{TypeUrl: resourcev3.ClusterType, Nonce: "1", Resources: sent}); err != nil {
		t.Fatal(err)
	}
	if ack := recvReq(t, st); ack.GetResponseNonce() != "1" || ack.GetErrorDetail() != nil {
		t.Fatalf("not an ACK: %v", ack)
	}
	for i, l := range c.Get(resourcev3.ClusterType, names) {
		r := sent[i]
		want, err := xds.Encode(r.GetName(), r.GetVersion(), r.GetResource(), r.GetTtl(), r.GetAliases())
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(l.Resource, want) {
			t.Errorf("%s: cached %+v, xds.Encode gives %+v", r.GetName(), l.Resource, want)
		}
	}
}

// A response's system_version_info is the control plane's, of any length:
// what each resource keeps of it (and a warm-restart file saves) is
// clipped to xds.MaxText.
func TestUpstreamVersionClipped(t *testing.T) {
	srv, conn := startScripted(t)
	c := cache.New(cache.Options{Retention: time.Minute})
	c.Watch(cache.NewWatch(), resourcev3.ClusterType, "a", "b")
	st := runClient(t, srv, Options{Conn: conn, Node: &corepb.Node{Id: "n"}, Cache: c, Metrics: NewMetrics(&metrics.Registry{})})
	recvReq(t, st)
	var rs []*discoverypb.Resource
	for _, n := range []string{"a", "b"} {
		a, _ := anypb.New(testcp.Cluster(n))
		rs = append(rs, &discoverypb.Resource{Name: n, Version: "1", Resource: a})
	}
	long := string(make([]byte, 5*xds.MaxText))
	if err := st.Send(&discoverypb.DeltaDiscoveryResponse{TypeUrl: resourcev3.ClusterType, Nonce: "1",
		SystemVersionInfo: long, Resources: rs}); err != nil {
		t.Fatal(err)
	}
	recvReq(t, st) // the ACK: the response is applied
	for _, l := range c.Get(resourcev3.ClusterType, []string{"a", "b"}) {
		if l.Resource == nil {
			t.Fatalf("%s not held", l.Name)
		}
		if got := l.Resource.Upstream; got != xds.Clip(long) {
			t.Errorf("%s: upstream version of %d bytes, want it clipped to %d", l.Name, len(got), len(xds.Clip(long)))
		}
	}
}
