package relay

import (
	"slices"
	"testing"

	tlspb "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/testcp"
	"github.com/xdsrelay/xdsrelay/internal/xds"
	"github.com/xdsrelay/xdsrelay/upstream"
)

const partnerCluster = "xdstp://partner.example.com/envoy.config.cluster.v3.Cluster/c2"

// encodeForTest is m as the cache holds it, named name at version.
func encodeForTest(t testing.TB, name, version string, m proto.Message) *cache.Resource {
	t.Helper()
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	r, err := xds.Encode(name, version, a, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// A saved cache records which upstream each resource came from
// (control_plane.identifier on each record but the default's), loads back
// whole, and a restore under a configuration that routes a name elsewhere
// drops what the old upstream gave.
func TestPersistRecordsUpstream(t *testing.T) {
	cfg := Default()
	secrets := DefaultUpstream()
	secrets.Name, secrets.Types = "secrets", []string{resourcev3.SecretType}
	partner := DefaultUpstream()
	partner.Name, partner.Authorities = "partner", []string{"partner.example.com"}
	cfg.Upstreams = []UpstreamConfig{secrets, partner}
	routes, err := cfg.Routes()
	if err != nil {
		t.Fatal(err)
	}
	r := &Relay{routes: routes, log: testLogger()}
	states := []cache.TypeState{
		{TypeURL: resourcev3.ClusterType, Wildcard: true, Synced: true, Resources: []*cache.Resource{
			encodeForTest(t, "c1", "1", testcp.Cluster("c1")), encodeForTest(t, partnerCluster, "1", testcp.Cluster(partnerCluster))}},
		{TypeURL: resourcev3.SecretType, Resources: []*cache.Resource{encodeForTest(t, "s1", "1", &tlspb.Secret{Name: "s1"})}, Absent: []string{"s2"}},
	}
	data, err := encodeGroup(node("n", "c1"), states, r.owner())
	if err != nil {
		t.Fatal(err)
	}
	_, saved, err := decodeRecords(data)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, st := range saved {
		got = append(got, xds.ShortName(st.TypeURL)+"/"+st.upstream)
	}
	slices.Sort(got)
	if want := []string{"Cluster/default", "Cluster/partner", "Secret/secrets"}; !slices.Equal(got, want) {
		t.Fatalf("records %v, want %v", got, want)
	}
	_, merged, err := decodeGroup(data)
	if err != nil {
		t.Fatal(err)
	}
	if len(merged) != 2 || !merged[0].Wildcard || !merged[0].Synced || len(merged[0].Resources) != 2 ||
		len(merged[1].Resources) != 1 || !slices.Equal(merged[1].Absent, []string{"s2"}) {
		t.Fatalf("merged back: %+v", merged)
	}

	// With one upstream again, only what the default gave is restored.
	one := &Relay{log: testLogger()}
	kept := mergeTypes(one.keepRouted(saved, "test"))
	var names []string
	for _, ts := range kept {
		for _, res := range ts.Resources {
			names = append(names, res.Name)
		}
		names = append(names, ts.Absent...)
	}
	if !slices.Equal(names, []string{"c1"}) {
		t.Fatalf("restored under one upstream: %v, want [c1]", names)
	}
	if kept[0].TypeURL != resourcev3.ClusterType || !kept[0].Wildcard {
		t.Fatalf("the default's wildcard was not kept: %+v", kept[0])
	}
	if r.owner()(resourcev3.ClusterType, "xdstp://unknown/envoy.config.cluster.v3.Cluster/x") != upstream.DefaultUpstream {
		t.Fatal("an unroutable name is saved as the default's")
	}
}
