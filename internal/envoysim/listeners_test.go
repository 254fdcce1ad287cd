package envoysim

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	clusterpb "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerpb "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	hcmpb "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// The variants a go-control-plane snapshot server serves: ADS (SotW and
// delta), and the per-type SotW services.
var listenerVariants = []struct {
	name           string
	delta, perType bool
	dialect        testcp.Dialect
}{
	{"sotw-ads", false, false, testcp.DialectDelta},
	{"delta-ads", true, false, testcp.DialectDelta},
	{"sotw-per-type", false, true, testcp.DialectPerType},
}

// startListeners starts a client that subscribes Listeners too on cp,
// closed when the test ends.
func startListeners(t *testing.T, cp *testcp.ControlPlane, delta, perType bool) *Client {
	t.Helper()
	sim, err := Start(context.Background(), Options{Conn: dial(t, cp.Addr), Node: node(), Delta: delta, PerType: perType, Listeners: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	return sim
}

// waitState waits, bounded, until cond holds of sim's state.
func waitState(t *testing.T, sim *Client, what string, cond func(State) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := sim.WaitState(ctx, cond); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// serving reports that listener l serves, its newest version warmed, on
// routes, each held and pointing at the cluster of the same index.
func serving(l string, routes []string, clusters ...string) func(State) bool {
	return func(s State) bool {
		li, ok := s.Listeners[l]
		if !ok || !li.Serving || li.Warming || !slices.Equal(li.Routes, routes) {
			return false
		}
		for i, r := range routes {
			if rt, ok := s.Routes[r]; !ok || !slices.Equal(rt.Clusters, clusters[i:i+1]) {
				return false
			}
		}
		return true
	}
}

// rdsNames are the RDS names the control plane was last asked for: the
// whole list on SotW, the sum of the changes on delta.
func rdsNames(cp *testcp.ControlPlane, delta bool) []string {
	set := map[string]bool{}
	if delta {
		for _, r := range cp.Requests() {
			if r.GetTypeUrl() == resourcev3.RouteType {
				for _, n := range r.GetResourceNamesSubscribe() {
					set[n] = true
				}
				for _, n := range r.GetResourceNamesUnsubscribe() {
					delete(set, n)
				}
			}
		}
	} else {
		var last *discoverypb.DiscoveryRequest
		for _, r := range cp.SotWRequests() {
			if r.GetTypeUrl() == resourcev3.RouteType {
				last = r
			}
		}
		for _, n := range last.GetResourceNames() {
			set[n] = true
		}
	}
	var out []string
	for n := range set {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// A Listener is served once the Route it loads by RDS is held; a Route is
// applied as it arrives, so a control plane that points it at a Cluster
// the client lacks makes a dangling route, which the client records and
// which ends when the Cluster warms. A new Listener whose Route does not
// come warms; a changed one warms while its former version serves, and the
// Route only the former loaded is unsubscribed once the new one serves.
func TestListenersWarmUntilTheirRoutes(t *testing.T) {
	for _, v := range listenerVariants {
		t.Run(v.name, func(t *testing.T) {
			cp := testcp.StartDialect(t, v.dialect)
			cp.Set(t, "c1", "1", testcp.Listener("l", "r"), testcp.Route("r", "x"), testcp.Cluster("x"), testcp.Endpoints("x", "127.0.0.1:1"))
			sim := startListeners(t, cp, v.delta, v.perType)
			waitState(t, sim, "l serving on r to x", serving("l", []string{"r"}, "x"))
			if d, n := sim.DanglingSeen(); n != 0 {
				t.Fatalf("dangling %v in a consistent snapshot", d)
			}
			if got := rdsNames(cp, v.delta); !slices.Equal(got, []string{"r"}) {
				t.Fatalf("RDS subscription %v, want [r]", got)
			}

			// The route moves to y before y exists: it applies at once.
			cp.Set(t, "c1", "2", testcp.Listener("l", "r"), testcp.Route("r", "y"), testcp.Cluster("x"), testcp.Endpoints("x", "127.0.0.1:1"))
			waitState(t, sim, "r to y", serving("l", []string{"r"}, "y"))
			if d := sim.Dangling(); len(d) != 1 || d[0].Listener != "l" || d[0].Route != "r" || d[0].Cluster != "y" {
				t.Fatalf("dangling %v, want l/r->y", d)
			}
			cp.Set(t, "c1", "3", testcp.Listener("l", "r"), testcp.Route("r", "y"), testcp.Cluster("y"), testcp.Endpoints("y", "127.0.0.1:2"))
			waitState(t, sim, "y usable", func(s State) bool { return Usable("y")(s.Clusters) })
			if d := sim.Dangling(); len(d) != 0 {
				t.Fatalf("still dangling %v with y usable", d)
			}
			if seen, n := sim.DanglingSeen(); n != 1 || seen[0].Cluster != "y" {
				t.Fatalf("seen %v (%d), want the one to y", seen, n)
			}

			// A new listener whose route the control plane lacks warms; the
			// one serving is untouched.
			set := func(version string, rs ...types.Resource) {
				t.Helper()
				cp.Set(t, "c1", version, append(rs, testcp.Route("r", "y"), testcp.Cluster("y"), testcp.Endpoints("y", "127.0.0.1:2"))...)
			}
			set("4", testcp.Listener("l", "r"), testcp.Listener("m", "s"))
			waitState(t, sim, "m warming", func(s State) bool { return s.Listeners["m"].Warming })
			if m := sim.State().Listeners["m"]; m.Serving {
				t.Fatalf("m serves without its route: %+v", m)
			}
			set("5", testcp.Listener("l", "r"), testcp.Listener("m", "s"), testcp.Route("s", "y"))
			waitState(t, sim, "m serving on s", serving("m", []string{"s"}, "y"))

			// l changes to a route not there yet: its former version
			// serves meanwhile, then r is no longer asked for.
			set("6", testcp.Listener("l", "t"), testcp.Listener("m", "s"), testcp.Route("s", "y"))
			waitState(t, sim, "l warming on t", func(s State) bool { l := s.Listeners["l"]; return l.Warming && l.Serving })
			set("7", testcp.Listener("l", "t"), testcp.Listener("m", "s"), testcp.Route("s", "y"), testcp.Route("t", "y"))
			waitState(t, sim, "l serving on t", serving("l", []string{"t"}, "y"))
			if _, held := sim.State().Routes["r"]; held {
				t.Error("r is held with no listener loading it")
			}
			eventually(t, "the RDS subscription to be [s t]", func() bool { return slices.Equal(rdsNames(cp, v.delta), []string{"s", "t"}) })
			if _, n := sim.DanglingSeen(); n != 1 {
				t.Errorf("%d dangling references seen, want the one", n)
			}
		})
	}
}

// eventually polls cond until it holds, failing the test after wait.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", wait, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// inlineListener is a filter-chain listener whose HttpConnectionManager
// routes everything to cluster inline.
func inlineListener(name, cluster string) *listenerpb.Listener {
	hcm, _ := anypb.New(&hcmpb.HttpConnectionManager{
		StatPrefix:     name,
		RouteSpecifier: &hcmpb.HttpConnectionManager_RouteConfig{RouteConfig: testcp.Route(name, cluster)},
	})
	return &listenerpb.Listener{Name: name,
		Address: &corepb.Address{Address: &corepb.Address_SocketAddress{SocketAddress: &corepb.SocketAddress{
			Address: "0.0.0.0", PortSpecifier: &corepb.SocketAddress_PortValue{PortValue: 8080}}}},
		FilterChains: []*listenerpb.FilterChain{{Filters: []*listenerpb.Filter{{
			Name: "envoy.filters.network.http_connection_manager", ConfigType: &listenerpb.Filter_TypedConfig{TypedConfig: hcm}}}}}}
}

// A Listener with its routes inline needs no RDS and serves at once; a
// Cluster it names that the control plane removes is gone at once, and
// the route dangles until it comes back and warms.
func TestInlineRoutesNeedNoRDS(t *testing.T) {
	for _, v := range listenerVariants {
		t.Run(v.name, func(t *testing.T) {
			cp := testcp.StartDialect(t, v.dialect)
			cp.Set(t, "c1", "1", inlineListener("l", "z"), testcp.Cluster("z"), testcp.Endpoints("z", "127.0.0.1:1"))
			sim := startListeners(t, cp, v.delta, v.perType)
			waitState(t, sim, "l serving to z", func(s State) bool {
				l := s.Listeners["l"]
				return l.Serving && slices.Equal(l.Inline, []string{"z"})
			})
			cp.Set(t, "c1", "2", inlineListener("l", "z"))
			waitState(t, sim, "z removed", func(s State) bool { _, ok := s.Clusters["z"]; return !ok })
			if d := sim.Dangling(); len(d) != 1 || d[0].Route != "" || d[0].Cluster != "z" {
				t.Fatalf("dangling %v, want l/(inline)->z", d)
			}
			cp.Set(t, "c1", "3", inlineListener("l", "z"), testcp.Cluster("z"), testcp.Endpoints("z", "127.0.0.1:1"))
			waitState(t, sim, "z usable", func(s State) bool { return Usable("z")(s.Clusters) })
			if d := sim.Dangling(); len(d) != 0 {
				t.Fatalf("still dangling %v", d)
			}
			if _, n := sim.DanglingSeen(); n != 1 {
				t.Errorf("%d dangling references seen, want 1", n)
			}
			for _, r := range cp.SotWRequests() {
				if r.GetTypeUrl() == resourcev3.RouteType {
					t.Fatalf("RDS request %v for inline routes", r)
				}
			}
			for _, r := range cp.Requests() {
				if r.GetTypeUrl() == resourcev3.RouteType {
					t.Fatalf("RDS request %v for inline routes", r)
				}
			}
		})
	}
}

// A changed Cluster warms while its former version serves: a route to it
// does not dangle. A new one that warms does not serve: a route to it
// dangles. (Each warms on a ClusterLoadAssignment the control plane does
// not have, so that it stays warming.)
func TestChangedClusterServesWhileItWarms(t *testing.T) {
	warmsForever := func(name string) *clusterpb.Cluster {
		cl := testcp.Cluster(name)
		cl.EdsClusterConfig.ServiceName = name + "-never"
		return cl
	}
	for _, v := range listenerVariants {
		t.Run(v.name, func(t *testing.T) {
			cp := testcp.StartDialect(t, v.dialect)
			cp.Set(t, "c1", "1", testcp.Listener("l", "r"), testcp.Route("r", "x"), testcp.Cluster("x"), testcp.Endpoints("x", "127.0.0.1:1"))
			sim := startListeners(t, cp, v.delta, v.perType)
			waitState(t, sim, "l serving on r to x", serving("l", []string{"r"}, "x"))

			cp.Set(t, "c1", "2", testcp.Listener("l", "r"), testcp.Route("r", "x"), warmsForever("x"), testcp.Endpoints("x", "127.0.0.1:1"))
			waitState(t, sim, "x changed", func(s State) bool { return s.Clusters["x"].EDS == "x-never" })
			if !sim.Clusters()["x"].Warming {
				t.Fatal("the changed cluster did not warm")
			}
			if seen, n := sim.DanglingSeen(); n != 0 {
				t.Fatalf("a route to a changed cluster, its former version serving, dangled: %v", seen)
			}

			cp.Set(t, "c1", "3", testcp.Listener("l", "r"), testcp.Route("r", "w"), warmsForever("x"), testcp.Endpoints("x", "127.0.0.1:1"), warmsForever("w"))
			waitState(t, sim, "r to w, w held", func(s State) bool {
				_, w := s.Clusters["w"]
				return w && slices.Equal(s.Routes["r"].Clusters, []string{"w"})
			})
			if d := sim.Dangling(); len(d) != 1 || d[0].Cluster != "w" {
				t.Fatalf("dangling %v, want l/r->w, w warming", d)
			}
		})
	}
}

// DanglingSeen keeps the first maxSeen references that began, and counts
// them all: a fleet-sized control plane that leaves every route dangling
// does not grow the client without bound.
func TestDanglingSeenIsBounded(t *testing.T) {
	c := &Client{clusters: map[string]*clusterState{}, listeners: map[string]*listenerState{}, routes: map[string]*Route{},
		changed: make(chan struct{})}
	const n = maxSeen + 100
	for i := range n {
		name := fmt.Sprintf("l%05d", i)
		c.listeners[name] = &listenerState{serving: &listenerVersion{inline: []string{"absent-" + name}}}
	}
	c.mu.Lock()
	c.changedLocked(time.Now())
	c.changedLocked(time.Now()) // the same references: none begins again
	c.mu.Unlock()
	if d := c.Dangling(); len(d) != n {
		t.Fatalf("%d dangling now, want %d", len(d), n)
	}
	seen, total := c.DanglingSeen()
	if len(seen) != maxSeen || total != n {
		t.Fatalf("seen %d of %d, want %d of %d", len(seen), total, maxSeen, n)
	}
	if seen[0].Listener != "l00000" || seen[maxSeen-1].Listener != fmt.Sprintf("l%05d", maxSeen-1) {
		t.Errorf("seen runs %s..%s, want the first %d in order", seen[0].Listener, seen[maxSeen-1].Listener, maxSeen)
	}
}
