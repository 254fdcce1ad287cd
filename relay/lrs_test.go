package relay

import (
	"context"
	"fmt"
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
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
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
