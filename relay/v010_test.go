package relay

import (
	"slices"
	"strings"
	"testing"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/xdsrelay/xdsrelay/internal/realcp"
	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// deltaCDS is how v0.10.3 printed each delta CDS request it read, in
// order: "subscribe=... unsubscribe=... versions=N".
func deltaCDS(cp *realcp.Server) []string {
	var out []string
	for _, e := range cp.Events() {
		if rest, ok := strings.CutPrefix(e, "delta "+resourcev3.ClusterType+" "); ok {
			out = append(out, rest)
		}
	}
	return out
}

// The relay's delta wildcard in front of go-control-plane v0.10.3's own,
// unmodified server (internal/realcp), whose delta server knows the
// wildcard only in the legacy form: a type's first request on a stream
// with no names ("How the client specifies what resources to return"),
// "*" being a name to it like any other. A wildcard CDS client, alone and
// beside a name in the same request, gets every Cluster of the server,
// with upstream.protocol delta and auto; the first CDS request the server
// reads is the legacy form, the names come after it.
func TestV010DeltaWildcard(t *testing.T) {
	cp := realcp.StartV010(t)
	cp.Set(t, "c1", "1", testcp.Cluster("a"), testcp.Cluster("b"), testcp.Cluster("x"),
		testcp.Route("r", "x"))
	all := []string{"a", "b", "x"}
	for _, protocol := range []string{"delta", "auto"} {
		for _, tc := range []struct {
			name string
			// ask sends the client's first requests.
			ask func(t *testing.T, d *deltaStream, n string)
		}{
			{"alone", func(t *testing.T, d *deltaStream, n string) {
				d.send(&discoverypb.DeltaDiscoveryRequest{Node: node(n, "c1"), TypeUrl: resourcev3.ClusterType,
					ResourceNamesSubscribe: []string{"*"}})
			}},
			{"beside a name", func(t *testing.T, d *deltaStream, n string) {
				d.send(&discoverypb.DeltaDiscoveryRequest{Node: node(n, "c1"), TypeUrl: resourcev3.ClusterType,
					ResourceNamesSubscribe: []string{"*", "x"}})
			}},
		} {
			t.Run(protocol+"/"+tc.name, func(t *testing.T) {
				before := len(deltaCDS(cp))
				r := startRelay(t, cp.Addr, func(c *Config) { c.Upstream.Protocol = protocol })
				d := openDelta(t, r.Addr())
				tc.ask(t, d, "n1")
				seen := map[string]bool{}
				for !allSeen(seen, all) {
					resp := d.recv()
					if resp.GetTypeUrl() != resourcev3.ClusterType {
						continue
					}
					for _, name := range deltaNames(resp) {
						seen[name] = true
					}
				}
				asked := deltaCDS(cp)[before:]
				if len(asked) == 0 || !strings.HasPrefix(asked[0], "subscribe= unsubscribe= ") {
					t.Errorf("v0.10.3 read the relay's CDS requests as %q; want the first in the legacy form (no names)", asked)
				}
				for _, a := range asked {
					if strings.Contains(a, "*") {
						t.Errorf("the relay sent v0.10.3 %q: \"*\" is a name to it", a)
					}
				}
			})
		}
	}
}

// The wildcard after names, in front of v0.10.3: Cluster x is asked by
// name first, by a client that names it (as gRPC does) or by the relay
// itself, for the Route a client watches (make before break); then a
// client asks for the wildcard (as Envoy does). On the delta stream that
// named x, "*" would be a name to v0.10.3, never answered; the relay opens
// the stream again once, counted, and asks in the legacy form there. The
// wildcard client gets every Cluster.
func TestV010DeltaWildcardAfterNames(t *testing.T) {
	cp := realcp.StartV010(t)
	cp.Set(t, "c1", "1", testcp.Cluster("a"), testcp.Cluster("b"), testcp.Cluster("x"), testcp.Route("r", "x"))
	for _, tc := range []struct {
		name  string
		first func(t *testing.T, d *deltaStream)
	}{
		{"a client's name", func(t *testing.T, d *deltaStream) {
			d.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n1", "c1"), TypeUrl: resourcev3.ClusterType,
				ResourceNamesSubscribe: []string{"x"}})
			if got := collectDelta(d, 1); !slices.Equal(got, []string{"x"}) {
				t.Fatalf("named CDS: %v, want [x]", got)
			}
		}},
		{"a route's cluster", func(t *testing.T, d *deltaStream) {
			d.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n1", "c1"), TypeUrl: resourcev3.RouteType,
				ResourceNamesSubscribe: []string{"r"}})
			if got := collectDelta(d, 1); !slices.Equal(got, []string{"r"}) {
				t.Fatalf("RDS: %v, want [r]", got)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			streams := cp.Count("open /envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources")
			asked := len(deltaCDS(cp))
			r := startRelay(t, cp.Addr, func(c *Config) { c.Upstream.Protocol = "delta" })
			tc.first(t, openDelta(t, r.Addr()))
			if got := deltaCDS(cp)[asked:]; len(got) == 0 || !strings.HasPrefix(got[0], "subscribe=x ") {
				t.Fatalf("v0.10.3 read the relay's CDS requests as %q; want x asked by name first", got)
			}

			wild := openDelta(t, r.Addr())
			wild.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n2", "c1"), TypeUrl: resourcev3.ClusterType,
				ResourceNamesSubscribe: []string{"*"}})
			if got := collectDelta(wild, 3); !slices.Equal(got, []string{"a", "b", "x"}) {
				t.Fatalf("wildcard CDS: %v, want [a b x]", got)
			}
			var reopens float64
			for _, m := range scrape(t, r)["xdsrelay_upstream_delta_wildcard_reopens_total"].GetMetric() {
				reopens += counterValue(m)
			}
			if reopens != 1 {
				t.Errorf("xdsrelay_upstream_delta_wildcard_reopens_total is %v, want 1", reopens)
			}
			if n := cp.Count("open /envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources") - streams; n != 2 {
				t.Errorf("v0.10.3 saw %d delta streams of the relay, want 2", n)
			}
			for _, a := range deltaCDS(cp)[asked:] {
				if strings.Contains(a, "*") {
					t.Errorf("the relay sent v0.10.3 %q: \"*\" is a name to it", a)
				}
			}
		})
	}
}

func allSeen(seen map[string]bool, want []string) bool {
	return !slices.ContainsFunc(want, func(n string) bool { return !seen[n] })
}
