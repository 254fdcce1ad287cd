package relay

import (
	"slices"
	"testing"
	"time"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// upstreamSubscribes counts the upstream requests that subscribe (or
// unsubscribe) name.
func upstreamCount(cp *testcp.ControlPlane, name string, unsubscribe bool) int {
	n := 0
	for _, r := range cp.Requests() {
		names := r.GetResourceNamesSubscribe()
		if unsubscribe {
			names = r.GetResourceNamesUnsubscribe()
		}
		if slices.Contains(names, name) {
			n++
		}
	}
	return n
}

// Union of interests: upstream subscribes to what any client of the group
// wants; a name nobody wants stays subscribed and cached for the retention
// period, so a returning client is answered without an upstream round trip;
// then it is unsubscribed.
func TestUnionOfInterestsAndRetention(t *testing.T) {
	const retention = 500 * time.Millisecond
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Endpoints("a", "10.0.0.1:80"), testcp.Endpoints("b", "10.0.0.2:80"))
	r := startRelay(t, cp.Addr, func(c *Config) { c.Cache.Retention = retention })

	s1 := openDelta(t, r.Addr())
	s1.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n1", "c1"), TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: []string{"a"}})
	s1.recv()
	s2 := openDelta(t, r.Addr())
	s2.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n2", "c1"), TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: []string{"a", "b"}})
	if got := collectDelta(s2, 2); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("second client got %v", got)
	}
	if n := upstreamCount(cp, "a", false); n != 1 {
		t.Fatalf("a subscribed upstream %d times, want once", n)
	}

	// Both leave a; it stays cached.
	s1.close()
	s2.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNamesUnsubscribe: []string{"a"}})
	s3 := openDelta(t, r.Addr())
	s3.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n3", "c1"), TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: []string{"a"}})
	if got := deltaNames(s3.recv()); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("returning client got %v", got)
	}
	if n := upstreamCount(cp, "a", false); n != 1 {
		t.Fatalf("a returning client caused %d upstream subscribes of a, want still 1", n)
	}
	s3.close()
	left := time.Now()

	eventually(t, "the upstream unsubscribe of a", func() bool { return upstreamCount(cp, "a", true) == 1 })
	if held := time.Since(left); held < retention {
		t.Fatalf("a was unsubscribed after %s, before the retention of %s", held, retention)
	}
	if n := upstreamCount(cp, "b", true); n != 0 {
		t.Fatal("b, still watched, was unsubscribed")
	}
}

// A group with no clients left ends its upstream stream once retention is
// over; a new client starts it again.
func TestGroupEndsAfterRetention(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("x"))
	r := startRelay(t, cp.Addr, func(c *Config) { c.Cache.Retention = 100 * time.Millisecond })
	s := openSotW(t, r.Addr())
	s.send(&discoverypb.DiscoveryRequest{Node: node("n1", "c1"), TypeUrl: resourcev3.ClusterType})
	s.recv()
	s.close()
	eventually(t, "the group to end", func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return len(r.groups) == 0
	})
	s = openSotW(t, r.Addr())
	s.send(&discoverypb.DiscoveryRequest{Node: node("n1", "c1"), TypeUrl: resourcev3.ClusterType})
	if got := sotwClusters(t, s.recv()); !slices.Equal(got, []string{"x"}) {
		t.Fatalf("after the group restarted: %v", got)
	}
	if n := cp.DeltaStreams.Load(); n != 2 {
		t.Fatalf("%d upstream streams, want 2 (one per group lifetime)", n)
	}
}
