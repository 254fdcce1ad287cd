package upstream

import (
	"slices"
	"testing"
	"time"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/metrics"
	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// The legacy wildcard ("How the client specifies what resources to
// return"): the first request names nothing, subscribes and unsubscribes
// nothing, and carries the versions of what only the wildcard holds; every
// name follows, once, without its version.
func TestSplitLegacyWildcard(t *testing.T) {
	for _, tc := range []struct {
		name      string
		subscribe []string
		versions  map[string]string
		max       int
		// what the first request carries as versions, and how many
		// requests there are
		firstVersions []string
		reqs          int
	}{
		{name: "alone", subscribe: []string{"*"}, reqs: 1},
		{name: "alone, resumed", subscribe: []string{"*"}, versions: map[string]string{"a": "1", "b": "2"},
			firstVersions: []string{"a", "b"}, reqs: 1},
		{name: "beside names", subscribe: []string{"*", "x", "y"}, reqs: 2},
		{name: "beside names, resumed", subscribe: []string{"*", "x", "y"},
			versions: map[string]string{"a": "1", "x": "2"}, firstVersions: []string{"a"}, reqs: 2},
		{name: "beside names, cut", subscribe: []string{"*", "x0000000000", "x0000000001", "x0000000002"},
			max: 80, reqs: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			max := tc.max
			if max == 0 {
				max = DefaultMaxRequestBytes
			}
			reqs, skipped := split(change{typeURL: resourcev3.ClusterType, subscribe: tc.subscribe, versions: tc.versions, legacy: true}, max)
			if len(skipped) > 0 || len(reqs) != tc.reqs {
				t.Fatalf("%d requests, %d skipped: %v; want %d requests", len(reqs), len(skipped), reqs, tc.reqs)
			}
			first := reqs[0]
			if len(first.GetResourceNamesSubscribe()) > 0 || len(first.GetResourceNamesUnsubscribe()) > 0 {
				t.Errorf("the first request names %v: want none", first)
			}
			var got []string
			for n := range first.GetInitialResourceVersions() {
				got = append(got, n)
			}
			if slices.Sort(got); !slices.Equal(got, tc.firstVersions) {
				t.Errorf("the first request carries the versions of %v, want %v", got, tc.firstVersions)
			}
			var names []string
			for _, r := range reqs[1:] {
				if len(r.GetInitialResourceVersions()) > 0 {
					t.Errorf("a later request carries versions: %v", r)
				}
				names = append(names, r.GetResourceNamesSubscribe()...)
			}
			if !slices.Equal(names, tc.subscribe[1:]) {
				t.Errorf("the later requests subscribe %v, want %v", names, tc.subscribe[1:])
			}
		})
	}
}

// cdsRequests is every delta CDS request cp read.
func cdsRequests(cp *testcp.ControlPlane) []*discoverypb.DeltaDiscoveryRequest {
	var out []*discoverypb.DeltaDiscoveryRequest
	for _, r := range cp.Requests() {
		if r.GetTypeUrl() == resourcev3.ClusterType {
			out = append(out, r)
		}
	}
	return out
}

// legacyFirst fails the test unless reqs, a stream's CDS requests, begin
// with the legacy wildcard and never send "*".
func legacyFirst(t *testing.T, reqs []*discoverypb.DeltaDiscoveryRequest) {
	t.Helper()
	if len(reqs) == 0 || len(reqs[0].GetResourceNamesSubscribe()) > 0 || reqs[0].GetNode() == nil {
		t.Fatalf("CDS requests %v: want the first, with the node, naming nothing", reqs)
	}
	for _, r := range reqs {
		if slices.Contains(r.GetResourceNamesSubscribe(), "*") {
			t.Errorf("a CDS request subscribes \"*\": %v", r)
		}
	}
}

// On delta the wildcard of a type's first request on a stream goes in the
// legacy form, as a server that knows no "*" (go-control-plane v0.10)
// needs it, the names wanted beside it in the next request; a server that
// knows "*" (the one here) serves it the same. A new stream resumes so:
// the versions of what only the wildcard holds in its first request, the
// name's in none.
func TestDeltaLegacyWildcard(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("a"), testcp.Cluster("b"), testcp.Cluster("x"))
	c := cache.New(cache.Options{Retention: time.Minute})
	c.WatchWildcard(cache.NewWatch(), resourcev3.ClusterType)
	if err := c.Watch(cache.NewWatch(), resourcev3.ClusterType, "x"); err != nil {
		t.Fatal(err)
	}
	m := NewMetrics(&metrics.Registry{})
	runSotW(t, dialTest(t, cp.Addr), Options{Cache: c, Metrics: m, Protocol: ProtocolDelta})
	eventually(t, "every Cluster held", func() bool { return held(c, resourcev3.ClusterType, "a", "b", "x") })
	reqs := cdsRequests(cp)
	legacyFirst(t, reqs)
	if len(reqs) < 2 || !slices.Equal(reqs[1].GetResourceNamesSubscribe(), []string{"x"}) {
		t.Fatalf("CDS requests %v: want x subscribed in the second", reqs)
	}

	before := len(reqs)
	cp.Stop()
	cp.Restart()
	eventually(t, "a new stream's CDS requests", func() bool { return len(cdsRequests(cp)) >= before+2 })
	resumed := cdsRequests(cp)[before:]
	legacyFirst(t, resumed)
	if v := resumed[0].GetInitialResourceVersions(); len(v) != 2 || v["a"] == "" || v["b"] == "" {
		t.Errorf("the resumed wildcard carries versions %v, want a's and b's (x is asked by name, after)", v)
	}
	if n := m.DeltaWildcardReopens.With("Cluster").Get(); n != 0 {
		t.Errorf("%d delta streams opened again for the wildcard, want none", n)
	}
}

// The wildcard coming to a type the delta stream asked for by name first
// cannot be asked in the legacy form on that stream: the stream is opened
// again once, counted, and its first CDS request is the legacy wildcard.
// The wildcard leaving and coming back to a stream whose first request
// was the legacy wildcard is "*", on the same stream.
func TestDeltaWildcardAfterNames(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("a"), testcp.Cluster("b"), testcp.Cluster("x"))
	c := cache.New(cache.Options{Retention: time.Millisecond})
	if err := c.Watch(cache.NewWatch(), resourcev3.ClusterType, "x"); err != nil {
		t.Fatal(err)
	}
	m := NewMetrics(&metrics.Registry{})
	runSotW(t, dialTest(t, cp.Addr), Options{Cache: c, Metrics: m, Protocol: ProtocolDelta})
	eventually(t, "x held", func() bool { return held(c, resourcev3.ClusterType, "x") })
	before := len(cdsRequests(cp))

	wild := cache.NewWatch()
	c.WatchWildcard(wild, resourcev3.ClusterType)
	eventually(t, "every Cluster held", func() bool { return held(c, resourcev3.ClusterType, "a", "b", "x") })
	if n := m.DeltaWildcardReopens.With("Cluster").Get(); n != 1 {
		t.Errorf("%d delta streams opened again for the wildcard, want 1", n)
	}
	if n := cp.DeltaStreams.Load(); n != 2 {
		t.Errorf("the control plane saw %d delta streams, want 2", n)
	}
	legacyFirst(t, cdsRequests(cp)[before:])

	// Away and back: "*" on the same stream.
	c.UnwatchWildcard(wild, resourcev3.ClusterType)
	asked := func(unsubscribe bool) func() bool {
		return func() bool {
			return slices.ContainsFunc(cdsRequests(cp), func(r *discoverypb.DeltaDiscoveryRequest) bool {
				if unsubscribe {
					return slices.Equal(r.GetResourceNamesUnsubscribe(), []string{"*"})
				}
				return slices.Equal(r.GetResourceNamesSubscribe(), []string{"*"})
			})
		}
	}
	eventually(t, "the wildcard unsubscribed", func() bool { c.Sweep(); return asked(true)() })
	c.WatchWildcard(cache.NewWatch(), resourcev3.ClusterType)
	eventually(t, "the wildcard subscribed again", asked(false))
	if n := m.DeltaWildcardReopens.With("Cluster").Get(); n != 1 {
		t.Errorf("%d delta streams opened again for the wildcard, want still 1", n)
	}
}
