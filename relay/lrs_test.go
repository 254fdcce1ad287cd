package relay

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clusterpb "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointpb "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	lrspb "github.com/envoyproxy/go-control-plane/envoy/service/load_stats/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// lrsCluster is an EDS cluster whose clients report load to the server
// they got it from (lrs_server: self).
func lrsCluster(name string) *clusterpb.Cluster {
	c := testcp.Cluster(name)
	c.LrsServer = &corepb.ConfigSource{ConfigSourceSpecifier: &corepb.ConfigSource_Self{Self: &corepb.SelfConfigSource{}}}
	return c
}

// greeters are the resources of xds:///greeter, its cluster reporting load,
// with its endpoint at backend.
func greeters(backend string) []types.Resource {
	return []types.Resource{testcp.Listener("greeter", "greeter-route"), testcp.Route("greeter-route", "greeter-cluster"),
		lrsCluster("greeter-cluster"), testcp.Endpoints("greeter-cluster", backend)}
}

// makeRPCs makes n RPCs on cc, each waiting for the channel to be ready,
// and fails the test unless every one succeeds: the client then reports n
// requests issued and n succeeded.
func makeRPCs(t *testing.T, cc *grpc.ClientConn, n int) {
	t.Helper()
	client := testgrpc.NewTestServiceClient(cc)
	for i := range n {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		_, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{}, grpc.WaitForReady(true))
		cancel()
		if err != nil {
			t.Fatalf("RPC %d of %d on %s: %v", i+1, n, cc.Target(), err)
		}
	}
}

// loadIs waits until the control plane's LRS server has been told of
// exactly want successful (and issued) requests to cluster, and checks
// that no more arrive for a few reporting periods.
func loadIs(t *testing.T, lrs *testcp.LRS, cluster string, want uint64, period time.Duration) {
	t.Helper()
	if !lrs.Wait(wait, func(l *testcp.LRS) bool { return l.Load(cluster).Succeeded >= want }) {
		t.Fatalf("the control plane was told of %+v for %s, want %d requests", lrs.Load(cluster), cluster, want)
	}
	lrs.Wait(5*period, func(*testcp.LRS) bool { return false })
	if got := lrs.Load(cluster); got.Succeeded != want || got.Issued != want || got.Errors != 0 {
		t.Fatalf("the control plane was told of %+v for %s, want exactly %d requests issued and succeeded", got, cluster, want)
	}
}

// Three real gRPC clients get a Cluster with lrs_server: self through the
// relay and make known numbers of RPCs to a backend: the control plane's
// LRS server receives exactly their sum, under the group's node, over one
// stream. Without the relay, the same clients open three.
func TestLoadReportsFromGRPCClients(t *testing.T) {
	const period = 50 * time.Millisecond
	backend := startBackend(t, "backend-1")
	rpcs := []int{3, 5, 7}
	for _, through := range []string{"relay", "direct"} {
		t.Run(through, func(t *testing.T) {
			cp := testcp.Start(t)
			cp.Set(t, "greeters", "1", greeters(backend)...)
			target := cp.Addr
			var r *Relay
			if through == "relay" {
				r = startRelay(t, cp.Addr, func(c *Config) { c.LRS.Interval = period })
				target = r.Addr()
			}
			// The control plane asks for its cluster every period.
			cp.LRS.Answer(t, lrsAnswer(period, "greeter-cluster"))
			total := 0
			for i, n := range rpcs {
				cc := grpcXDSClient(t, target, fmt.Sprintf("grpc-client-%d", i), "greeters", "xds:///greeter")
				makeRPCs(t, cc, n)
				total += n
			}
			loadIs(t, cp.LRS, "greeter-cluster", uint64(total), period)
			streams := cp.LRS.Streams()
			if through == "direct" {
				if len(streams) != len(rpcs) {
					t.Fatalf("the clients reporting directly opened %d streams, want %d", len(streams), len(rpcs))
				}
				return
			}
			if len(streams) != 1 {
				t.Fatalf("the control plane saw %d load report streams through the relay, want 1", len(streams))
			}
			if id := streams[0].Node.GetId(); !strings.HasPrefix(id, "xdsrelay~") || !strings.Contains(id, "cluster=greeters") || streams[0].Node.GetCluster() != "greeters" {
				t.Errorf("load reported under node %q (cluster %q), want the group's", id, streams[0].Node.GetCluster())
			}
			// Each client's load reports are in the group of its xDS
			// stream, though their node names one more client feature.
			var groups []debugGroup
			getJSON(t, r, "/debug/groups", &groups)
			if len(groups) != 1 || groups[0].Loads == nil || groups[0].Loads.Clients != 3 || groups[0].Clients != 6 {
				t.Errorf("/debug/groups: %+v; want one group of 3 xDS and 3 load report streams", groups)
			}
			m := getMetrics(t, r)
			for _, want := range []string{`xdsrelay_lrs_streams{side="downstream"} 3`, `xdsrelay_lrs_streams{side="upstream"} 1`, `xdsrelay_lrs_dropped_reports_total 0`} {
				if !strings.Contains(m, want) {
					t.Errorf("/metrics lacks %s", want)
				}
			}
		})
	}
}

// lrsAnswer is a control plane's LoadStatsResponse: clusters (every one if
// none) every period.
func lrsAnswer(period time.Duration, clusters ...string) *lrspb.LoadStatsResponse {
	return &lrspb.LoadStatsResponse{Clusters: clusters, SendAllClusters: len(clusters) == 0,
		LoadReportingInterval: durationpb.New(period)}
}

// lrsClient is a load-reporting client as Envoy is one: it sends its node
// with the send_all_clusters feature, and takes every response as a new
// period with what it asks.
type lrsClient = stream[lrspb.LoadStatsRequest, lrspb.LoadStatsResponse]

func openLRS(t *testing.T, addr string) *lrsClient {
	t.Helper()
	return newStream(t, lrspb.NewLoadReportingServiceClient(dial(t, addr)).StreamLoadStats)
}

func lrsNode(id, cluster, zone string) *corepb.Node {
	return &corepb.Node{Id: id, Cluster: cluster, Locality: &corepb.Locality{Region: "r", Zone: zone},
		ClientFeatures: []string{"envoy.lrs.supports_send_all_clusters"}}
}

// startLRSClient opens a client's stream, sends its node, and returns it
// with the relay's first response.
func startLRSClient(t *testing.T, addr string, n *corepb.Node) (*lrsClient, *lrspb.LoadStatsResponse) {
	t.Helper()
	c := openLRS(t, addr)
	c.send(&lrspb.LoadStatsRequest{Node: n})
	return c, c.recv()
}

// loadReport is a report of n successful requests to each cluster.
func loadReport(n uint64, clusters ...string) *lrspb.LoadStatsRequest {
	req := &lrspb.LoadStatsRequest{}
	for _, c := range clusters {
		req.ClusterStats = append(req.ClusterStats, &endpointpb.ClusterStats{ClusterName: c,
			LoadReportInterval: durationpb.New(time.Second),
			UpstreamLocalityStats: []*endpointpb.UpstreamLocalityStats{{Locality: &corepb.Locality{Region: "r", Zone: "backends"},
				TotalSuccessfulRequests: n, TotalIssuedRequests: n}}})
	}
	return req
}

// finish closes the client's side and waits for the relay to end the
// stream: every report it sent has been read.
func finish(t *testing.T, c *lrsClient) {
	t.Helper()
	if err := c.st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.done:
	case <-time.After(wait):
		t.Fatal("the relay did not end a stream the client closed")
	}
}

func wantAnswer(t *testing.T, resp *lrspb.LoadStatsResponse, all bool, interval time.Duration, clusters ...string) {
	t.Helper()
	if resp.GetSendAllClusters() != all || resp.GetLoadReportingInterval().AsDuration() != interval ||
		!slices.Equal(resp.GetClusters(), clusters) {
		t.Fatalf("told %v, want send_all_clusters %v, clusters %v, every %v", resp, all, clusters, interval)
	}
}

// An Envoy-style client, which takes every response as a new period, is
// told at once to report every cluster at lrs.interval while the control
// plane has not answered; then what the control plane asks, and again
// whenever that changes, and never the same thing twice. What it reports
// reaches the control plane.
func TestLoadReportsEnvoyStyleClient(t *testing.T) {
	cp := testcp.Start(t)
	cp.LRS.Hold()
	r := startRelay(t, cp.Addr, func(c *Config) { c.LRS.Interval = 300 * time.Millisecond })
	e, first := startLRSClient(t, r.Addr(), lrsNode("envoy-1", "c1", "z1"))
	wantAnswer(t, first, true, 300*time.Millisecond)

	cp.LRS.Answer(t, lrsAnswer(40*time.Millisecond, "a"))
	wantAnswer(t, e.recv(), false, 40*time.Millisecond, "a")
	cp.LRS.Answer(t, lrsAnswer(60*time.Millisecond, "b", "a"))
	wantAnswer(t, e.recv(), false, 60*time.Millisecond, "a", "b")
	cp.LRS.Answer(t, lrsAnswer(60*time.Millisecond, "a", "b"))
	e.quiet(200 * time.Millisecond) // the same again is no new period

	late, first := startLRSClient(t, r.Addr(), lrsNode("envoy-2", "c1", "z1"))
	wantAnswer(t, first, false, 60*time.Millisecond, "a", "b")
	e.send(loadReport(2, "a", "b"))
	late.send(loadReport(3, "a"))
	if !cp.LRS.Wait(wait, func(l *testcp.LRS) bool { return l.Load("a").Succeeded == 5 && l.Load("b").Succeeded == 2 }) {
		t.Fatalf("the control plane got %+v of a and %+v of b, want 5 and 2", cp.LRS.Load("a"), cp.LRS.Load("b"))
	}
	var groups []debugGroup
	getJSON(t, r, "/debug/groups", &groups)
	if len(groups) != 1 || groups[0].Loads == nil || groups[0].Loads.Clients != 2 || groups[0].Loads.Interval != "60ms" ||
		!groups[0].Loads.Answered || groups[0].Loads.Stream == nil || !groups[0].Loads.Stream.Connected ||
		groups[0].Loads.Stream.Server != cp.Addr {
		t.Errorf("/debug/groups: %+v", groups)
	}
}

// stopAfterReport stops cp right after its LRS server has received a
// report: none is in flight when it goes (LRS has no acknowledgement, so a
// report in flight when a control plane dies is lost to it, from the relay
// as from Envoy).
func stopAfterReport(t *testing.T, cp *testcp.ControlPlane) {
	t.Helper()
	got := make(chan struct{})
	var once sync.Once
	cp.LRS.OnReport(func(*testcp.LRSStream, *lrspb.LoadStatsRequest) { once.Do(func() { close(got) }) })
	defer cp.LRS.OnReport(nil)
	select {
	case <-got:
	case <-time.After(wait):
		t.Fatal("the control plane got no report")
	}
	cp.Stop()
}

// Faults: clients reconnect, the control plane restarts, and the relay
// falls back to a secondary and returns (gRFC A71): no count is lost or
// counted twice, against what the clients sent.
func TestLoadReportsSurviveFaults(t *testing.T) {
	const period = 100 * time.Millisecond
	primary, secondary := testcp.Start(t), testcp.Start(t)
	primary.Set(t, "c1", "1", lrsCluster("c"))
	secondary.Set(t, "c1", "1", lrsCluster("c"), testcp.Cluster("only-secondary"))
	for _, cp := range []*testcp.ControlPlane{primary, secondary} {
		cp.LRS.Answer(t, lrsAnswer(period))
	}
	r := startRelay(t, primary.Addr, fastReconnect, func(c *Config) {
		c.Upstream.Addresses = []string{secondary.Addr}
		c.Upstream.FallbackRecheck = 300 * time.Millisecond
		c.LRS.Interval = period
	})
	xds := openDelta(t, r.Addr()) // the group's xDS client
	xds.send(&discoverypb.DeltaDiscoveryRequest{Node: node("x", "c1"), TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"c"}})
	xds.recv()

	var sent uint64
	report := func(c *lrsClient, n uint64) {
		c.send(loadReport(n, "c"))
		sent += n
	}
	counted := func() uint64 { return primary.LRS.Load("c").Succeeded + secondary.LRS.Load("c").Succeeded }
	settled := func(after string) {
		t.Helper()
		eventually(t, fmt.Sprintf("%d requests counted %s", sent, after), func() bool { return counted() >= sent })
		primary.LRS.Wait(3*period, func(*testcp.LRS) bool { return false })
		if got := counted(); got != sent {
			t.Fatalf("%s: the control planes counted %d requests, the clients sent %d", after, got, sent)
		}
	}

	a, _ := startLRSClient(t, r.Addr(), lrsNode("a", "c1", "z1"))
	b, _ := startLRSClient(t, r.Addr(), lrsNode("b", "c1", "z1"))
	report(a, 3)
	report(b, 4)
	finish(t, a) // a reconnects
	a, _ = startLRSClient(t, r.Addr(), lrsNode("a", "c1", "z1"))
	report(a, 5)
	settled("after a client reconnected")

	stopAfterReport(t, primary)
	report(a, 6)
	report(b, 7)
	eventually(t, "reports held while the control plane is down", func() bool {
		var groups []debugGroup
		getJSON(t, r, "/debug/groups", &groups)
		return len(groups) == 1 && groups[0].Loads.Pending >= 2
	})
	primary.Restart()
	settled("after the control plane restarted")

	stopAfterReport(t, primary)
	report(a, 8)
	// A name the cache lacks moves the group's stream to the secondary.
	xds.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"only-secondary"}})
	for !slices.Contains(deltaNames(xds.recv()), "only-secondary") {
	}
	settled("after falling back to the secondary")
	if len(secondary.LRS.Streams()) != 1 {
		t.Fatalf("the secondary saw %d load report streams, want 1", len(secondary.LRS.Streams()))
	}
	before := len(primary.LRS.Streams())
	primary.Restart()
	eventually(t, "load reports back on the primary", func() bool { return len(primary.LRS.Streams()) > before })
	report(b, 9)
	finish(t, b)
	settled("after returning to the primary")
	if got := primary.LRS.Load("c").Succeeded; got < 9 {
		t.Errorf("the primary counted %d requests; the last 9 went elsewhere", got)
	}
	if m := getMetrics(t, r); !strings.Contains(m, "xdsrelay_lrs_dropped_reports_total 0\n") {
		t.Errorf("reports dropped:\n%s", m)
	}
}

// Bad input costs only its own stream: no node is INVALID_ARGUMENT, a
// report past downstream.max_request_bytes is RESOURCE_EXHAUSTED, and
// stats for a cluster the client was not told to report are ignored and
// counted; the good client's counts arrive whole.
func TestLoadReportsBadInput(t *testing.T) {
	cp := testcp.Start(t)
	cp.LRS.Answer(t, lrsAnswer(50*time.Millisecond, "a"))
	r := startRelay(t, cp.Addr, func(c *Config) { c.Downstream.MaxRequestBytes = 64 << 10 })
	good, told := startLRSClient(t, r.Addr(), lrsNode("good", "c1", "z1"))
	for len(told.GetClusters()) == 0 { // until told what the control plane asks: a
		told = good.recv()
	}
	open := lrspb.NewLoadReportingServiceClient(dial(t, r.Addr())).StreamLoadStats

	err := firstReply(t, open, &lrspb.LoadStatsRequest{})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "node") {
		t.Errorf("a first request without a node: %v, want INVALID_ARGUMENT", err)
	}
	big, err := open(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := big.Send(&lrspb.LoadStatsRequest{Node: lrsNode("big", "c1", "z1")}); err != nil {
		t.Fatal(err)
	}
	if _, err := big.Recv(); err != nil {
		t.Fatal(err)
	}
	huge := loadReport(1, "a")
	huge.ClusterStats[0].ClusterServiceName = strings.Repeat("x", 65<<10)
	if err := big.Send(huge); err != nil {
		t.Fatal(err)
	}
	if err := endOf(t, big.Recv); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a report past downstream.max_request_bytes: %v, want RESOURCE_EXHAUSTED", err)
	}

	good.send(loadReport(4, "a", "b"))
	good.send(loadReport(1, "a"))
	waitMetric(t, r, "xdsrelay_lrs_ignored_stats_total 1")
	if !cp.LRS.Wait(wait, func(l *testcp.LRS) bool { return l.Load("a").Succeeded == 5 }) {
		t.Fatalf("the control plane got %+v of a, want 5", cp.LRS.Load("a"))
	}
	if cp.LRS.Load("b").Reports != 0 {
		t.Error("a cluster the control plane did not ask for reached it")
	}
	waitMetric(t, r, `xdsrelay_lrs_reports_total{side="downstream"} 2`)
}

// LRS streams count toward limits.max_streams and
// limits.max_streams_per_connection, as xDS streams do.
func TestLoadReportsCountTowardStreamLimits(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("x"))
	r := startRelay(t, cp.Addr, func(c *Config) {
		c.Limits.MaxStreams = 2
		c.Limits.MaxStreamsPerConnection = 1
	})
	x := openDelta(t, r.Addr())
	x.send(cdsDelta(&discoverypb.DeltaDiscoveryRequest{Node: node("x", "c1")}, "x"))
	x.recv()
	l, _ := startLRSClient(t, r.Addr(), lrsNode("l", "c1", "z1"))
	open := lrspb.NewLoadReportingServiceClient(dial(t, r.Addr())).StreamLoadStats
	wantRefused(t, firstReply(t, open, &lrspb.LoadStatsRequest{Node: lrsNode("l2", "c1", "z1")}), "limits.max_streams")
	waitMetric(t, r, `xdsrelay_limit_refusals_total{limit="max_streams"} 1`)
	x.close()
	finish(t, l)

	// One stream a connection: an LRS stream waits behind an xDS one.
	cc := dial(t, r.Addr())
	xs := newStream(t, discoverypb.NewAggregatedDiscoveryServiceClient(cc).DeltaAggregatedResources)
	xs.send(cdsDelta(&discoverypb.DeltaDiscoveryRequest{Node: node("x", "c1")}, "x"))
	xs.recv()
	answered := make(chan error, 1)
	go func() {
		answered <- firstReply(t, lrspb.NewLoadReportingServiceClient(cc).StreamLoadStats, &lrspb.LoadStatsRequest{Node: lrsNode("l3", "c1", "z1")})
	}()
	select {
	case err := <-answered:
		t.Fatalf("an LRS stream was served (error %v) beside an xDS stream on a connection allowed one", err)
	case <-time.After(300 * time.Millisecond):
	}
	xs.close()
	select {
	case err := <-answered:
		if err != nil {
			t.Fatalf("the LRS stream, once the xDS stream ended: %v", err)
		}
	case <-time.After(wait):
		t.Fatal("the LRS stream was not served once the xDS stream ended")
	}
}

// A client's certificate decides the nodes it may claim on LRS as on xDS.
func TestLoadReportsAuthorization(t *testing.T) {
	r, cp, ca := startTenantRelay(t)
	cc := ca.dialAs(r.Addr(), ca.client("spiffe://example.org/tenant/a"))
	open := lrspb.NewLoadReportingServiceClient(cc).StreamLoadStats
	if err := firstReply(t, open, &lrspb.LoadStatsRequest{Node: lrsNode("a-1", "tenant-a", "z1")}); err != nil {
		t.Fatalf("tenant-a's own node: %v", err)
	}
	err := firstReply(t, open, &lrspb.LoadStatsRequest{Node: lrsNode("a-1", "tenant-b", "z1")})
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("tenant-a claiming tenant-b's node: %v, want PERMISSION_DENIED", err)
	}
	if r.groupCache(keyOf("tenant-b")) != nil || len(cp.LRS.Streams()) > 1 {
		t.Error("a denied client made a group or a load report stream")
	}
	waitMetric(t, r, `xdsrelay_downstream_denied_total{reason="node",variant="lrs"} 1`)
}

// The group's stream to the control plane closes cache.retention after
// the last reporting client leaves, with a last report of what was left;
// then the group ends.
func TestLoadReportsStreamClosesAfterRetention(t *testing.T) {
	cp := testcp.Start(t)
	cp.LRS.Answer(t, lrsAnswer(time.Hour)) // no report but the last
	r := startRelay(t, cp.Addr, func(c *Config) { c.Cache.Retention = 300 * time.Millisecond })
	c, _ := startLRSClient(t, r.Addr(), lrsNode("a", "c1", "z1"))
	c.send(loadReport(6, "a"))
	finish(t, c)
	left := time.Now()
	if !cp.LRS.Wait(wait, func(l *testcp.LRS) bool { return l.Load("a").Succeeded == 6 }) {
		t.Fatalf("the last report did not arrive: %+v", cp.LRS.Load("a"))
	}
	if since := time.Since(left); since < 300*time.Millisecond {
		t.Errorf("the stream closed %v after the last client left, before cache.retention", since)
	}
	eventually(t, "the group to end", func() bool { return r.groupCache(keyOf("c1")) == nil })
	waitMetric(t, r, `xdsrelay_lrs_streams{side="upstream"} 0`)
	if n := len(cp.LRS.Streams()); n != 1 {
		t.Errorf("%d load report streams, want 1", n)
	}
}

// While the control plane cannot be reached, the relay holds
// lrs.max_pending of its reports; past that the oldest is dropped and
// counted, never silently.
func TestLoadReportsMaxPending(t *testing.T) {
	cp := testcp.Start(t)
	cp.LRS.Answer(t, lrsAnswer(30*time.Millisecond))
	r := startRelay(t, cp.Addr, fastReconnect, func(c *Config) { c.LRS.MaxPending = 2 })
	c, _ := startLRSClient(t, r.Addr(), lrsNode("a", "c1", "z1"))
	waitMetric(t, r, `xdsrelay_lrs_streams{side="upstream"} 1`)
	stopAfterReport(t, cp)
	c.send(loadReport(1, "a"))
	eventually(t, "a report dropped", func() bool { return !strings.Contains(getMetrics(t, r), "xdsrelay_lrs_dropped_reports_total 0\n") })
	var groups []debugGroup
	getJSON(t, r, "/debug/groups", &groups)
	if groups[0].Loads.Pending != 2 {
		t.Errorf("%d reports held, want lrs.max_pending (2)", groups[0].Loads.Pending)
	}
}

// Clients of one group that report from different zones while
// upstream.group_by holds no locality field are warned about once for the
// relay (a second such group adds nothing), in the log and on /readyz;
// with a locality field in the key, they are in groups of their own and
// nothing is said.
func TestLoadReportsZonesWarning(t *testing.T) {
	for _, byZone := range []bool{false, true} {
		cp := testcp.Start(t)
		logs := &logBuffer{}
		r := startRelayLogged(t, cp.Addr, slog.New(slog.NewJSONHandler(logs, nil)), func(c *Config) {
			if byZone {
				c.Upstream.GroupBy = append(c.Upstream.GroupBy, "locality.zone")
			}
		})
		for i, zone := range []string{"z1", "z1", "z2", "z3"} {
			startLRSClient(t, r.Addr(), lrsNode(fmt.Sprint("n", i), "c1", zone))
		}
		for i, zone := range []string{"z1", "z2"} {
			startLRSClient(t, r.Addr(), lrsNode(fmt.Sprint("m", i), "c2", zone))
		}
		warned := strings.Count(logs.String(), "report load from different zones")
		ready := strings.Count(readyz(t, r), "report load from different zones")
		if byZone && (warned != 0 || ready != 0) || !byZone && (warned != 1 || ready != 1) {
			t.Errorf("grouped by zone %v: warned %d times in the log, %d on /readyz", byZone, warned, ready)
		}
	}
}

// With several control planes, load reports go to the one that serves the
// Clusters; with resource files, clients are told nothing is asked for.
func TestLoadReportsGoToTheClustersControlPlane(t *testing.T) {
	def, clusters := testcp.Start(t), testcp.Start(t)
	clusters.LRS.Answer(t, lrsAnswer(30*time.Millisecond, "a"))
	r := startRelay(t, def.Addr, withUpstream("clusters", clusters.Addr, []string{resourcev3.ClusterType}, nil))
	c, _ := startLRSClient(t, r.Addr(), lrsNode("n", "c1", "z1"))
	c.send(loadReport(2, "a"))
	if !clusters.LRS.Wait(wait, func(l *testcp.LRS) bool { return l.Load("a").Succeeded == 2 }) {
		t.Fatalf("the Clusters' control plane got %+v", clusters.LRS.Load("a"))
	}
	if n := len(def.LRS.Streams()); n != 0 {
		t.Errorf("the default control plane saw %d load report streams", n)
	}

	files := startRelay(t, FilePrefix+t.TempDir())
	_, told := startLRSClient(t, files.Addr(), lrsNode("n", "c1", "z1"))
	wantAnswer(t, told, false, 10*time.Second)
}

// On shutdown, each group's reporter sends what its clients reported since
// its last report before the relay closes its connection upstream.
func TestLoadReportsSentOnShutdown(t *testing.T) {
	cp := testcp.Start(t)
	cp.LRS.Answer(t, lrsAnswer(time.Hour)) // no report but the last
	r := startRelay(t, cp.Addr)
	c, _ := startLRSClient(t, r.Addr(), lrsNode("a", "c1", "z1"))
	eventually(t, "the control plane to answer the relay", func() bool {
		var groups []debugGroup
		getJSON(t, r, "/debug/groups", &groups)
		return len(groups) == 1 && groups[0].Loads != nil && groups[0].Loads.Answered
	})
	c.send(loadReport(3, "a"))
	waitMetric(t, r, `xdsrelay_lrs_reports_total{side="downstream"} 1`)
	shutdown(t, r)
	if got := cp.LRS.Load("a").Succeeded; got != 3 {
		t.Errorf("the control plane counted %d requests once the relay had shut down, want 3", got)
	}
}

// Load reports go to the control plane that serves the group's Clusters by
// their names (docs/control-planes.md): Clusters named under an xdstp
// authority that upstreams[] lists are that upstream's, and so are their
// load reports, presented with that upstream's node; the upstream that
// serves the type by default gets none.
func TestLoadReportsFollowXdstpClusters(t *testing.T) {
	def, meshB := testcp.Start(t), testcp.Start(t)
	const cluster = "xdstp://mesh-b/envoy.config.cluster.v3.Cluster/c-b"
	meshB.Set(t, "c1", "1", testcp.Cluster(cluster))
	for _, cp := range []*testcp.ControlPlane{def, meshB} {
		cp.LRS.Answer(t, lrsAnswer(50*time.Millisecond))
	}
	r := startRelay(t, def.Addr, withUpstream("mesh-b", meshB.Addr, nil, []string{"mesh-b"}), func(c *Config) {
		c.Upstreams[0].Node.ID = "mesh-b-{cluster}"
	})
	d := openDelta(t, r.Addr())
	d.send(&discoverypb.DeltaDiscoveryRequest{Node: node("envoy-1", "c1"), TypeUrl: resourcev3.ClusterType,
		ResourceNamesSubscribe: []string{cluster}})
	if got := deltaNames(d.recvWithin(wait)); !slices.Equal(got, []string{cluster}) {
		t.Fatalf("cluster: %v", got)
	}
	e, _ := startLRSClient(t, r.Addr(), lrsNode("envoy-1", "c1", "z1"))
	e.send(loadReport(4, cluster))
	if !meshB.LRS.Wait(wait, func(l *testcp.LRS) bool { return l.Load(cluster).Succeeded == 4 }) {
		t.Fatalf("mesh-b's control plane got %+v; the default's %+v", meshB.LRS.Load(cluster), def.LRS.Load(cluster))
	}
	if n := len(def.LRS.Streams()); n != 0 {
		t.Errorf("the default control plane, which serves no Cluster of the group, got %d load report streams", n)
	}
	if s := meshB.LRS.Streams(); len(s) != 1 || meshB.LRS.Reports(s[0])[0].GetNode().GetId() != "mesh-b-c1" {
		t.Errorf("mesh-b's control plane was not sent mesh-b's node on its load report stream")
	}
}
