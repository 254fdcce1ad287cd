package relay

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	clustersvc "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// The relay in front of a control plane of each dialect (docs/architecture.md,
// invariant 16; docs/control-planes.md): delta and SotW ADS, SotW ADS only
// (delta refused with UNIMPLEMENTED, as Gloo's), and the per-type SotW
// services only (no ADS, as Contour's). With upstream.protocol: auto the
// relay finds each, and its clients see the same thing whatever the control
// plane speaks.

func forEachDialect(t *testing.T, f func(t *testing.T, d testcp.Dialect)) {
	for _, d := range testcp.Dialects {
		t.Run(string(d), func(t *testing.T) { f(t, d) })
	}
}

// upstreamProtocol is what /debug/groups says the group's upstream speaks.
func upstreamProtocol(t *testing.T, r *Relay) string {
	var groups []debugGroup
	getJSON(t, r, "/debug/groups", &groups)
	if len(groups) == 0 || len(groups[0].Upstreams) == 0 {
		return ""
	}
	return groups[0].Upstreams[0].Protocol
}

// protocolMetric is the protocols xdsrelay_upstream_protocol shows at 1.
func protocolMetric(t *testing.T, r *Relay) []string {
	var out []string
	for _, m := range scrape(t, r)["xdsrelay_upstream_protocol"].GetMetric() {
		if m.GetGauge().GetValue() != 1 {
			continue
		}
		for _, l := range m.GetLabel() {
			if l.GetName() == "protocol" {
				out = append(out, l.GetValue())
			}
		}
	}
	return out
}

// Every client variant is served, changes reach it, and a removal reaches
// it only where the spec says absence is one: a Cluster left out of a
// full-state response is removed; a ClusterLoadAssignment left out is not.
func TestDialectServesEveryVariant(t *testing.T) {
	forEachDialect(t, func(t *testing.T, d testcp.Dialect) {
		cp := testcp.StartDialect(t, d)
		cp.Set(t, "c1", "1", testcp.Cluster("a"), testcp.Cluster("b"),
			testcp.Endpoints("a", "10.0.0.1:80"), testcp.Endpoints("b", "10.0.0.2:80"))
		r := startRelay(t, cp.Addr, func(c *Config) { c.Downstream.RESTAddress = "127.0.0.1:0" })

		delta := openDelta(t, r.Addr())
		delta.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n1", "c1"), TypeUrl: resourcev3.ClusterType,
			ResourceNamesSubscribe: []string{"*"}})
		if got := collectDelta(delta, 2); !slices.Equal(got, []string{"a", "b"}) {
			t.Fatalf("delta wildcard CDS: %v, want [a b]", got)
		}
		sotw := openSotW(t, r.Addr())
		sotw.send(&discoverypb.DiscoveryRequest{Node: node("n2", "c1"), TypeUrl: resourcev3.EndpointType,
			ResourceNames: []string{"a", "b"}})
		resp := sotw.recv()
		if got := len(resp.GetResources()); got != 2 {
			t.Fatalf("SotW named EDS: %d resources, want 2", got)
		}
		sotw.send(&discoverypb.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: []string{"a", "b"},
			VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()})
		// The per-type SotW service and REST-JSON polling.
		perType := newStream(t, clustersvc.NewClusterDiscoveryServiceClient(dial(t, r.Addr())).StreamClusters)
		perType.send(&discoverypb.DiscoveryRequest{Node: node("n4", "c1")})
		if got := sotwClusters(t, perType.recv()); !slices.Equal(got, []string{"a", "b"}) {
			t.Fatalf("per-type CDS: %v, want [a b]", got)
		}
		if code, body := restPoll(t, "http://"+r.RESTAddr()+"/v3/discovery:clusters",
			&discoverypb.DiscoveryRequest{Node: node("n5", "c1")}); code != 200 || !strings.Contains(body, `"name":"b"`) {
			t.Fatalf("REST-JSON CDS: %d %s", code, body)
		}
		if got := upstreamProtocol(t, r); got != string(d) {
			t.Fatalf("/debug/groups says the upstream speaks %q, want %q", got, d)
		}
		if got := protocolMetric(t, r); !slices.Equal(got, []string{string(d)}) {
			t.Fatalf("xdsrelay_upstream_protocol is 1 for %v, want [%s]", got, d)
		}

		// Cluster b and endpoints b leave the control plane's state; a changes.
		cp.Set(t, "c1", "2", testcp.Cluster("a"), testcp.Endpoints("a", "10.0.0.9:80"))
		removed := false
		for !removed {
			dr := delta.recv()
			if len(dr.GetResources()) > 0 {
				t.Fatalf("delta client sent %v again: the same bytes are no change", deltaNames(dr))
			}
			removed = slices.Equal(dr.GetRemovedResources(), []string{"b"})
		}
		resp = sotw.recv()
		if got := len(resp.GetResources()); got != 1 {
			t.Fatalf("SotW EDS after the change: %d resources, want 1 (a, changed)", got)
		}
		delta.quiet(100 * time.Millisecond)
		if d == testcp.DialectDelta {
			return // delta removes b by name
		}
		// Left out of a SotW EDS response, b is not removed: a client
		// that asks for it now is sent the copy the relay holds.
		late := openDelta(t, r.Addr())
		late.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n3", "c1"), TypeUrl: resourcev3.EndpointType,
			ResourceNamesSubscribe: []string{"b"}})
		if got := deltaNames(late.recv()); !slices.Equal(got, []string{"b"}) {
			t.Fatalf("b after a SotW response without it: %v, want [b]", got)
		}
	})
}

// A name that never arrives on a live SotW stream is judged by the
// does-not-exist timer; a SotW control plane's silence about an EDS name
// is not taken for a removal before then.
func TestDialectNotFoundByTimer(t *testing.T) {
	forEachDialect(t, func(t *testing.T, d testcp.Dialect) {
		cp := testcp.StartDialect(t, d)
		cp.Set(t, "c1", "1", testcp.Endpoints("a", "10.0.0.1:80"))
		r := startRelay(t, cp.Addr, func(c *Config) { c.Cache.NotFoundTimeout = 300 * time.Millisecond })

		s := openDelta(t, r.Addr())
		s.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n1", "c1"), TypeUrl: resourcev3.EndpointType,
			ResourceNamesSubscribe: []string{"a", "missing"}})
		got := map[string]bool{}
		var notFound bool
		for !got["a"] || !notFound {
			resp := s.recv()
			for _, n := range deltaNames(resp) {
				got[n] = true
			}
			for _, e := range resp.GetResourceErrors() {
				if e.GetResourceName().GetName() == "missing" && e.GetErrorDetail().GetCode() == 5 {
					notFound = true
				}
			}
		}
	})
}

// The group's upstream node goes on the first request of every stream:
// each per-type stream carries it.
func TestDialectNodeOnEveryStream(t *testing.T) {
	cp := testcp.StartDialect(t, testcp.DialectPerType)
	cp.Set(t, "c1", "1", testcp.Cluster("a"), testcp.Endpoints("a", "10.0.0.1:80"))
	r := startRelay(t, cp.Addr)

	s := openDelta(t, r.Addr())
	s.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n1", "c1"), TypeUrl: resourcev3.ClusterType,
		ResourceNamesSubscribe: []string{"a"}})
	s.recv()
	s.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: []string{"a"}})
	s.recv()
	withNode := map[string]bool{}
	for _, req := range cp.SotWRequests() {
		if req.GetNode().GetCluster() == "c1" {
			withNode[req.GetTypeUrl()] = true
		}
	}
	if !withNode[resourcev3.ClusterType] || !withNode[resourcev3.EndpointType] {
		t.Fatalf("the node went on the first request of the streams of %v, want CDS and EDS", withNode)
	}
}

// An explicit upstream.protocol that the server refuses is not retried in
// another: the group's upstream says UNIMPLEMENTED, and nothing is served.
func TestDialectExplicitProtocolRefused(t *testing.T) {
	cp := testcp.StartDialect(t, testcp.DialectSotW)
	cp.Set(t, "c1", "1", testcp.Endpoints("a", "10.0.0.1:80"))
	r := startRelay(t, cp.Addr, func(c *Config) { c.Upstream.Protocol = "delta" })

	s := openDelta(t, r.Addr())
	s.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n1", "c1"), TypeUrl: resourcev3.EndpointType,
		ResourceNamesSubscribe: []string{"a"}})
	eventually(t, "the group's upstream error to say Unimplemented", func() bool {
		var groups []debugGroup
		getJSON(t, r, "/debug/groups", &groups)
		return len(groups) == 1 && strings.Contains(groups[0].LastError, "Unimplemented")
	})
	if cp.SotWStreams.Load() != 0 {
		t.Fatalf("%d SotW streams opened with upstream.protocol: delta", cp.SotWStreams.Load())
	}
}

// A tier: a relay whose upstream is another relay told upstream.protocol:
// sotw, over the upper relay's SotW ADS.
func TestDialectSotWTier(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("a"), testcp.Endpoints("a", "10.0.0.1:80"))
	upper := startRelay(t, cp.Addr)
	lower := startRelay(t, upper.Addr(), func(c *Config) { c.Upstream.Protocol = "sotw" })

	s := openDelta(t, lower.Addr())
	s.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n1", "c1"), TypeUrl: resourcev3.ClusterType,
		ResourceNamesSubscribe: []string{"*"}})
	if got := collectDelta(s, 1); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("through a SotW tier: %v, want [a]", got)
	}
	cp.Set(t, "c1", "2", testcp.Cluster("b"), testcp.Endpoints("b", "10.0.0.1:80"))
	var sawB, removedA bool
	for !sawB || !removedA {
		resp := s.recv()
		sawB = sawB || slices.Contains(deltaNames(resp), "b")
		removedA = removedA || slices.Contains(resp.GetRemovedResources(), "a")
	}
	if got := upstreamProtocol(t, lower); got != "sotw" {
		t.Fatalf("lower tier speaks %q, want sotw", got)
	}
}

// A full-state response that leaves out every Cluster is a removal like
// any other: the guard holds it, whatever the dialect, and no client sees
// it; the hold ends when the Clusters come back.
func TestDialectGuardHoldsClustersLeftOut(t *testing.T) {
	forEachDialect(t, func(t *testing.T, d testcp.Dialect) {
		cp := testcp.StartDialect(t, d)
		var rs []types.Resource
		for i := range 20 {
			rs = append(rs, testcp.Cluster(fmt.Sprintf("c%02d", i)))
		}
		cp.Set(t, "c1", "1", rs...)
		r := startRelay(t, cp.Addr, func(c *Config) { c.Guard.MinResources = 10 })
		s := openDelta(t, r.Addr())
		s.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n1", "c1"), TypeUrl: resourcev3.ClusterType,
			ResourceNamesSubscribe: []string{"*"}})
		collectDelta(s, 20)

		cp.Set(t, "c1", "2") // every Cluster left out
		eventually(t, "the guard to hold the removal", func() bool {
			return strings.Contains(getMetrics(t, r), `xdsrelay_guard_holds_total{type="Cluster"} 1`)
		})
		s.quiet(200 * time.Millisecond)
		cp.Set(t, "c1", "3", rs...)
		eventually(t, "the hold to end as the Clusters come back", func() bool {
			return len(r.groupCache(keyOf("c1")).Holds()) == 0
		})
		s.quiet(100 * time.Millisecond) // the same bytes again: nothing to send
	})
}

// Absence removes only what the relay holds: a Cluster asked by name that
// a full-state response leaves out, never having been received, is not
// removed by that response (it may predate the request that named it); the
// does-not-exist timer decides it, on a live stream.
func TestDialectAbsenceRemovesOnlyWhatIsHeld(t *testing.T) {
	for _, d := range testcp.Dialects[1:] { // absence means nothing in delta
		t.Run(string(d), func(t *testing.T) {
			cp := testcp.StartDialect(t, d)
			cp.Set(t, "c1", "1", testcp.Cluster("a"))
			r := startRelay(t, cp.Addr, func(c *Config) { c.Cache.NotFoundTimeout = time.Minute })
			s := openDelta(t, r.Addr())
			s.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n1", "c1"), TypeUrl: resourcev3.ClusterType,
				ResourceNamesSubscribe: []string{"a", "ghost"}})
			if got := deltaNames(s.recv()); !slices.Equal(got, []string{"a"}) {
				t.Fatalf("first response %v, want [a]", got)
			}
			s.quiet(300 * time.Millisecond) // no removal of ghost, no NOT_FOUND
			if l := r.groupCache(keyOf("c1")).Get(resourcev3.ClusterType, []string{"ghost"})[0]; l.Absent || l.Error != nil {
				t.Fatalf("ghost taken not to exist by absence: %+v", l)
			}
		})
	}
}

// One group, a client naming Cluster x, then an Envoy under the wildcard:
// over SotW the relay cannot ask for the wildcard in the legacy form on the
// stream that named x ("How the client specifies what resources to
// return"), and go-control-plane answers "*" beside x with x alone; the
// stream is opened again once, and the wildcard client gets every Cluster.
func TestDialectWildcardAfterNames(t *testing.T) {
	for _, d := range []testcp.Dialect{testcp.DialectSotW, testcp.DialectPerType} {
		t.Run(string(d), func(t *testing.T) {
			cp := testcp.StartDialect(t, d)
			cp.Set(t, "c1", "1", testcp.Cluster("a"), testcp.Cluster("b"), testcp.Cluster("x"))
			r := startRelay(t, cp.Addr)

			named := openDelta(t, r.Addr())
			named.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n1", "c1"), TypeUrl: resourcev3.ClusterType,
				ResourceNamesSubscribe: []string{"x"}})
			if got := collectDelta(named, 1); !slices.Equal(got, []string{"x"}) {
				t.Fatalf("named CDS: %v, want [x]", got)
			}
			wild := openDelta(t, r.Addr())
			wild.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n2", "c1"), TypeUrl: resourcev3.ClusterType,
				ResourceNamesSubscribe: []string{"*"}})
			if got := collectDelta(wild, 3); !slices.Equal(got, []string{"a", "b", "x"}) {
				t.Fatalf("wildcard CDS: %v, want [a b x]", got)
			}
			var reopens float64
			for _, m := range scrape(t, r)["xdsrelay_upstream_sotw_wildcard_reopens_total"].GetMetric() {
				reopens += counterValue(m)
			}
			if reopens != 1 {
				t.Errorf("xdsrelay_upstream_sotw_wildcard_reopens_total is %v, want 1", reopens)
			}
		})
	}
}
