package relay

import (
	"maps"
	"slices"
	"testing"
	"time"

	clusterpb "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointpb "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

func deltaNames(r *discoverypb.DeltaDiscoveryResponse) []string {
	var out []string
	for _, res := range r.GetResources() {
		out = append(out, res.GetName())
	}
	slices.Sort(out)
	return out
}

// collectDelta receives until n distinct resources have arrived.
func collectDelta(s *deltaStream, n int) []string {
	seen := map[string]bool{}
	for len(seen) < n {
		for _, name := range deltaNames(s.recv()) {
			seen[name] = true
		}
	}
	return slices.Sorted(maps.Keys(seen))
}

func sotwClusters(t *testing.T, r *discoverypb.DiscoveryResponse) []string {
	t.Helper()
	var out []string
	for _, a := range r.GetResources() {
		c := &clusterpb.Cluster{}
		if err := a.UnmarshalTo(c); err != nil {
			t.Fatal(err)
		}
		out = append(out, c.GetName())
	}
	slices.Sort(out)
	return out
}

// Incremental, named EDS: the client gets the resource, each upstream change
// of it, and an ACK or NACK changes nothing it is sent
// ("Incremental xDS", "ACK/NACK and resource type instance version").
func TestDeltaNamedEDS(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Endpoints("a", "10.0.0.1:80"), testcp.Endpoints("b", "10.0.0.2:80"))
	r := startRelay(t, cp.Addr)

	s := openDelta(t, r.Addr())
	s.send(&discoverypb.DeltaDiscoveryRequest{
		Node: node("n1", "c1"), TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: []string{"a"},
	})
	resp := s.recv()
	if got := deltaNames(resp); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("first response has %v, want [a]", got)
	}
	cla := &endpointpb.ClusterLoadAssignment{}
	if err := resp.GetResources()[0].GetResource().UnmarshalTo(cla); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(cla, testcp.Endpoints("a", "10.0.0.1:80")) {
		t.Fatalf("resource differs from the control plane's: %v", cla)
	}
	v1 := resp.GetResources()[0].GetVersion()
	s.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResponseNonce: resp.GetNonce()})
	s.quiet(100 * time.Millisecond)

	// A change to b, which this client does not want, is not sent to it.
	cp.Set(t, "c1", "2", testcp.Endpoints("a", "10.0.0.1:80"), testcp.Endpoints("b", "10.0.0.3:80"))
	s.quiet(200 * time.Millisecond)

	// A change to a is.
	cp.Set(t, "c1", "3", testcp.Endpoints("a", "10.0.0.9:80"), testcp.Endpoints("b", "10.0.0.3:80"))
	resp2 := s.recv()
	if got := deltaNames(resp2); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("update has %v, want [a]", got)
	}
	if resp2.GetNonce() == resp.GetNonce() {
		t.Fatal("nonce reused")
	}
	if v := resp2.GetResources()[0].GetVersion(); v == v1 {
		t.Fatalf("version did not change: %s", v)
	}
	// A NACK is not answered with the same resource again.
	s.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResponseNonce: resp2.GetNonce(),
		ErrorDetail: &status.Status{Code: 3, Message: "rejected"}})
	s.quiet(200 * time.Millisecond)
	// The next upstream change is.
	cp.Set(t, "c1", "4", testcp.Endpoints("a", "10.0.0.10:80"), testcp.Endpoints("b", "10.0.0.3:80"))
	if got := deltaNames(s.recv()); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("update after NACK has %v, want [a]", got)
	}
}

// SotW wildcard CDS: every response carries the full state, and omission
// means deletion ("Grouping Resources into Responses", "Deleting Resources").
func TestSotWWildcardCDS(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("x"), testcp.Cluster("y"))
	r := startRelay(t, cp.Addr)

	s := openSotW(t, r.Addr())
	s.send(&discoverypb.DiscoveryRequest{Node: node("n1", "c1"), TypeUrl: resourcev3.ClusterType})
	resp := s.recv()
	if got := sotwClusters(t, resp); !slices.Equal(got, []string{"x", "y"}) {
		t.Fatalf("first response has %v, want [x y]", got)
	}
	s.send(&discoverypb.DiscoveryRequest{TypeUrl: resourcev3.ClusterType, VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()})
	s.quiet(100 * time.Millisecond)

	cp.Set(t, "c1", "2", testcp.Cluster("x"), testcp.Cluster("y"), testcp.Cluster("z"))
	resp = s.recv()
	if got := sotwClusters(t, resp); !slices.Equal(got, []string{"x", "y", "z"}) {
		t.Fatalf("after an addition: %v, want [x y z]", got)
	}
	s.send(&discoverypb.DiscoveryRequest{TypeUrl: resourcev3.ClusterType, VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()})

	cp.Set(t, "c1", "3", testcp.Cluster("x"), testcp.Cluster("z"))
	resp = s.recv()
	if got := sotwClusters(t, resp); !slices.Equal(got, []string{"x", "z"}) {
		t.Fatalf("after a deletion: %v, want [x z]", got)
	}
	// NACK: the rejected state is not sent again.
	s.send(&discoverypb.DiscoveryRequest{TypeUrl: resourcev3.ClusterType, VersionInfo: "old", ResponseNonce: resp.GetNonce(),
		ErrorDetail: &status.Status{Code: 3, Message: "rejected"}})
	s.quiet(200 * time.Millisecond)
}

// SotW named EDS: only the requested resources, each change sent, and a new
// name in a request is answered ("How the client specifies what resources to
// return").
func TestSotWNamedEDS(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Endpoints("a", "10.0.0.1:80"), testcp.Endpoints("b", "10.0.0.2:80"))
	r := startRelay(t, cp.Addr)

	s := openSotW(t, r.Addr())
	s.send(&discoverypb.DiscoveryRequest{Node: node("n1", "c1"), TypeUrl: resourcev3.EndpointType, ResourceNames: []string{"a"}})
	resp := s.recv()
	if n := len(resp.GetResources()); n != 1 {
		t.Fatalf("got %d resources, want 1", n)
	}
	s.send(&discoverypb.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: []string{"a", "b"},
		VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()})
	resp = s.recv()
	cla := &endpointpb.ClusterLoadAssignment{}
	if err := resp.GetResources()[0].UnmarshalTo(cla); err != nil || cla.GetClusterName() != "b" || len(resp.GetResources()) != 1 {
		t.Fatalf("after subscribing to b: %v (%v)", resp.GetResources(), err)
	}
}

// Aggregation: twenty clients of one group cost the control plane one
// stream; clients of two groups get their own resources.
func TestAggregation(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("one"))
	cp.Set(t, "c2", "1", testcp.Cluster("two"))
	r := startRelay(t, cp.Addr)

	for i := range 20 {
		s := openDelta(t, r.Addr())
		s.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n"+string(rune('a'+i)), "c1"), TypeUrl: resourcev3.ClusterType})
		if got := deltaNames(s.recv()); !slices.Equal(got, []string{"one"}) {
			t.Fatalf("client %d of c1 got %v, want [one]", i, got)
		}
	}
	if n := cp.DeltaStreams.Load(); n != 1 {
		t.Fatalf("control plane saw %d streams for 20 clients of one group, want 1", n)
	}
	s := openSotW(t, r.Addr())
	s.send(&discoverypb.DiscoveryRequest{Node: node("other", "c2"), TypeUrl: resourcev3.ClusterType})
	if got := sotwClusters(t, s.recv()); !slices.Equal(got, []string{"two"}) {
		t.Fatalf("client of c2 got %v, want [two]", got)
	}
	if n := cp.DeltaStreams.Load(); n != 2 {
		t.Fatalf("control plane saw %d streams for two groups, want 2", n)
	}
	if n := cp.SotWStreams.Load(); n != 0 {
		t.Fatalf("the relay opened %d SotW streams upstream, want none", n)
	}
	// Upstream, each group is presented with the group's node.
	for _, n := range cp.Nodes() {
		if n.GetCluster() != "c1" && n.GetCluster() != "c2" {
			t.Fatalf("unexpected node upstream: %v", n)
		}
	}
}

// Incremental wildcard: the legacy empty subscribe is a wildcard; additions
// and removals upstream arrive as resources and removed_resources; a client
// reconnecting with initial_resource_versions is sent only what changed
// ("Incremental reconnect example").
func TestDeltaWildcardAndReconnect(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("x"), testcp.Cluster("y"))
	r := startRelay(t, cp.Addr)

	s := openDelta(t, r.Addr())
	s.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n1", "c1"), TypeUrl: resourcev3.ClusterType})
	resp := s.recv()
	if got := deltaNames(resp); !slices.Equal(got, []string{"x", "y"}) {
		t.Fatalf("wildcard got %v", got)
	}
	versions := map[string]string{}
	for _, res := range resp.GetResources() {
		versions[res.GetName()] = res.GetVersion()
	}
	s.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResponseNonce: resp.GetNonce()})

	cp.Set(t, "c1", "2", testcp.Cluster("x"))
	resp = s.recv()
	if len(resp.GetResources()) != 0 || !slices.Equal(resp.GetRemovedResources(), []string{"y"}) {
		t.Fatalf("after removing y: resources %v removed %v", deltaNames(resp), resp.GetRemovedResources())
	}
	s.close()

	// While the client is away: x changes, z appears.
	changed := testcp.Cluster("x")
	changed.ConnectTimeout.Seconds = 7
	cp.Set(t, "c1", "3", changed, testcp.Cluster("z"))
	eventually(t, "the relay to see version 3", func() bool {
		all, _ := r.groupCache(keyOf("c1")).All(resourcev3.ClusterType)
		return len(all) == 2
	})

	s = openDelta(t, r.Addr())
	s.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n1", "c1"), TypeUrl: resourcev3.ClusterType,
		InitialResourceVersions: versions}) // x and y, as the client last had them
	seen := map[string]bool{}
	var removed []string
	for len(seen) < 2 || len(removed) < 1 {
		resp := s.recv()
		for _, n := range deltaNames(resp) {
			seen[n] = true
		}
		removed = append(removed, resp.GetRemovedResources()...)
	}
	if !seen["x"] || !seen["z"] || !slices.Equal(removed, []string{"y"}) {
		t.Fatalf("on reconnect: sent %v removed %v, want x and z sent and y removed", seen, removed)
	}

	// Unchanged resources are not re-sent on reconnect.
	s2 := openDelta(t, r.Addr())
	now := map[string]string{}
	for n, v := range r.groupCache(keyOf("c1")).Versions(resourcev3.ClusterType) {
		now[n] = v
	}
	s2.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n2", "c1"), TypeUrl: resourcev3.ClusterType, InitialResourceVersions: now})
	if resp := s2.recv(); len(resp.GetResources())+len(resp.GetRemovedResources()) != 0 {
		t.Fatalf("a client with current versions was sent %v, removed %v", deltaNames(resp), resp.GetRemovedResources())
	}
	s2.quiet(200 * time.Millisecond)
}
