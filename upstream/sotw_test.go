package upstream

import (
	"context"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	clustersvc "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/metrics"
	"github.com/xdsrelay/xdsrelay/internal/testcp"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// runSotW runs a client of conn with opts until the test ends.
func runSotW(t *testing.T, conn grpc.ClientConnInterface, opts Options) *Client {
	t.Helper()
	opts.Conn, opts.Node = conn, &corepb.Node{Id: "n", Cluster: "c1"}
	if opts.Metrics == nil {
		opts.Metrics = NewMetrics(&metrics.Registry{})
	}
	return startClient(t, opts)
}

func dialTest(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// numbered is n names prefix-000, prefix-001, … and a resource of each.
func numbered(prefix string, n int, build func(string) types.Resource) ([]string, []types.Resource) {
	names, rs := make([]string, n), make([]types.Resource, n)
	for i := range n {
		names[i] = fmt.Sprintf("%s-%03d", prefix, i)
		rs[i] = build(names[i])
	}
	return names, rs
}

// requestsWithin fails t if a SotW request cp received is larger than
// bound bytes.
func requestsWithin(t *testing.T, cp *testcp.ControlPlane, bound int) {
	t.Helper()
	for _, req := range cp.SotWRequests() {
		if n := proto.Size(req); n > bound {
			t.Errorf("a request of %d bytes, past the bound %d", n, bound)
		}
	}
}

// errorCode is the code of name's error in c, 0 if it has none.
func errorCode(c *cache.Cache, typeURL, name string) codes.Code {
	if e := c.Get(typeURL, []string{name})[0].Error; e != nil {
		return codes.Code(e.Code)
	}
	return 0
}

// A SotW request carries the type's whole list and cannot be split: the
// names that would take it past MaxRequestBytes are refused, newest first,
// each with RESOURCE_EXHAUSTED, and counted; no request passes the bound,
// and the names that fit are served.
func TestSotWNameListTooLarge(t *testing.T) {
	cp := testcp.StartDialect(t, testcp.DialectSotW)
	names, rs := numbered("endpoints", 100, func(n string) types.Resource { return testcp.Endpoints(n, "10.0.0.1:80") })
	cp.Set(t, "c1", "1", rs...)
	const bound = 1000
	c := cache.New(cache.Options{Retention: time.Minute})
	if err := c.Watch(cache.NewWatch(), resourcev3.EndpointType, names...); err != nil {
		t.Fatal(err)
	}
	m := NewMetrics(&metrics.Registry{})
	runSotW(t, dialTest(t, cp.Addr), Options{Cache: c, Metrics: m, Protocol: ProtocolSotW, MaxRequestBytes: bound})

	eventually(t, "the first name served and the last refused", func() bool {
		return c.Get(resourcev3.EndpointType, names[:1])[0].Resource != nil &&
			errorCode(c, resourcev3.EndpointType, names[99]) == codes.ResourceExhausted
	})
	refused := m.ListTooLarge.With("ClusterLoadAssignment").Get()
	if refused == 0 || refused >= 100 {
		t.Fatalf("%d names refused, want some and not all", refused)
	}
	if got := errorCode(c, resourcev3.EndpointType, names[0]); got != 0 {
		t.Errorf("the first name, which fits, has error %v", got)
	}
	requestsWithin(t, cp, bound)
}

// A per-type control plane that serves CDS but not EDS (UNIMPLEMENTED):
// the Clusters are served on the one stream, not ended by the refusal; the endpoints' names,
// and a VHDS name (no SotW service at all), are UNAVAILABLE, never
// removed.
func TestPerTypeServiceRefusedAlone(t *testing.T) {
	snaps := cachev3.NewSnapshotCache(false, testcp.ClusterHash{}, nil)
	snap, err := cachev3.NewSnapshot("1", map[resourcev3.Type][]types.Resource{resourcev3.ClusterType: {testcp.Cluster("a")}})
	if err != nil {
		t.Fatal(err)
	}
	if err := snaps.SetSnapshot(context.Background(), "c1", snap); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	g := grpc.NewServer(grpc.WaitForHandlers(true))
	var streams atomic.Int64
	cb := serverv3.CallbackFuncs{StreamOpenFunc: func(context.Context, int64, string) error { streams.Add(1); return nil }}
	clustersvc.RegisterClusterDiscoveryServiceServer(g, serverv3.NewServer(ctx, snaps, cb))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { defer close(served); _ = g.Serve(ln) }()
	t.Cleanup(func() { g.Stop(); <-served; cancel() })

	c := cache.New(cache.Options{Retention: time.Minute})
	w := cache.NewWatch()
	for typeURL, name := range map[string]string{resourcev3.ClusterType: "a", resourcev3.EndpointType: "a", resourcev3.VirtualHostType: "r/vh"} {
		if err := c.Watch(w, typeURL, name); err != nil {
			t.Fatal(err)
		}
	}
	cl := runSotW(t, dialTest(t, ln.Addr().String()), Options{Cache: c, Protocol: ProtocolSotWPerType})
	eventually(t, "the Cluster served, the endpoints and the virtual host UNAVAILABLE", func() bool {
		return c.Get(resourcev3.ClusterType, []string{"a"})[0].Resource != nil &&
			errorCode(c, resourcev3.EndpointType, "a") == codes.Unavailable &&
			errorCode(c, resourcev3.VirtualHostType, "r/vh") == codes.Unavailable
	})
	if st := cl.Status(); !st.Connected || st.Protocol != string(ProtocolSotWPerType) {
		t.Fatalf("status %+v: want connected, speaking sotw-per-type", st)
	}
	if n := streams.Load(); n != 1 {
		t.Errorf("%d CDS streams opened, want 1: a refused EDS service does not end the others", n)
	}
	if l := c.Get(resourcev3.EndpointType, []string{"a"})[0]; l.Absent {
		t.Error("a name of a refused service was taken not to exist")
	}
}

// held reports whether c holds every one of names of typeURL.
func held(c *cache.Cache, typeURL string, names ...string) bool {
	for _, l := range c.Get(typeURL, names) {
		if l.Resource == nil {
			return false
		}
	}
	return true
}

// cdsNames is the resource_names of every CDS request cp received.
func cdsNames(cp *testcp.ControlPlane) [][]string {
	var out [][]string
	for _, req := range cp.SotWRequests() {
		if req.GetTypeUrl() == resourcev3.ClusterType {
			out = append(out, req.GetResourceNames())
		}
	}
	return out
}

// A group that watches Clusters under the wildcard and names x beside it
// (a Route's Cluster, fetched as a reference) asks with the legacy
// wildcard alone, on ADS and on the per-type service: go-control-plane's
// snapshot cache would answer "*" beside x with x alone. Every Cluster is
// held, and x's removal removes x alone.
func TestSotWWildcardBesideNames(t *testing.T) {
	for _, d := range []testcp.Dialect{testcp.DialectSotW, testcp.DialectPerType} {
		t.Run(string(d), func(t *testing.T) {
			cp := testcp.StartDialect(t, d)
			cp.Set(t, "c1", "1", testcp.Cluster("a"), testcp.Cluster("b"), testcp.Cluster("x"))
			c := cache.New(cache.Options{Retention: time.Minute})
			c.WatchWildcard(cache.NewWatch(), resourcev3.ClusterType)
			if err := c.Watch(cache.NewWatch(), resourcev3.ClusterType, "x"); err != nil {
				t.Fatal(err)
			}
			p := ProtocolSotW
			if d == testcp.DialectPerType {
				p = ProtocolSotWPerType
			}
			runSotW(t, dialTest(t, cp.Addr), Options{Cache: c, Protocol: p})
			eventually(t, "every Cluster held", func() bool { return held(c, resourcev3.ClusterType, "a", "b", "x") })

			cp.Set(t, "c1", "2", testcp.Cluster("a"), testcp.Cluster("b"))
			eventually(t, "x removed", func() bool { return c.Get(resourcev3.ClusterType, []string{"x"})[0].Absent })
			if !held(c, resourcev3.ClusterType, "a", "b") {
				t.Fatal("x's removal removed the other Clusters too")
			}
			for _, names := range cdsNames(cp) {
				if len(names) > 0 {
					t.Fatalf("a CDS request with names %q: want the legacy wildcard alone", names)
				}
			}
		})
	}
}

// A type named on the stream before the wildcard comes cannot ask for
// the wildcard in the legacy form on that stream ("How the client
// specifies what resources to return"): the stream is opened again, once,
// counted, and its CDS request carries no names and the node.
func TestSotWWildcardAfterNames(t *testing.T) {
	for _, d := range []testcp.Dialect{testcp.DialectSotW, testcp.DialectPerType} {
		t.Run(string(d), func(t *testing.T) {
			cp := testcp.StartDialect(t, d)
			cp.Set(t, "c1", "1", testcp.Cluster("a"), testcp.Cluster("b"), testcp.Cluster("x"))
			c := cache.New(cache.Options{Retention: time.Minute})
			if err := c.Watch(cache.NewWatch(), resourcev3.ClusterType, "x"); err != nil {
				t.Fatal(err)
			}
			p := ProtocolSotW
			if d == testcp.DialectPerType {
				p = ProtocolSotWPerType
			}
			m := NewMetrics(&metrics.Registry{})
			runSotW(t, dialTest(t, cp.Addr), Options{Cache: c, Metrics: m, Protocol: p})
			eventually(t, "x held", func() bool { return held(c, resourcev3.ClusterType, "x") })
			if held(c, resourcev3.ClusterType, "a") {
				t.Fatal("a held while only x is named")
			}

			c.WatchWildcard(cache.NewWatch(), resourcev3.ClusterType)
			eventually(t, "every Cluster held", func() bool { return held(c, resourcev3.ClusterType, "a", "b", "x") })
			if n := m.WildcardReopens.With("Cluster").Get(); n != 1 {
				t.Errorf("%d streams opened again for the wildcard, want 1", n)
			}
			reqs := cp.SotWRequests()
			last := -1
			for i, req := range reqs {
				if req.GetTypeUrl() == resourcev3.ClusterType && len(req.GetResourceNames()) == 0 {
					if last < 0 && req.GetNode() == nil {
						t.Error("the first wildcard request, of a new stream, carries no node")
					}
					last = i
				}
			}
			if last < 0 {
				t.Fatal("no CDS request with the legacy wildcard")
			}
			for _, req := range reqs[last:] {
				if req.GetTypeUrl() == resourcev3.ClusterType && len(req.GetResourceNames()) > 0 {
					t.Errorf("a CDS request with names %q after the wildcard", req.GetResourceNames())
				}
			}
		})
	}
}

// Under the wildcard no name goes upstream; when the wildcard leaves,
// every name the type keeps is asked for the first time, and those past
// MaxRequestBytes are refused: no request passes the bound.
func TestSotWWildcardLeavesNamesTooMany(t *testing.T) {
	cp := testcp.StartDialect(t, testcp.DialectSotW)
	names, rs := numbered("cluster", 100, func(n string) types.Resource { return testcp.Cluster(n) })
	cp.Set(t, "c1", "1", rs...)
	const bound = 1000
	c := cache.New(cache.Options{Retention: time.Millisecond})
	wild := cache.NewWatch()
	c.WatchWildcard(wild, resourcev3.ClusterType)
	if err := c.Watch(cache.NewWatch(), resourcev3.ClusterType, names...); err != nil {
		t.Fatal(err)
	}
	m := NewMetrics(&metrics.Registry{})
	runSotW(t, dialTest(t, cp.Addr), Options{Cache: c, Metrics: m, Protocol: ProtocolSotW, MaxRequestBytes: bound})
	eventually(t, "every Cluster held", func() bool { return held(c, resourcev3.ClusterType, names...) })
	if n := m.ListTooLarge.With("Cluster").Get(); n != 0 {
		t.Fatalf("%d names refused under the wildcard, which carries none", n)
	}

	c.UnwatchWildcard(wild, resourcev3.ClusterType)
	eventually(t, "the wildcard's retention over and the last name refused", func() bool {
		c.Sweep()
		return errorCode(c, resourcev3.ClusterType, names[99]) == codes.ResourceExhausted
	})
	if n := m.ListTooLarge.With("Cluster").Get(); n == 0 || n >= 100 {
		t.Fatalf("%d names refused, want some and not all", n)
	}
	requestsWithin(t, cp, bound)
}

// sotwClusters is a SotW Cluster response of version, nonce and the
// Clusters named (each with a connect timeout of its seconds), with errs
// as its resource errors, by name.
func sotwClusters(t *testing.T, version string, seconds map[string]int64, errs map[string]codes.Code) *discoverypb.DiscoveryResponse {
	t.Helper()
	resp := &discoverypb.DiscoveryResponse{TypeUrl: resourcev3.ClusterType, VersionInfo: version, Nonce: version}
	for _, n := range slices.Sorted(maps.Keys(seconds)) {
		c := testcp.Cluster(n)
		c.ConnectTimeout.Seconds = seconds[n]
		a, err := anypb.New(c)
		if err != nil {
			t.Fatal(err)
		}
		resp.Resources = append(resp.Resources, a)
	}
	for _, n := range slices.Sorted(maps.Keys(errs)) {
		resp.ResourceErrors = append(resp.ResourceErrors, &discoverypb.ResourceError{ResourceName: &discoverypb.ResourceName{Name: n},
			ErrorDetail: &rpcstatus.Status{Code: int32(errs[n]), Message: "from the tier above"}})
	}
	return resp
}

// An error is never absence (docs/architecture.md, invariant 21): a
// Cluster that a full-state response leaves out while it, or an earlier
// response on the stream, says UNAVAILABLE for it (as a relay of the
// tier above does when it cannot fetch it) is kept; one left out with
// NOT_FOUND, or once it has arrived again and its error is over, is
// removed.
func TestSotWErrorIsNotAbsence(t *testing.T) {
	cp := testcp.StartScriptedSotW(t)
	const cds = resourcev3.ClusterType
	c := cache.New(cache.Options{Retention: time.Minute})
	if err := c.Watch(cache.NewWatch(), cds, "x", "y", "z"); err != nil {
		t.Fatal(err)
	}
	runSotW(t, dialTest(t, cp.Addr), Options{Cache: c, Protocol: ProtocolSotW})
	st := cp.Stream(t)
	if req := st.Recv(); !slices.Equal(req.GetResourceNames(), []string{"x", "y", "z"}) {
		t.Fatalf("first request %v", req)
	}
	held := func(names ...string) bool {
		for _, l := range c.Get(cds, names) {
			if l.Resource == nil {
				return false
			}
		}
		return true
	}
	respond := func(resp *discoverypb.DiscoveryResponse) {
		t.Helper()
		st.Send(resp)
		if ack := st.Recv(); ack.GetResponseNonce() != resp.GetNonce() || ack.GetErrorDetail() != nil {
			t.Fatalf("answer to %s: %v", resp.GetNonce(), ack)
		}
	}
	respond(sotwClusters(t, "1", map[string]int64{"x": 1, "y": 1, "z": 1}, nil))
	eventually(t, "x, y and z held", func() bool { return held("x", "y", "z") })

	// x is left out with UNAVAILABLE, then with nothing (its error was
	// sent once): kept both times. z is left out with NOT_FOUND: removed.
	respond(sotwClusters(t, "2", map[string]int64{"y": 2}, map[string]codes.Code{"x": codes.Unavailable, "z": codes.NotFound}))
	respond(sotwClusters(t, "3", map[string]int64{"y": 3}, nil))
	// Each response is applied before it is ACKed.
	if l := c.Get(cds, []string{"x", "z"}); l[0].Resource == nil || l[0].Absent || !l[1].Absent {
		t.Fatalf("after x was left out with UNAVAILABLE and z with NOT_FOUND: x %+v, z %+v", l[0], l[1])
	}

	// x arrives again, so its error is over: left out now, it is removed.
	respond(sotwClusters(t, "4", map[string]int64{"x": 4, "y": 3}, nil))
	respond(sotwClusters(t, "5", map[string]int64{"y": 3}, nil))
	if l := c.Get(cds, []string{"x"})[0]; !l.Absent {
		t.Fatalf("x, left out once its error was over, is %+v", l)
	}
}

// sotwEndpoints is a SotW ClusterLoadAssignment response of version (its
// nonce too) carrying the named endpoints, each at port.
func sotwEndpoints(t *testing.T, version string, port map[string]int) *discoverypb.DiscoveryResponse {
	t.Helper()
	resp := &discoverypb.DiscoveryResponse{TypeUrl: resourcev3.EndpointType, VersionInfo: version, Nonce: version}
	for _, n := range slices.Sorted(maps.Keys(port)) {
		a, err := anypb.New(testcp.Endpoints(n, fmt.Sprintf("10.0.0.1:%d", port[n])))
		if err != nil {
			t.Fatal(err)
		}
		resp.Resources = append(resp.Resources, a)
	}
	return resp
}

// A SotW endpoints response is not a complete state: what one leaves out
// is kept, whatever the server sends later on the stream (a server may
// send only what changed). But a new stream, asked the wildcard with no
// version, must be sent everything the server has, in one response or
// several: what the relay holds that none of them carries within
// cache.retention is removed, and counted.
func TestSotWWildcardDropsWhatANewStreamDoesNotSend(t *testing.T) {
	cp := testcp.StartScriptedSotW(t)
	const eds = resourcev3.EndpointType
	const retention = 500 * time.Millisecond
	c := cache.New(cache.Options{Retention: retention})
	w := cache.NewWatch()
	c.WatchWildcard(w, eds)
	var imported []*cache.Resource
	for _, n := range []string{"a", "b", "gone"} { // as a warm restart restores them
		a, err := anypb.New(testcp.Endpoints(n, "10.0.0.1:1"))
		if err != nil {
			t.Fatal(err)
		}
		r, err := xds.Encode(n, "", a, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		imported = append(imported, r)
	}
	c.Import([]cache.TypeState{{TypeURL: eds, Resources: imported}})
	m := NewMetrics(&metrics.Registry{})
	runSotW(t, dialTest(t, cp.Addr), Options{Cache: c, Metrics: m, Protocol: ProtocolSotW})
	st := cp.Stream(t)
	if req := st.Recv(); req.GetTypeUrl() != eds || len(req.GetResourceNames()) != 0 || req.GetVersionInfo() != "" {
		t.Fatalf("first request %v, want the legacy wildcard with no version", req)
	}
	respond := func(resp *discoverypb.DiscoveryResponse) {
		t.Helper()
		st.Send(resp)
		if ack := st.Recv(); ack.GetResponseNonce() != resp.GetNonce() || ack.GetErrorDetail() != nil {
			t.Fatalf("answer to %s: %v", resp.GetNonce(), ack)
		}
	}
	// The server sends its state in two responses, then only what changes.
	start := time.Now()
	respond(sotwEndpoints(t, "1", map[string]int{"a": 1}))
	respond(sotwEndpoints(t, "2", map[string]int{"b": 1}))
	eventually(t, "gone to be removed", func() bool { return c.Get(eds, []string{"gone"})[0].Absent })
	if took := time.Since(start); took < retention-50*time.Millisecond {
		t.Errorf("gone removed %v after the request, before cache.retention (%v)", took, retention)
	}
	if got := m.StaleRemoved.With("ClusterLoadAssignment").Get(); got != 1 {
		t.Errorf("xdsrelay_upstream_sotw_stale_removed_total{ClusterLoadAssignment} %d, want 1", got)
	}
	for i := range 4 {
		respond(sotwEndpoints(t, strconv.Itoa(3+i), map[string]int{"a": 2 + i})) // b never again
		time.Sleep(retention / 2)
	}
	if l := c.Get(eds, []string{"a", "b"}); l[0].Resource == nil || l[1].Resource == nil {
		t.Fatalf("after %v of responses without b: a %+v, b %+v", 2*retention, l[0], l[1])
	}
}
