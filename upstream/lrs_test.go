package upstream

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointpb "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	lrspb "github.com/envoyproxy/go-control-plane/envoy/service/load_stats/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/xdsrelay/xdsrelay/internal/metrics"
	"github.com/xdsrelay/xdsrelay/internal/testcp"
	"github.com/xdsrelay/xdsrelay/internal/testlog"
	"github.com/xdsrelay/xdsrelay/loadstats"
)

const lrsWait = 10 * time.Second

func lrsServer(t *testing.T, cp *testcp.ControlPlane) Server {
	t.Helper()
	cc, err := grpc.NewClient(cp.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return Server{Name: cp.Addr, Conn: cc}
}

func newLoadStore(t *testing.T) *loadstats.Store {
	t.Helper()
	s, err := loadstats.New(loadstats.Options{Interval: 50 * time.Millisecond, MinInterval: time.Millisecond, MaxPending: 1000, MaxNames: 100_000, MaxPendingBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// runLoadReporter runs a reporter until the test ends (or the returned
// stop), reporting to the server that server returns; mutate changes its
// options.
func runLoadReporter(t *testing.T, store *loadstats.Store, server func() (Server, bool), m LoadMetrics, mutate ...func(*LoadReporterOptions)) (stop func()) {
	t.Helper()
	opts := LoadReporterOptions{Store: store, Node: &corepb.Node{Id: "relay~group", Cluster: "c1"},
		Server: server, Group: "cluster=c1", Metrics: m, Logger: slog.New(slog.DiscardHandler),
		Backoff:     backoff.Config{BaseDelay: 10 * time.Millisecond, Multiplier: 1.6, MaxDelay: 50 * time.Millisecond},
		SendTimeout: lrsWait}
	for _, f := range mutate {
		f(&opts)
	}
	lr, err := NewLoadReporter(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		lr.Run(ctx)
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case <-done:
			case <-time.After(lrsWait):
				t.Error("the load reporter did not end")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// waitPending waits until the store holds at least n periods undelivered.
func waitPending(t *testing.T, store *loadstats.Store, n int) {
	t.Helper()
	deadline := time.Now().Add(lrsWait)
	for store.Status().Pending < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d periods held, want %d", store.Status().Pending, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func fixed(s Server) func() (Server, bool) { return func() (Server, bool) { return s, true } }

// reportRequests has r report n successful requests to cluster c, one a
// report.
func reportRequests(r *loadstats.Reporter, c string, n int) {
	for range n {
		r.Report([]*endpointpb.ClusterStats{{ClusterName: c, UpstreamLocalityStats: []*endpointpb.UpstreamLocalityStats{
			{Locality: &corepb.Locality{Zone: "z"}, TotalSuccessfulRequests: 1, TotalIssuedRequests: 1}}}})
	}
}

// A group's reporter opens one stream under the group's node (with the
// send_all_clusters feature), tells the store what the control plane asks,
// and sends the store's sums on the control plane's interval; its last
// report goes out when it ends.
func TestLoadReporterSendsSums(t *testing.T) {
	cp := testcp.Start(t)
	cp.LRS.Answer(t, &lrspb.LoadStatsResponse{Clusters: []string{"a"}, LoadReportingInterval: durationpb.New(30 * time.Millisecond)})
	store := newLoadStore(t)
	reg := metrics.New(metrics.Options{})
	m := LoadMetrics{Streams: reg.Gauge("s", "s").With(), Reports: reg.Counter("r", "r").With()}
	stop := runLoadReporter(t, store, fixed(lrsServer(t, cp)), m)
	r := store.Join(&corepb.Node{}, func() {})
	r.Next()
	if !cp.LRS.Wait(lrsWait, func(*testcp.LRS) bool { return slices.Equal(store.Instructions().Clusters, []string{"a"}) }) {
		t.Fatalf("the store was not told the control plane's clusters: %+v", store.Instructions())
	}
	r.Next()
	reportRequests(r, "a", 5)
	if !cp.LRS.Wait(lrsWait, func(l *testcp.LRS) bool { return l.Load("a").Succeeded == 5 }) {
		t.Fatalf("the control plane got %+v of cluster a, want 5 requests", cp.LRS.Load("a"))
	}
	reportRequests(r, "a", 3)
	reportRequests(r, "b", 3) // not asked for
	stop()
	if got := cp.LRS.Load("a"); got.Succeeded != 8 || cp.LRS.Load("b").Reports != 0 {
		t.Errorf("after the last report the control plane has %+v of a and %+v of b, want 8 and none", got, cp.LRS.Load("b"))
	}
	streams := cp.LRS.Streams()
	if len(streams) != 1 || streams[0].Node.GetId() != "relay~group" ||
		!slices.Contains(streams[0].Node.GetClientFeatures(), "envoy.lrs.supports_send_all_clusters") {
		t.Fatalf("streams %d, first node %v: want one, under the group's node with send_all_clusters", len(streams), streams[0].Node)
	}
	for _, req := range cp.LRS.Reports(streams[0])[1:] {
		if req.GetNode() != nil {
			t.Error("a report after the first request carries the node")
		}
		for _, cs := range req.GetClusterStats() {
			if cs.GetLoadReportInterval().AsDuration() <= 0 {
				t.Errorf("cluster %s reported over %v", cs.GetClusterName(), cs.GetLoadReportInterval())
			}
		}
	}
	if m.Streams.Get() != 0 || m.Reports.Get() == 0 {
		t.Errorf("streams %d, reports %d: want 0 once ended, and some", m.Streams.Get(), m.Reports.Get())
	}
}

// While the control plane is down, periods end and are held; once it is
// back, one report carries them all, over the whole time since the last
// one. Nothing is lost or sent twice.
func TestLoadReporterHoldsWhileDown(t *testing.T) {
	cp := testcp.Start(t)
	cp.LRS.Answer(t, &lrspb.LoadStatsResponse{SendAllClusters: true, LoadReportingInterval: durationpb.New(20 * time.Millisecond)})
	store := newLoadStore(t)
	runLoadReporter(t, store, fixed(lrsServer(t, cp)), LoadMetrics{})
	r := store.Join(&corepb.Node{}, func() {})
	r.Next()
	reportRequests(r, "a", 2)
	if !cp.LRS.Wait(lrsWait, func(l *testcp.LRS) bool { return l.Load("a").Succeeded == 2 }) {
		t.Fatalf("the control plane got %+v", cp.LRS.Load("a"))
	}
	// Stop right after a report, so that none is in flight.
	stopped := make(chan struct{})
	var once sync.Once
	cp.LRS.OnReport(func(*testcp.LRSStream, *lrspb.LoadStatsRequest) { once.Do(func() { close(stopped) }) })
	select {
	case <-stopped:
	case <-time.After(lrsWait):
		t.Fatal("no report after the first")
	}
	cp.Stop()
	down := time.Now()
	reportRequests(r, "a", 7)
	waitPending(t, store, 2) // periods end while it is down
	reportRequests(r, "a", 1)
	cp.Restart()
	if !cp.LRS.Wait(lrsWait, func(l *testcp.LRS) bool { return l.Load("a").Succeeded >= 10 }) {
		t.Fatalf("the control plane got %+v after it came back", cp.LRS.Load("a"))
	}
	streams := cp.LRS.Streams()
	var merged *endpointpb.ClusterStats
	for _, req := range cp.LRS.Reports(streams[len(streams)-1]) {
		if cs := testcp.ClusterStats(req, "a"); cs != nil && merged == nil {
			merged = cs
		}
	}
	if merged == nil || merged.GetLoadReportInterval().AsDuration() < time.Since(down)-time.Since(down)/2 {
		t.Errorf("the report after the outage spans %v; the outage began %v ago", merged.GetLoadReportInterval().AsDuration(), time.Since(down))
	}
	cp.LRS.Wait(100*time.Millisecond, func(*testcp.LRS) bool { return false }) // a few more periods
	if got := cp.LRS.Load("a").Succeeded; got != 10 {
		t.Errorf("the control plane counted %d requests, want 10", got)
	}
}

// When the group's stream moves to another server, the reports follow at
// the next period: the first server's stream ends, the other's opens.
func TestLoadReporterFollowsServer(t *testing.T) {
	primary, secondary := testcp.Start(t), testcp.Start(t)
	for _, cp := range []*testcp.ControlPlane{primary, secondary} {
		cp.LRS.Answer(t, &lrspb.LoadStatsResponse{SendAllClusters: true, LoadReportingInterval: durationpb.New(20 * time.Millisecond)})
	}
	servers := []Server{lrsServer(t, primary), lrsServer(t, secondary)}
	var cur atomic.Int32
	store := newLoadStore(t)
	runLoadReporter(t, store, func() (Server, bool) { return servers[cur.Load()], true }, LoadMetrics{})
	r := store.Join(&corepb.Node{}, func() {})
	r.Next()
	reportRequests(r, "a", 1)
	if !primary.LRS.Wait(lrsWait, func(l *testcp.LRS) bool { return l.Load("a").Succeeded == 1 }) {
		t.Fatal("nothing reached the primary")
	}
	cur.Store(1)
	if !secondary.LRS.Wait(lrsWait, func(l *testcp.LRS) bool { return len(l.Streams()) == 1 }) {
		t.Fatal("the reports did not follow to the secondary")
	}
	reportRequests(r, "a", 4)
	if !secondary.LRS.Wait(lrsWait, func(l *testcp.LRS) bool { return l.Load("a").Succeeded == 4 }) {
		t.Fatalf("the secondary got %+v", secondary.LRS.Load("a"))
	}
	cur.Store(0)
	reportRequests(r, "a", 2)
	if !primary.LRS.Wait(lrsWait, func(l *testcp.LRS) bool { return l.Load("a").Succeeded == 3 }) {
		t.Fatalf("back on the primary, it got %+v", primary.LRS.Load("a"))
	}
	if n := len(primary.LRS.Streams()); n != 2 {
		t.Errorf("the primary saw %d streams, want 2", n)
	}
}

// A report larger than MaxRequestBytes goes in parts, a cluster whole in
// each.
func TestPackStats(t *testing.T) {
	var stats []*endpointpb.ClusterStats
	for i := range 10 {
		stats = append(stats, &endpointpb.ClusterStats{ClusterName: string(rune('a' + i)), ClusterServiceName: string(make([]byte, 100))})
	}
	parts := packStats(stats, 250)
	if len(parts) != 5 || !slices.Equal(slices.Concat(parts...), stats) {
		t.Errorf("%d parts, want 5 of two clusters each", len(parts))
	}
	if parts := packStats(nil, 250); len(parts) != 1 || len(parts[0]) != 0 {
		t.Errorf("no stats: %d parts, want one empty report", len(parts))
	}
	if parts := packStats(stats[:2], 10); len(parts) != 2 {
		t.Errorf("clusters larger than the bound: %d parts, want one each", len(parts))
	}
}

// Reports wait for the control plane's first response (the interval is
// its to set): periods end and are held meanwhile, and go out once it has
// answered.
func TestLoadReporterWaitsForTheControlPlanesAnswer(t *testing.T) {
	cp := testcp.Start(t)
	cp.LRS.Hold()
	store := newLoadStore(t)
	runLoadReporter(t, store, fixed(lrsServer(t, cp)), LoadMetrics{})
	r := store.Join(&corepb.Node{}, func() {})
	r.Next()
	reportRequests(r, "a", 3)
	if !cp.LRS.Wait(lrsWait, func(l *testcp.LRS) bool { return len(l.Streams()) == 1 }) {
		t.Fatal("the reporter opened no stream")
	}
	waitPending(t, store, 3) // held, not sent
	if n := len(cp.LRS.Reports(cp.LRS.Streams()[0])); n != 1 {
		t.Fatalf("%d requests before the control plane answered, want the first (the node) alone", n)
	}
	cp.LRS.Answer(t, &lrspb.LoadStatsResponse{SendAllClusters: true, LoadReportingInterval: durationpb.New(20 * time.Millisecond)})
	if !cp.LRS.Wait(lrsWait, func(l *testcp.LRS) bool { return l.Load("a").Succeeded == 3 }) {
		t.Fatalf("once it answered, the control plane got %+v", cp.LRS.Load("a"))
	}
}

// A period's report larger than MaxRequestBytes goes in parts, none past
// the bound, a cluster whole in each; the control plane gets it all.
func TestLoadReporterSendsReportsInParts(t *testing.T) {
	cp := testcp.Start(t)
	cp.LRS.Answer(t, &lrspb.LoadStatsResponse{SendAllClusters: true, LoadReportingInterval: durationpb.New(20 * time.Millisecond)})
	store := newLoadStore(t)
	const bound = 100
	runLoadReporter(t, store, fixed(lrsServer(t, cp)), LoadMetrics{}, func(o *LoadReporterOptions) { o.MaxRequestBytes = bound })
	r := store.Join(&corepb.Node{}, func() {})
	r.Next()
	clusters := []string{"a", "b", "c", "d", "e", "f"}
	var stats []*endpointpb.ClusterStats
	for _, c := range clusters {
		stats = append(stats, &endpointpb.ClusterStats{ClusterName: c, UpstreamLocalityStats: []*endpointpb.UpstreamLocalityStats{
			{Locality: &corepb.Locality{Zone: "z"}, TotalSuccessfulRequests: 1, TotalIssuedRequests: 1}}})
	}
	r.Report(stats) // one report: one period
	if !cp.LRS.Wait(lrsWait, func(l *testcp.LRS) bool {
		return !slices.ContainsFunc(clusters, func(c string) bool { return l.Load(c).Succeeded != 1 })
	}) {
		t.Fatal("the control plane did not get every cluster once")
	}
	parts := 0
	for _, req := range cp.LRS.Reports(cp.LRS.Streams()[0])[1:] {
		if n := proto.Size(req); n > bound {
			t.Errorf("a report of %d bytes, past MaxRequestBytes (%d)", n, bound)
		}
		if len(req.GetClusterStats()) > 0 {
			parts++
		}
	}
	if parts < 2 {
		t.Errorf("the period's report went in %d requests, want it in parts", parts)
	}
}

// A reporter told to wait for an earlier one (After) opens no stream until
// that one has ended, and still stops at once when told to.
func TestLoadReporterWaitsForTheOneBefore(t *testing.T) {
	cp := testcp.Start(t)
	store := newLoadStore(t)
	earlier := make(chan struct{})
	runLoadReporter(t, store, fixed(lrsServer(t, cp)), LoadMetrics{}, func(o *LoadReporterOptions) { o.After = earlier })
	if cp.LRS.Wait(200*time.Millisecond, func(l *testcp.LRS) bool { return len(l.Streams()) > 0 }) {
		t.Fatal("a stream opened before the earlier reporter ended")
	}
	close(earlier)
	if !cp.LRS.Wait(lrsWait, func(l *testcp.LRS) bool { return len(l.Streams()) == 1 }) {
		t.Fatal("no stream once the earlier reporter had ended")
	}
	// One whose earlier reporter never ends stops when told to (stop
	// fails the test if it does not).
	runLoadReporter(t, store, fixed(lrsServer(t, cp)), LoadMetrics{}, func(o *LoadReporterOptions) { o.After = make(chan struct{}) })()
}

// A control plane that answers and then reads nothing: a send that does
// not return within SendTimeout ends the stream, logged with why, the
// stats of the report written before it (never read) are counted
// (send_blocked), and the stream is opened again. What was not written
// goes on a stream that reads, none of it twice; the reporter still stops
// when told to.
func TestLoadReporterControlPlaneNeverReads(t *testing.T) {
	cp := testcp.StartWith(t, grpc.InitialWindowSize(64<<10), grpc.InitialConnWindowSize(64<<10))
	cp.LRS.Answer(t, &lrspb.LoadStatsResponse{SendAllClusters: true, LoadReportingInterval: durationpb.New(20 * time.Millisecond)})
	cp.LRS.NeverRead()
	store := newLoadStore(t)
	reg := metrics.New(metrics.Options{})
	m := LoadMetrics{Streams: reg.Gauge("s", "s").With(), Reports: reg.Counter("r", "r").With(), Blocked: reg.Counter("b", "b").With()}
	logs := &testlog.Buffer{}
	stop := runLoadReporter(t, store, fixed(lrsServer(t, cp)), m, func(o *LoadReporterOptions) {
		o.SendTimeout = 100 * time.Millisecond
		o.MaxRequestBytes = 32 << 10
		o.Logger = slog.New(slog.NewJSONHandler(logs, nil))
	})
	r := store.Join(&corepb.Node{}, func() {})
	r.Next()
	// 1,000 clusters with long names: about 300 KiB a period, past the
	// stream's window.
	var stats []*endpointpb.ClusterStats
	for i := range 1000 {
		stats = append(stats, &endpointpb.ClusterStats{ClusterName: fmt.Sprintf("1%0299d", i), UpstreamLocalityStats: []*endpointpb.UpstreamLocalityStats{
			{Locality: &corepb.Locality{Zone: "z"}, TotalSuccessfulRequests: 1}}})
	}
	r.Report(stats)
	if !cp.LRS.Wait(lrsWait, func(l *testcp.LRS) bool { return len(l.Streams()) >= 2 && m.Blocked.Get() > 0 }) {
		t.Fatalf("%d streams, %d stats counted blocked: want the blocked stream ended, counted and opened again", len(cp.LRS.Streams()), m.Blocked.Get())
	}
	if got := m.Blocked.Get(); got > 1000 {
		t.Errorf("%d cluster stats counted blocked, want at most the 1,000 reported", got)
	}
	if ended := logs.Lines(t, "load report stream ended; reconnecting"); len(ended) == 0 || !strings.Contains(fmt.Sprint(ended[0]["error"]), "lrs.send_timeout") {
		t.Errorf("the log does not say why the stream ended: %v", ended)
	}
	// Once it reads again, a second batch goes out on a stream that reads
	// (a stream that took reports and does not read is found at the next
	// send that blocks); nothing is sent twice, and whatever did not
	// arrive was lost with a stream that never read it.
	cp.LRS.ReadAgain()
	name := func(batch, i int) string { return fmt.Sprintf("%d%0299d", batch, i) }
	var batch []*endpointpb.ClusterStats
	for i := range 1000 {
		batch = append(batch, &endpointpb.ClusterStats{ClusterName: name(2, i), UpstreamLocalityStats: []*endpointpb.UpstreamLocalityStats{
			{Locality: &corepb.Locality{Zone: "z"}, TotalSuccessfulRequests: 1}}})
	}
	r.Report(batch)
	received := func() (n int, twice bool) {
		for b := 1; b <= 2; b++ {
			for i := range 1000 {
				ld := cp.LRS.Load(name(b, i))
				n += ld.Reports
				twice = twice || ld.Reports > 1
			}
		}
		return n, twice
	}
	if !cp.LRS.Wait(lrsWait, func(l *testcp.LRS) bool { return l.Load(name(2, 999)).Reports > 0 }) {
		n, _ := received()
		t.Errorf("the control plane got %d clusters once it read again, %d counted blocked: want the second batch", n, m.Blocked.Get())
	}
	if n, twice := received(); twice || int64(n)+m.Blocked.Get() > 2000 {
		t.Errorf("%d clusters received and %d counted blocked, of 2,000; a cluster twice: %v", n, m.Blocked.Get(), twice)
	}
	stop() // bounded: fails the test if the reporter does not end
	if m.Streams.Get() != 0 {
		t.Errorf("%d streams open after the reporter ended", m.Streams.Get())
	}
}

// One cluster's stats larger than MaxRequestBytes are cut by locality (and
// a locality's by endpoint), not sent in one oversized request
// (docs/architecture.md, invariant 9): no request passes the bound, and
// the control plane's sums are the report's, drops counted once.
func TestLoadReporterCutsAClusterLargerThanTheBound(t *testing.T) {
	cp := testcp.Start(t)
	cp.LRS.Answer(t, &lrspb.LoadStatsResponse{SendAllClusters: true, LoadReportingInterval: durationpb.New(20 * time.Millisecond),
		ReportEndpointGranularity: true})
	store := newLoadStore(t)
	const bound = 300
	runLoadReporter(t, store, fixed(lrsServer(t, cp)), LoadMetrics{}, func(o *LoadReporterOptions) { o.MaxRequestBytes = bound })
	r := store.Join(&corepb.Node{}, func() {})
	for end := time.Now().Add(lrsWait); !store.Instructions().EndpointGranularity; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the control plane's instructions never reached the store")
		}
	}
	r.Next()
	cs := &endpointpb.ClusterStats{ClusterName: "big", TotalDroppedRequests: 7}
	for i := range 40 {
		ls := &endpointpb.UpstreamLocalityStats{Locality: &corepb.Locality{Zone: fmt.Sprint("zone-", i)},
			TotalSuccessfulRequests: 1, TotalIssuedRequests: 1}
		if i == 0 { // one locality larger than the bound alone: cut by endpoint
			for j := range 40 {
				ls.UpstreamEndpointStats = append(ls.UpstreamEndpointStats, &endpointpb.UpstreamEndpointStats{
					Address: &corepb.Address{Address: &corepb.Address_SocketAddress{SocketAddress: &corepb.SocketAddress{
						Address: fmt.Sprintf("10.0.0.%d", j), PortSpecifier: &corepb.SocketAddress_PortValue{PortValue: 80}}}},
					TotalSuccessfulRequests: 1, TotalIssuedRequests: 1})
			}
		}
		cs.UpstreamLocalityStats = append(cs.UpstreamLocalityStats, ls)
	}
	if n := proto.Size(cs); n <= 4*bound {
		t.Fatalf("the cluster's stats are %d bytes: too small to prove anything", n)
	}
	r.Report([]*endpointpb.ClusterStats{cs})
	if !cp.LRS.Wait(lrsWait, func(l *testcp.LRS) bool { return l.Load("big").Succeeded == 40 }) {
		t.Fatalf("the control plane got %+v, want 40 successes", cp.LRS.Load("big"))
	}
	endpoints := 0
	for _, req := range cp.LRS.Reports(cp.LRS.Streams()[0])[1:] {
		if n := proto.Size(req); n > bound {
			t.Errorf("a report of %d bytes, past MaxRequestBytes (%d)", n, bound)
		}
		for _, c := range req.GetClusterStats() {
			for _, ls := range c.GetUpstreamLocalityStats() {
				endpoints += len(ls.GetUpstreamEndpointStats())
			}
		}
	}
	if got := cp.LRS.Load("big"); got.Dropped != 7 || got.Issued != 40 || endpoints != 40 {
		t.Errorf("the control plane got %+v and %d endpoints' stats, want 7 dropped, 40 issued, 40 endpoints", got, endpoints)
	}
}
