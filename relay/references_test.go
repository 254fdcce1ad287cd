package relay

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	listenerpb "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routepb "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerpb "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmpb "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	routesvc "github.com/envoyproxy/go-control-plane/envoy/service/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// recvAck receives a delta response and ACKs it.
func recvAck(t *testing.T, s *deltaStream, bound time.Duration) *discoverypb.DeltaDiscoveryResponse {
	t.Helper()
	resp := s.recvWithin(bound)
	s.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()})
	return resp
}

// routeClusters are the clusters a response's route r points at; nil if
// it carries no r.
func routeClusters(t *testing.T, resp *discoverypb.DeltaDiscoveryResponse, name string) []string {
	t.Helper()
	for _, res := range resp.GetResources() {
		if res.GetName() != name {
			continue
		}
		rc := &routepb.RouteConfiguration{}
		if err := res.GetResource().UnmarshalTo(rc); err != nil {
			t.Fatal(err)
		}
		a := rc.GetVirtualHosts()[0].GetRoutes()[0].GetRoute()
		if a.GetCluster() != "" {
			return []string{a.GetCluster()}
		}
		var out []string
		for _, wc := range a.GetWeightedClusters().GetClusters() {
			out = append(out, wc.GetName())
		}
		return out
	}
	return nil
}

// weightedRoute splits everything between clusters.
func weightedRoute(name string, clusters ...string) *routepb.RouteConfiguration {
	rc := testcp.Route(name, "")
	var wcs []*routepb.WeightedCluster_ClusterWeight
	for _, c := range clusters {
		wcs = append(wcs, &routepb.WeightedCluster_ClusterWeight{Name: c})
	}
	rc.VirtualHosts[0].Routes[0].GetRoute().ClusterSpecifier = &routepb.RouteAction_WeightedClusters{
		WeightedClusters: &routepb.WeightedCluster{Clusters: wcs}}
	return rc
}

func referenceWaits(t *testing.T, r *Relay, typeURL, outcome string) float64 {
	t.Helper()
	return value(scrape(t, r), "xdsrelay_reference_waits_total", map[string]string{"type": xds.ShortName(typeURL), "outcome": outcome})
}

// wantReferenceWaits waits (bounded) for the reference waits of typeURL
// that ended with outcome to count want: the count moves once the cache's
// locks are released, which may be after a client has what the wait
// released.
func wantReferenceWaits(t *testing.T, r *Relay, typeURL, outcome string, want float64) {
	t.Helper()
	var n float64
	eventually(t, fmt.Sprintf("xdsrelay_reference_waits_total{type=%s,outcome=%s} to reach %v", xds.ShortName(typeURL), outcome, want), func() bool {
		n = referenceWaits(t, r, typeURL, outcome)
		return n >= want
	})
	if n != want {
		t.Errorf("xdsrelay_reference_waits_total{type=%s,outcome=%s} = %v, want %v", xds.ShortName(typeURL), outcome, n, want)
	}
}

// The control plane names Cluster y in a Route before it has y: a client
// of the Route never holds it before y is cached (the relay fetches y as
// what the Route points at), and gets it once y comes, y cached by then.
func TestRouteWaitsForItsCluster(t *testing.T) {
	forEachDialect(t, testRouteWaitsForItsCluster)
}

func testRouteWaitsForItsCluster(t *testing.T, d testcp.Dialect) {
	cp := testcp.StartDialect(t, d)
	cp.Set(t, "c1", "1", testcp.Route("r", "x"), testcp.Cluster("x"), testcp.Endpoints("x"))
	r := startRelay(t, cp.Addr, func(c *Config) { c.Consistency.MaxWait = time.Minute })
	c := openDelta(t, r.Addr())
	c.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "c1"), TypeUrl: resourcev3.RouteType, ResourceNamesSubscribe: []string{"r"}})
	if got := routeClusters(t, recvAck(t, c, wait), "r"); !slices.Equal(got, []string{"x"}) {
		t.Fatalf("route to %v, want [x]", got)
	}

	cp.Set(t, "c1", "2", testcp.Route("r", "y"), testcp.Cluster("x"), testcp.Endpoints("x"))
	c.quiet(300 * time.Millisecond) // the route to y waits for y
	g := r.groupCache(keyOf("c1"))
	eventually(t, "the relay to fetch y, which the route points at", func() bool {
		return slices.Contains(g.Interest()[resourcev3.ClusterType].Names, "y")
	})

	cp.Set(t, "c1", "3", testcp.Route("r", "y"), testcp.Cluster("x"), testcp.Endpoints("x"), testcp.Cluster("y"), testcp.Endpoints("y"))
	if got := routeClusters(t, recvAck(t, c, wait), "r"); !slices.Equal(got, []string{"y"}) {
		t.Fatalf("route to %v, want [y]", got)
	}
	if l := g.Get(resourcev3.ClusterType, []string{"y"})[0]; l.Resource == nil {
		t.Error("the client got the route to y before y was cached")
	}
	if l := g.Get(resourcev3.EndpointType, []string{"y"})[0]; l.Resource == nil {
		t.Error("the client got the route to y before y's endpoints were cached")
	}
	// The route to x waited for x too: the relay fetched x only once it
	// read the route.
	wantReferenceWaits(t, r, resourcev3.RouteType, "resolved", 2)
}

// The control plane removes Cluster x while the Route still points at it,
// then moves the Route: the client loses x only after it has the Route
// that no longer needs it.
func TestRemovalWaitsForTheRouteToMove(t *testing.T) {
	forEachDialect(t, testRemovalWaitsForTheRouteToMove)
}

func testRemovalWaitsForTheRouteToMove(t *testing.T, d testcp.Dialect) {
	cp := testcp.StartDialect(t, d)
	cp.Set(t, "c1", "1", testcp.Route("r", "x"), testcp.Cluster("x"), testcp.Endpoints("x"), testcp.Cluster("y"), testcp.Endpoints("y"))
	r := startRelay(t, cp.Addr, func(c *Config) { c.Consistency.MaxWait = time.Minute })
	c := openDelta(t, r.Addr())
	n := node("n", "c1")
	c.send(&discoverypb.DeltaDiscoveryRequest{Node: n, TypeUrl: resourcev3.RouteType, ResourceNamesSubscribe: []string{"r"}})
	c.send(&discoverypb.DeltaDiscoveryRequest{Node: n, TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"x", "y"}})
	got := map[string]bool{}
	for len(got) < 3 {
		for _, res := range recvAck(t, c, wait).GetResources() {
			got[res.GetName()] = true
		}
	}

	cp.Set(t, "c1", "2", testcp.Route("r", "x"), testcp.Cluster("y"), testcp.Endpoints("y")) // x goes first
	c.quiet(300 * time.Millisecond)
	if l := r.groupCache(keyOf("c1")).Get(resourcev3.ClusterType, []string{"x"})[0]; l.Resource == nil {
		t.Fatal("x left the cache while the route points at it")
	}

	cp.Set(t, "c1", "3", testcp.Route("r", "y"), testcp.Cluster("y"), testcp.Endpoints("y"))
	moved := false
	deadline := time.Now().Add(wait)
	for {
		resp := recvAck(t, c, time.Until(deadline))
		if got := routeClusters(t, resp, "r"); got != nil {
			if !slices.Equal(got, []string{"y"}) {
				t.Fatalf("route to %v, want [y]", got)
			}
			moved = true
		}
		if slices.Contains(resp.GetRemovedResources(), "x") {
			if !moved {
				t.Fatal("the client lost x before the route moved to y")
			}
			break
		}
	}
	wantReferenceWaits(t, r, resourcev3.ClusterType, "resolved", 1)
}

// A weighted route waits for every cluster it splits between; one that
// never comes holds it for consistency.max_wait, then the control plane's
// word wins, counted as a timeout and shown on /debug/references.
func TestWeightedRouteWaitIsBounded(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Route("r", "x"), testcp.Cluster("x"), testcp.Endpoints("x"))
	const maxWait = time.Second
	r := startRelay(t, cp.Addr, func(c *Config) { c.Consistency.MaxWait = maxWait })
	c := openDelta(t, r.Addr())
	c.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "c1"), TypeUrl: resourcev3.RouteType, ResourceNamesSubscribe: []string{"r"}})
	recvAck(t, c, wait)

	start := time.Now()
	cp.Set(t, "c1", "2", weightedRoute("r", "x", "y", "z"), testcp.Cluster("x"), testcp.Endpoints("x"), testcp.Cluster("y"), testcp.Endpoints("y"))
	var refs debugReferences
	eventually(t, "the route to wait for z alone on /debug/references", func() bool {
		getJSON(t, r, "/debug/references?group="+url.QueryEscape(keyOf("c1")), &refs)
		return len(refs.Waiting) == 1 && len(refs.Waiting[0].Missing) == 1
	})
	if w := refs.Waiting[0]; w.Name != "r" || w.Removal || w.Missing[0].Name != "z" {
		t.Errorf("waiting = %+v, want r missing z", w)
	}
	got := routeClusters(t, recvAck(t, c, maxWait+wait), "r")
	if !slices.Equal(got, []string{"x", "y", "z"}) {
		t.Fatalf("route to %v, want [x y z]", got)
	}
	if took := time.Since(start); took < maxWait {
		t.Errorf("the route came after %v, before consistency.max_wait %v", took, maxWait)
	}
	wantReferenceWaits(t, r, resourcev3.RouteType, "timeout", 1)
	getJSON(t, r, "/debug/references?group="+url.QueryEscape(keyOf("c1")), &refs)
	var clusters []debugDangling
	for _, d := range refs.Dangling {
		if d.Type == xds.ShortName(resourcev3.ClusterType) {
			clusters = append(clusters, d)
		}
	}
	if len(refs.Waiting) != 0 || len(clusters) != 1 || clusters[0].Name != "z" ||
		len(clusters[0].From) != 1 || clusters[0].From[0].Name != "r" {
		t.Errorf("/debug/references = %+v, want z dangling from r", refs)
	}
	if n := value(scrape(t, r), "xdsrelay_dangling_references", map[string]string{"type": xds.ShortName(resourcev3.ClusterType)}); n != 1 {
		t.Errorf("xdsrelay_dangling_references{type=Cluster} = %v, want 1", n)
	}
}

// With consistency.max_wait: 0 the relay passes on what the control plane
// sends as it sends it, and fetches nothing a resource points at.
func TestConsistencyOff(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Route("r", "y"))
	r := startRelay(t, cp.Addr, func(c *Config) { c.Consistency.MaxWait = 0 })
	c := openDelta(t, r.Addr())
	c.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "c1"), TypeUrl: resourcev3.RouteType, ResourceNamesSubscribe: []string{"r"}})
	if got := routeClusters(t, recvAck(t, c, wait), "r"); !slices.Equal(got, []string{"y"}) {
		t.Fatalf("route to %v, want [y]", got)
	}
	if in := r.groupCache(keyOf("c1")).Interest()[resourcev3.ClusterType]; len(in.Names) != 0 {
		t.Errorf("cluster interest %v with consistency off", in.Names)
	}
}

// Every list /debug/references shows stops at maxDebugReferences and says
// how many more there are; an empty one is [] in the body, not null.
func TestDebugReferencesAreBounded(t *testing.T) {
	refs := make([]xds.Ref, maxDebugReferences+2)
	for i := range refs {
		refs[i] = xds.Ref{TypeURL: resourcev3.ClusterType, Name: fmt.Sprint("c", i)}
	}
	got, more := debugRefs(refs)
	if len(got) != maxDebugReferences || more != 2 {
		t.Errorf("debugRefs of %d: %d shown, %d more; want %d and 2", len(refs), len(got), more, maxDebugReferences)
	}
	if got[0] != (debugRef{Type: xds.ShortName(resourcev3.ClusterType), Name: "c0"}) {
		t.Errorf("first = %+v", got[0])
	}
	if got, more := debugRefs(refs[:3]); len(got) != 3 || more != 0 {
		t.Errorf("debugRefs of 3: %d shown, %d more", len(got), more)
	}
	if got, _ := debugRefs(nil); got == nil {
		t.Error("debugRefs(nil) is nil: the body would say null")
	}
}

// unsafeOrderMsg is the warning logged once per group and type when the
// control plane sends a resource before what it points at.
const unsafeOrderMsg = "consistency: the control plane sent a resource before what it points at, an unsafe order; the relay holds it until that arrives, for consistency.max_wait at most, and a name that has not come by then is not waited for again until it exists (logged once per group and type)"

// The control plane sends a Route before its Cluster, twice: the relay
// warns once for the group and type, naming the Route and the Cluster.
func TestUnsafeOrderWarnsOncePerGroupAndType(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Route("r", "x"))
	logs := &logBuffer{}
	r := startRelayLogged(t, cp.Addr, slog.New(slog.NewJSONHandler(logs, nil)), func(c *Config) { c.Consistency.MaxWait = time.Minute })
	c := openDelta(t, r.Addr())
	c.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "c1"), TypeUrl: resourcev3.RouteType, ResourceNamesSubscribe: []string{"r"}})
	eventually(t, "the route to x to wait", func() bool {
		g := r.groupCache(keyOf("c1"))
		return g != nil && len(g.References().Waiting) == 1
	})
	cp.Set(t, "c1", "2", testcp.Route("r", "x"), testcp.Cluster("x"), testcp.Endpoints("x"))
	if got := routeClusters(t, recvAck(t, c, wait), "r"); !slices.Equal(got, []string{"x"}) {
		t.Fatalf("route to %v, want [x]", got)
	}
	cp.Set(t, "c1", "3", testcp.Route("r", "y"), testcp.Cluster("x"), testcp.Endpoints("x"))
	eventually(t, "the route to y to wait", func() bool { return len(r.groupCache(keyOf("c1")).References().Waiting) == 1 })
	cp.Set(t, "c1", "4", testcp.Route("r", "y"), testcp.Cluster("x"), testcp.Endpoints("x"), testcp.Cluster("y"), testcp.Endpoints("y"))
	if got := routeClusters(t, recvAck(t, c, wait), "r"); !slices.Equal(got, []string{"y"}) {
		t.Fatalf("route to %v, want [y]", got)
	}
	wantReferenceWaits(t, r, resourcev3.RouteType, "resolved", 2)
	lines := logs.Lines(t, unsafeOrderMsg)
	if len(lines) != 1 {
		t.Fatalf("%d unsafe-order warnings, want 1: %v", len(lines), lines)
	}
	l := lines[0]
	if l["level"] != "WARN" || l["group"] != keyOf("c1") || l["type"] != xds.ShortName(resourcev3.RouteType) ||
		l["name"] != "r" || l["points_at"] != xds.ShortName(resourcev3.ClusterType)+" x" {
		t.Errorf("warning = %v, want group c1, type Route, r pointing at Cluster x", l)
	}
}

// A Route naming more Clusters than limits.max_names_per_group leaves
// room for fetches the relay makes them all: the names past the bound are
// not fetched, counted, and logged once; the Route is released by
// consistency.max_wait.
func TestReferencedNamesAreBoundedPerGroup(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", weightedRoute("r", "a", "b", "c", "d", "e"))
	logs := &logBuffer{}
	const maxWait = time.Second
	r := startRelayLogged(t, cp.Addr, slog.New(slog.NewJSONHandler(logs, nil)), func(c *Config) {
		c.Consistency.MaxWait = maxWait
		c.Limits.MaxNamesPerGroup = 3
	})
	waitMetric(t, r, `xdsrelay_references_refused_total{type="`+xds.ShortName(resourcev3.ClusterType)+`"} 0`) // there from the start
	c := openDelta(t, r.Addr())
	c.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "c1"), TypeUrl: resourcev3.RouteType, ResourceNamesSubscribe: []string{"r"}})
	got := routeClusters(t, recvAck(t, c, maxWait+wait), "r")
	if !slices.Equal(got, []string{"a", "b", "c", "d", "e"}) {
		t.Fatalf("route to %v, want [a b c d e]", got)
	}
	if names := r.groupCache(keyOf("c1")).Interest()[resourcev3.ClusterType].Names; len(names) != 2 {
		t.Errorf("clusters fetched = %v, want 2: 1 name wanted, limits.max_names_per_group 3", names)
	}
	if n := value(scrape(t, r), "xdsrelay_references_refused_total", map[string]string{"type": xds.ShortName(resourcev3.ClusterType)}); n != 3 {
		t.Errorf("xdsrelay_references_refused_total{type=Cluster} = %v, want 3", n)
	}
	wantReferenceWaits(t, r, resourcev3.RouteType, "timeout", 1)
	const msg = "consistency: names resources point at were not fetched, the group's names are at limits.max_names_per_group; what waits for them is released after consistency.max_wait (logged once per group, counted in xdsrelay_references_refused_total)"
	if lines := logs.Lines(t, msg); len(lines) != 1 || lines[0]["refused"] != float64(3) {
		t.Errorf("refusal warnings = %v, want one of 3 names", lines)
	}
	// The names fetched as references count where a client's names are
	// checked: a name more would take the group past the bound.
	more := openDelta(t, r.Addr())
	more.send(&discoverypb.DeltaDiscoveryRequest{Node: node("m", "c1"), TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"z"}})
	err := ended(t, more)
	wantRefused(t, err, "limits.max_names_per_group")
	if !strings.Contains(err.Error(), "fetches 3 names (wanted or referenced)") {
		t.Errorf("the refusal does not say the group's referenced names count: %v", err)
	}
}

// routeWithPrefix is Route name to cluster, its one route matching prefix:
// another prefix is another version of the same Route.
func routeWithPrefix(name, cluster, prefix string) *routepb.RouteConfiguration {
	rc := testcp.Route(name, cluster)
	rc.VirtualHosts[0].Routes[0].GetMatch().PathSpecifier = &routepb.RouteMatch_Prefix{Prefix: prefix}
	return rc
}

// The xds-test-harness's shape: Routes to a Cluster the control plane never
// creates, changed one after the other. The first version waits
// consistency.max_wait for the Cluster, and its wait runs out; every later
// version of a Route that points at it goes out without a wait, as Envoy,
// which does not wait on a route's Clusters, would have it, until the
// Cluster exists. Then a Route that points at a new missing name waits for
// it again (make before break).
func TestDanglingReferenceHoldsOnlyTheFirstVersion(t *testing.T) {
	forEachDialect(t, testDanglingReferenceHoldsOnlyTheFirstVersion)
}

func testDanglingReferenceHoldsOnlyTheFirstVersion(t *testing.T, d testcp.Dialect) {
	cp := testcp.StartDialect(t, d)
	cp.Set(t, "c1", "1", routeWithPrefix("a", "a", "/1"), routeWithPrefix("b", "b", "/1"))
	const maxWait = 300 * time.Millisecond
	r := startRelay(t, cp.Addr, func(c *Config) { c.Consistency.MaxWait = maxWait })
	c := openDelta(t, r.Addr())
	c.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "c1"), TypeUrl: resourcev3.RouteType, ResourceNamesSubscribe: []string{"b", "a"}})
	got := map[string]bool{}
	for len(got) < 2 {
		for _, res := range recvAck(t, c, maxWait+wait).GetResources() {
			got[res.GetName()] = true
		}
	}
	// The waits are counted once told, after the clients' marks.
	const timeouts = 2 // a and b waited for their Clusters
	eventually(t, "both Routes' waits counted as timeouts", func() bool {
		return referenceWaits(t, r, resourcev3.RouteType, "timeout") == timeouts
	})

	g := r.groupCache(keyOf("c1"))
	for v := 2; v <= 4; v++ {
		prefix := fmt.Sprint("/", v)
		cp.Set(t, "c1", fmt.Sprint(v), routeWithPrefix("a", "a", "/1"), routeWithPrefix("b", "b", prefix))
		resp := recvAck(t, c, wait)
		if len(resp.GetResources()) != 1 || resp.GetResources()[0].GetName() != "b" {
			t.Fatalf("version %d: got %v, want Route b alone", v, deltaNames(resp))
		}
		if w := g.References().Waiting; len(w) != 0 {
			t.Fatalf("version %d waited: %+v", v, w)
		}
	}
	if n := referenceWaits(t, r, resourcev3.RouteType, "timeout") + referenceWaits(t, r, resourcev3.RouteType, "resolved"); n != timeouts {
		t.Errorf("%v reference waits after the later versions, want %v: they point at a dangling Cluster", n, timeouts)
	}

	// b's Cluster comes; then b points at a Cluster that is missing and
	// not known to dangle: it waits for it as ever.
	cp.Set(t, "c1", "5", routeWithPrefix("a", "a", "/1"), routeWithPrefix("b", "b", "/4"), testcp.Cluster("b"), testcp.Endpoints("b"))
	eventually(t, "Cluster b cached", func() bool { return g.Get(resourcev3.ClusterType, []string{"b"})[0].Resource != nil })
	cp.Set(t, "c1", "6", routeWithPrefix("a", "a", "/1"), routeWithPrefix("b", "c", "/6"), testcp.Cluster("b"), testcp.Endpoints("b"))
	eventually(t, "b to wait for its new Cluster c", func() bool {
		w := g.References().Waiting
		return len(w) == 1 && w[0].Name == "b" && len(w[0].Missing) == 1 && w[0].Missing[0].Name == "c"
	})
	if got := routeClusters(t, recvAck(t, c, maxWait+wait), "b"); !slices.Equal(got, []string{"c"}) {
		t.Fatalf("b after its wait for c: route to %v, want [c]", got)
	}
}

// A wildcard client's first answer is the type's complete state: while a
// Route (or a Listener with its routes inline) waits for its Cluster, a
// wildcard client of the type is sent nothing, not an empty answer with
// the resource right after; once the Cluster comes, the first answer
// carries it. Delta and SotW ADS alike, and a poll (gRPC Fetch).
func TestWildcardFirstAnswerWaitsForAHeldResource(t *testing.T) {
	for _, tc := range []struct {
		variant, typeURL string
		held             types.Resource // points at the Cluster x
	}{
		{"delta", resourcev3.RouteType, testcp.Route("r", "x")},
		{"sotw", resourcev3.RouteType, testcp.Route("r", "x")},
		{"delta", resourcev3.ListenerType, inlineListener("l", "x")},
		{"sotw", resourcev3.ListenerType, inlineListener("l", "x")},
		{"fetch", resourcev3.RouteType, testcp.Route("r", "x")},
	} {
		t.Run(tc.variant+"/"+xds.ShortName(tc.typeURL), func(t *testing.T) {
			name := cachev3.GetResourceName(tc.held)
			cp := testcp.Start(t)
			cp.Set(t, "c1", "1", tc.held)
			r := startRelay(t, cp.Addr, func(c *Config) { c.Consistency.MaxWait = time.Minute })
			var first func() []string
			var quiet func(time.Duration)
			switch tc.variant {
			case "delta":
				c := openDelta(t, r.Addr())
				c.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "c1"), TypeUrl: tc.typeURL})
				first, quiet = func() []string { return deltaNames(recvAck(t, c, wait)) }, c.quiet
			case "fetch":
				answered := make(chan *discoverypb.DiscoveryResponse, 1)
				ctx, cancel := context.WithTimeout(context.Background(), wait)
				t.Cleanup(cancel)
				go func() {
					resp, err := routesvc.NewRouteDiscoveryServiceClient(dial(t, r.Addr())).FetchRoutes(ctx, &discoverypb.DiscoveryRequest{Node: node("n", "c1"), TypeUrl: tc.typeURL})
					if err != nil {
						t.Errorf("fetch: %v", err)
					}
					answered <- resp
				}()
				first = func() []string { return anyNames(t, (<-answered).GetResources()) }
				quiet = func(d time.Duration) {
					select {
					case resp := <-answered:
						t.Fatalf("the poll was answered %v", resp)
					case <-time.After(d):
					}
				}
			default:
				c := openSotW(t, r.Addr())
				c.send(&discoverypb.DiscoveryRequest{Node: node("n", "c1"), TypeUrl: tc.typeURL})
				first, quiet = func() []string { return anyNames(t, c.recv().GetResources()) }, c.quiet
			}
			eventually(t, name+" to wait for its Cluster", func() bool {
				g := r.groupCache(keyOf("c1"))
				return g != nil && len(g.References().Waiting) == 1
			})
			quiet(200 * time.Millisecond)
			cp.Set(t, "c1", "2", tc.held, testcp.Cluster("x"), testcp.Endpoints("x"))
			if got := first(); !slices.Equal(got, []string{name}) {
				t.Fatalf("first answer %v, want %s", got, name)
			}
		})
	}
}

// inlineListener is an API listener whose one route, inline, goes to
// cluster: it points at the Cluster itself.
func inlineListener(name, cluster string) *listenerpb.Listener {
	router, _ := anypb.New(&routerpb.Router{})
	hcm, _ := anypb.New(&hcmpb.HttpConnectionManager{
		RouteSpecifier: &hcmpb.HttpConnectionManager_RouteConfig{RouteConfig: testcp.Route(name, cluster)},
		HttpFilters:    []*hcmpb.HttpFilter{{Name: "router", ConfigType: &hcmpb.HttpFilter_TypedConfig{TypedConfig: router}}},
	})
	return &listenerpb.Listener{Name: name, ApiListener: &listenerpb.ApiListener{ApiListener: hcm}}
}

// anyNames are the names of the resources of a SotW response.
func anyNames(t *testing.T, rs []*anypb.Any) []string {
	t.Helper()
	var out []string
	for _, a := range rs {
		m, err := a.UnmarshalNew()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, cachev3.GetResourceName(m.(types.Resource)))
	}
	return out
}
