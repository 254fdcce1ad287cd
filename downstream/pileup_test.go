package downstream

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerpb "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routepb "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/testcp"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// bigListener is Listener l at version, about pad bytes long.
func bigListener(t *testing.T, version string, pad int) *cache.Resource {
	t.Helper()
	return encodeMsg(t, "l", version, &listenerpb.Listener{Name: "l", StatPrefix: version + strings.Repeat("x", pad)})
}

// route is Route r at version, sending everything to cluster.
func route(t *testing.T, version, cluster string) *cache.Resource {
	t.Helper()
	return encodeMsg(t, "r", version, testcp.Route("r", cluster))
}

func encodeMsg(t *testing.T, name, version string, m proto.Message) *cache.Resource {
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

// workerSendSlow reports whether a send on a send worker has been blocked
// for slowSend.
func workerSendSlow(s *Server) bool {
	s.sends.mu.Lock()
	defer s.sends.mu.Unlock()
	return s.sends.blocked > 0
}

// pileClient is an ADS client, delta or SotW, that can stop reading: it
// receives one response at a time, and describes each as what it tells
// the client of Clusters and Routes (see describe). Responses of other
// types are read and left out.
type pileClient struct {
	send func(typeURL string, names ...string)
	recv func() ([]string, error)
}

// describe is what a resource tells a client: a Cluster's name, a Route's
// name and the cluster it sends to.
func describe(t *testing.T, a *anypb.Any) string {
	t.Helper()
	m, err := a.UnmarshalNew()
	if err != nil {
		t.Fatal(err)
	}
	if r, ok := m.(*routepb.RouteConfiguration); ok {
		return r.GetName() + "→" + r.GetVirtualHosts()[0].GetRoutes()[0].GetRoute().GetCluster()
	}
	return m.(interface{ GetName() string }).GetName()
}

// pileSend is a pileClient's send on st of the requests req makes: the
// first carries the node, the others none.
func pileSend[Req any](t *testing.T, st interface{ Send(*Req) error },
	req func(typeURL string, names []string, node *corepb.Node) *Req) func(string, ...string) {
	node := &corepb.Node{Id: "slow"}
	return func(typeURL string, names ...string) {
		r := req(typeURL, names, node)
		node = nil
		if err := st.Send(r); err != nil {
			t.Fatal(err)
		}
	}
}

// deltaPileClient opens a delta ADS stream: a response is described as
// "Cluster +x" per resource and "Cluster -x" per removal.
func deltaPileClient(t *testing.T, cc *grpc.ClientConn, ctx context.Context) pileClient {
	st, err := discoverypb.NewAggregatedDiscoveryServiceClient(cc).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return pileClient{
		send: pileSend(t, st, func(typeURL string, names []string, node *corepb.Node) *discoverypb.DeltaDiscoveryRequest {
			return &discoverypb.DeltaDiscoveryRequest{Node: node, TypeUrl: typeURL, ResourceNamesSubscribe: names}
		}),
		recv: func() ([]string, error) {
			resp, err := recvWithin(st, wait)
			if err != nil || resp.GetTypeUrl() == resourcev3.ListenerType {
				return nil, err
			}
			short := xds.ShortName(resp.GetTypeUrl())
			var got []string
			for _, r := range resp.GetResources() {
				got = append(got, short+" +"+describe(t, r.GetResource()))
			}
			for _, n := range resp.GetRemovedResources() {
				got = append(got, short+" -"+n)
			}
			return got, nil
		},
	}
}

// sotwPileClient opens a SotW ADS stream: a Cluster response is described
// as the complete state, "Cluster [x y]", a Route as "RouteConfiguration
// +r→x".
func sotwPileClient(t *testing.T, cc *grpc.ClientConn, ctx context.Context) pileClient {
	st, err := discoverypb.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return pileClient{
		send: pileSend(t, st, func(typeURL string, names []string, node *corepb.Node) *discoverypb.DiscoveryRequest {
			return &discoverypb.DiscoveryRequest{Node: node, TypeUrl: typeURL, ResourceNames: names}
		}),
		recv: func() ([]string, error) {
			resp, err := recvWithin(st, wait)
			if err != nil || resp.GetTypeUrl() == resourcev3.ListenerType {
				return nil, err
			}
			short := xds.ShortName(resp.GetTypeUrl())
			var names []string
			for _, r := range resp.GetResources() {
				names = append(names, describe(t, r))
			}
			if xds.FullState(resp.GetTypeUrl()) {
				slices.Sort(names)
				return []string{fmt.Sprintf("%s %v", short, names)}, nil
			}
			for i, n := range names {
				names[i] = short + " +" + n
			}
			return names, nil
		},
	}
}

// pileUp opens an ADS stream with open, subscribed to Listener l, Clusters
// x, y, z and w and Route r, and applies initial. Once the client has read
// what initial sends (until ready says so), it stops reading: big
// Listeners are applied until a send to it blocks, then changes, which
// pile up on the stream. It then reads again, and returns what it is told
// of Clusters and Routes until done says it has all, and the same by
// response.
func pileUp(t *testing.T, open func(*testing.T, *grpc.ClientConn, context.Context) pileClient,
	initial func(*cache.Cache), ready func(got []string) bool, changes func(*cache.Cache), done func(got []string) bool) (told []string, resps [][]string) {
	t.Helper()
	return pileUpWith(t, cache.Options{Retention: time.Hour}, open, initial, ready, changes, done)
}

// pileUpWith is pileUp on a cache made with opts.
func pileUpWith(t *testing.T, opts cache.Options, open func(*testing.T, *grpc.ClientConn, context.Context) pileClient,
	initial func(*cache.Cache), ready func(got []string) bool, changes func(*cache.Cache), done func(got []string) bool) (told []string, resps [][]string) {
	t.Helper()
	return pileUpHooked(t, opts, nil, open, initial, ready, changes, done)
}

// pileUpHooked is pileUpWith with a server whose flushes call between
// before each type they send (Options.betweenTypes).
func pileUpHooked(t *testing.T, opts cache.Options, between func(next string), open func(*testing.T, *grpc.ClientConn, context.Context) pileClient,
	initial func(*cache.Cache), ready func(got []string) bool, changes func(*cache.Cache), done func(got []string) bool) (told []string, resps [][]string) {
	t.Helper()
	const cds, lds, rds = resourcev3.ClusterType, resourcev3.ListenerType, resourcev3.RouteType
	c := cache.New(opts)
	s, any := serveOn(t, Options{Groups: oneGroup{c}, SendTimeout: time.Minute, betweenTypes: between})
	cc := smallWindows(t, any.Target())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cl := open(t, cc, ctx)
	cl.send(lds, "l")
	cl.send(cds, "w", "x", "y", "z")
	cl.send(rds, "r")
	watched(t, c, lds, "l")
	watched(t, c, cds, "w", "x", "y", "z")
	watched(t, c, rds, "r")
	initial(c)
	read := func(until func([]string) bool) (got []string, resps [][]string) {
		t.Helper()
		for !until(got) {
			more, err := cl.recv()
			if err != nil {
				t.Fatalf("after %v: %v", got, err)
			}
			got = append(got, more...)
			if len(more) > 0 {
				resps = append(resps, more)
			}
		}
		return got, resps
	}
	read(ready)
	// The client reads nothing from here: gRPC takes a first big Listener
	// whole, and the send of a later one blocks behind it (two big ones
	// marked before a flush are one flush: big ones are marked until a
	// send blocks).
	for i := 0; !workerSendSlow(s); i++ {
		if i == 100 {
			t.Fatal("no send blocked on a client that reads nothing")
		}
		c.Apply(lds, cache.Change{Upserts: []*cache.Resource{bigListener(t, fmt.Sprint("big-", i), 256<<10)}})
		for end := time.Now().Add(100 * time.Millisecond); time.Now().Before(end) && !workerSendSlow(s); {
			time.Sleep(5 * time.Millisecond)
		}
	}
	changes(c)
	return read(done)
}

// seen returns a done for pileUp: every one of want has been told.
func seen(want ...string) func([]string) bool {
	return func(got []string) bool {
		for _, w := range want {
			if !slices.Contains(got, w) {
				return false
			}
		}
		return true
	}
}

// before reports whether a is told before b in got.
func before(got []string, a, b string) bool {
	i, j := slices.Index(got, a), slices.Index(got, b)
	return i >= 0 && j >= 0 && i < j
}

func upsertClusters(t *testing.T, c *cache.Cache, version string, names ...string) {
	t.Helper()
	var rs []*cache.Resource
	for _, n := range names {
		rs = append(rs, encoded(t, resourcev3.ClusterType, n, version, 0))
	}
	c.Apply(resourcev3.ClusterType, cache.Change{Upserts: rs})
}

func setRoute(t *testing.T, c *cache.Cache, version, cluster string) {
	t.Helper()
	c.Apply(resourcev3.RouteType, cache.Change{Upserts: []*cache.Resource{route(t, version, cluster)}})
}

// Make before break when changes pile up (docs/architecture.md, invariant
// 7 "Order is kept"): a Route changes (its first pending change), Cluster
// y is added, and the Route moves to y. Its latest state points at y, so
// the client must have y first, whatever the order of the first pending
// changes ("Eventual consistency considerations": CDS before RDS).
func TestPiledUpRouteGoesAfterTheClusterItPointsAt(t *testing.T) {
	for name, open := range map[string]func(*testing.T, *grpc.ClientConn, context.Context) pileClient{
		"delta": deltaPileClient, "sotw": sotwPileClient,
	} {
		t.Run(name, func(t *testing.T) {
			cluster, routed := map[string]string{"delta": "Cluster +y", "sotw": "Cluster [x y]"}[name], "RouteConfiguration +r→y"
			got, _ := pileUp(t, open,
				func(c *cache.Cache) {
					upsertClusters(t, c, "1", "x")
					setRoute(t, c, "1", "x")
				},
				seen("RouteConfiguration +r→x"),
				func(c *cache.Cache) {
					setRoute(t, c, "2", "x") // another change of the Route, first
					upsertClusters(t, c, "1", "y")
					setRoute(t, c, "3", "y")
				},
				seen(cluster, routed))
			if !before(got, cluster, routed) {
				t.Fatalf("the client was told %v: the Route to y before Cluster y", got)
			}
		})
	}
}

// A removal that piles up behind the change that ended its references goes
// after that change ("Eventual consistency considerations": stale Clusters
// are removed once nothing references them). The Clusters change first
// (delta: z is added; SotW: w, which nothing uses, is removed), the Route
// moves from x to y, and x is removed: the client must be told the Route's
// move before it loses x. An incremental stream sends the Clusters'
// removals in a response of their own, after the Route; a SotW Cluster
// state that only removes goes after the Route.
func TestPiledUpRemovalGoesAfterTheRouteThatLeftIt(t *testing.T) {
	cases := map[string]struct {
		open            func(*testing.T, *grpc.ClientConn, context.Context) pileClient
		clusters, first func(*testing.T, *cache.Cache)
		gone            string // x is gone
	}{
		"delta": {
			open:     deltaPileClient,
			clusters: func(t *testing.T, c *cache.Cache) { upsertClusters(t, c, "1", "x", "y") },
			first:    func(t *testing.T, c *cache.Cache) { upsertClusters(t, c, "1", "z") },
			gone:     "Cluster -x",
		},
		"sotw": {
			open:     sotwPileClient,
			clusters: func(t *testing.T, c *cache.Cache) { upsertClusters(t, c, "1", "w", "x", "y") },
			first: func(_ *testing.T, c *cache.Cache) {
				c.Apply(resourcev3.ClusterType, cache.Change{Removed: []string{"w"}})
			},
			gone: "Cluster [y]",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			const moved = "RouteConfiguration +r→y"
			got, _ := pileUp(t, tc.open,
				func(c *cache.Cache) {
					tc.clusters(t, c)
					setRoute(t, c, "1", "x")
				},
				seen("RouteConfiguration +r→x"),
				func(c *cache.Cache) {
					tc.first(t, c)
					setRoute(t, c, "2", "y")
					c.Apply(resourcev3.ClusterType, cache.Change{Removed: []string{"x"}})
				},
				seen(moved, tc.gone))
			if !before(got, moved, tc.gone) {
				t.Fatalf("the client was told %v: x removed before the Route left it", got)
			}
			if name == "delta" && !before(got, "Cluster +z", moved) {
				t.Fatalf("the client was told %v: the added Cluster z after the Route", got)
			}
		})
	}
}

// What needs no reordering costs nothing more (docs/architecture.md,
// invariant 7 "Order is kept"): an incremental flush of one type sends
// its additions and removals in one response, as it would anyway.
func TestPiledUpChangeOfOneTypeIsOneResponse(t *testing.T) {
	_, resps := pileUp(t, deltaPileClient,
		func(c *cache.Cache) {
			upsertClusters(t, c, "1", "x", "y")
			setRoute(t, c, "1", "y")
		},
		seen("RouteConfiguration +r→y"),
		func(c *cache.Cache) {
			upsertClusters(t, c, "1", "z")
			c.Apply(resourcev3.ClusterType, cache.Change{Removed: []string{"x"}})
		},
		seen("Cluster +z", "Cluster -x"))
	if want := []string{"Cluster +z", "Cluster -x"}; len(resps) != 1 || !slices.Equal(resps[0], want) {
		t.Fatalf("the client was told %v, want one response %v", resps, want)
	}
}

// The edge of the rule (docs/architecture.md, invariant 7 "Order is
// kept"): a SotW Cluster state is the whole state, and one that adds and
// removes goes in the spec's order, before the Route, with its removal.
// The test holds the relay to what the architecture says it does.
func TestPiledUpSotWStateThatAddsAndRemovesGoesInTypeOrder(t *testing.T) {
	const clusters, moved = "Cluster [y z]", "RouteConfiguration +r→y"
	got, _ := pileUp(t, sotwPileClient,
		func(c *cache.Cache) {
			upsertClusters(t, c, "1", "x", "y")
			setRoute(t, c, "1", "x")
		},
		seen("RouteConfiguration +r→x"),
		func(c *cache.Cache) {
			upsertClusters(t, c, "1", "z")
			setRoute(t, c, "2", "y")
			c.Apply(resourcev3.ClusterType, cache.Change{Removed: []string{"x"}})
		},
		seen(clusters, moved))
	if !before(got, clusters, moved) {
		t.Fatalf("the client was told %v: the edge docs/architecture.md describes has changed, update it", got)
	}
}

// A Cluster and the Route that points at it, released by the cache in one
// operation while a flush is between its read of the Clusters and its read
// of the Routes (docs/architecture.md, invariant 7 "Order is kept"): the
// Route waits for Cluster y (invariant 18 "Make before break, whatever the
// order upstream"), and y's arrival, with w's removal, releases both. The
// flush has read the Clusters already; before it sends the Route it sends
// y ("Eventual consistency considerations": CDS before RDS), not after it
// in the next flush, and an incremental stream holds w's removal back
// until after the Route, as the flush's own. Options.betweenTypes places the
// release at that instant.
func TestClusterReleasedMidFlushGoesBeforeTheRouteToIt(t *testing.T) {
	for name, open := range map[string]func(*testing.T, *grpc.ClientConn, context.Context) pileClient{
		"delta": deltaPileClient, "sotw": sotwPileClient,
	} {
		t.Run(name, func(t *testing.T) {
			cluster, routed := map[string]string{"delta": "Cluster +y", "sotw": "Cluster [x y]"}[name], "RouteConfiguration +r→y"
			gone := map[string]string{"delta": "Cluster -w", "sotw": cluster}[name]
			toY, y := route(t, "3", "y"), encoded(t, resourcev3.ClusterType, "y", "1", 0)
			var group atomic.Pointer[cache.Cache]
			var fired atomic.Bool
			hook := func(next string) {
				c := group.Load()
				if next != resourcev3.RouteType || c == nil || !fired.CompareAndSwap(false, true) {
					return
				}
				c.Apply(resourcev3.RouteType, cache.Change{Upserts: []*cache.Resource{toY}})                         // waits for y
				c.Apply(resourcev3.ClusterType, cache.Change{Upserts: []*cache.Resource{y}, Removed: []string{"w"}}) // releases y and the Route
			}
			got, _ := pileUpHooked(t, cache.Options{Retention: time.Hour, Consistency: cache.Consistency{MaxWait: time.Hour}}, hook, open,
				func(c *cache.Cache) {
					upsertClusters(t, c, "1", "w", "x")
					setRoute(t, c, "1", "x")
				},
				seen("RouteConfiguration +r→x"),
				func(c *cache.Cache) {
					// A change of each type piles up: one flush reads the
					// Clusters, then the Routes.
					upsertClusters(t, c, "2", "x")
					setRoute(t, c, "2", "x")
					group.Store(c)
				},
				seen(cluster, routed, gone))
			if !fired.Load() {
				t.Fatalf("the client was told %v by no flush of Clusters and Routes", got)
			}
			if !before(got, cluster, routed) {
				t.Fatalf("the client was told %v: the Route to y before Cluster y", got)
			}
			if name == "delta" && !before(got, routed, gone) {
				t.Fatalf("the client was told %v: w's removal before the Route", got)
			}
		})
	}
}

// smallWindows dials target with each stream's flow-control window small
// and fixed (64 KiB) and the connection's large: a stream that does not
// read blocks the server's sends to it alone. It is closed when the test
// ends.
func smallWindows(t *testing.T, target string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(16<<20))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// recvWithin receives on st within bound.
func recvWithin[Req, Resp any](st grpc.BidiStreamingClient[Req, Resp], bound time.Duration) (*Resp, error) {
	type result struct {
		r   *Resp
		err error
	}
	ch := make(chan result, 1)
	go func() {
		r, err := st.Recv()
		ch <- result{r, err}
	}()
	select {
	case res := <-ch:
		return res.r, res.err
	case <-time.After(bound):
		return nil, fmt.Errorf("no response within %v", bound)
	}
}

// A removal the cache makes readable after a flush took its marks
// (docs/architecture.md, invariant 7 "Order is kept"): the control plane
// removes Cluster x while Route r points at it, so the removal waits
// (invariant 18 "Make before break, whatever the order upstream"); then r
// moves to w, which marks the Routes and then releases x's removal, which
// marks the Clusters. A flush that took only a change of Cluster w before
// that, and reads the Clusters after it, reads only w, the name it was
// marked for: x's removal goes in the next flush, which carries the Route
// too, and removals last. Options.betweenTypes places the change after the flush's
// marks and before its read of the Clusters.
func TestRemovalReadAfterTheRouteMovedGoesAfterIt(t *testing.T) {
	moved, gone := "RouteConfiguration +r→w", "Cluster -x"
	var group atomic.Pointer[cache.Cache]
	var fired atomic.Bool
	hook := func(next string) {
		c := group.Load()
		if next != resourcev3.ClusterType || c == nil || !fired.CompareAndSwap(false, true) {
			return
		}
		c.Apply(resourcev3.ClusterType, cache.Change{Removed: []string{"x"}})                       // waits: r points at x
		c.Apply(resourcev3.RouteType, cache.Change{Upserts: []*cache.Resource{route(t, "3", "w")}}) // marks r, then releases x's removal
	}
	got, _ := pileUpHooked(t, cache.Options{Retention: time.Hour, Consistency: cache.Consistency{MaxWait: time.Hour}}, hook, deltaPileClient,
		func(c *cache.Cache) {
			upsertClusters(t, c, "1", "w", "x")
			setRoute(t, c, "1", "x")
		},
		seen("RouteConfiguration +r→x"),
		func(c *cache.Cache) {
			upsertClusters(t, c, "2", "w") // the flush's one mark: the Clusters
			group.Store(c)
		},
		seen(moved, gone))
	if !fired.Load() {
		t.Fatalf("the client was told %v by no flush that read the Clusters", got)
	}
	if !before(got, moved, gone) {
		t.Fatalf("the client was told %v: x removed before the Route moved off it", got)
	}
}

// A flush reads a type again at most maxLowerRounds times for a type of
// lower rank marked meanwhile (readOrdered): Clusters that change before
// each read of the Routes, without pause, hold the Route back for a
// bounded number of Cluster responses, not until the Clusters stop.
func TestRouteBehindClustersThatKeepChangingIsBounded(t *testing.T) {
	const changes = 40 // the Clusters stop changing after this many
	routed := "RouteConfiguration +r→y"
	var group atomic.Pointer[cache.Cache]
	var n atomic.Int32
	hook := func(next string) {
		c := group.Load()
		if next != resourcev3.ClusterType || c == nil || n.Load() >= changes {
			return
		}
		upsertClusters(t, c, fmt.Sprint("h", n.Add(1)), "w") // marks the Clusters again
	}
	got, _ := pileUpHooked(t, cache.Options{Retention: time.Hour}, hook, deltaPileClient,
		func(c *cache.Cache) {
			upsertClusters(t, c, "1", "w", "x", "y")
			setRoute(t, c, "1", "x")
		},
		seen("RouteConfiguration +r→x"),
		func(c *cache.Cache) {
			upsertClusters(t, c, "2", "w")
			setRoute(t, c, "2", "y")
			group.Store(c)
		},
		seen(routed))
	clusters := 0
	for _, s := range got[:slices.Index(got, routed)] {
		if s == "Cluster +w" {
			clusters++
		}
	}
	if clusters > 2*(maxLowerRounds+1) {
		t.Fatalf("the Route went after %d responses of Clusters that kept changing (%d changes), want at most %d: %v",
			clusters, n.Load(), 2*(maxLowerRounds+1), got)
	}
	if n.Load() == 0 {
		t.Fatalf("no flush sent the Clusters after the change: %v", got)
	}
}
