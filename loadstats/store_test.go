package loadstats

import (
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointpb "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	lrspb "github.com/envoyproxy/go-control-plane/envoy/service/load_stats/v3"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// counters are a store's OnIgnored and OnDropped, counted.
type counters struct{ ignored, dropped atomic.Int64 }

func newStore(t *testing.T, mutate ...func(*Options)) (*Store, *counters) {
	t.Helper()
	c := &counters{}
	opts := Options{Interval: 10 * time.Second, MinInterval: time.Millisecond, MaxPending: 1000, MaxNames: 100_000, MaxPendingBytes: 64 << 20,
		OnIgnored: func(n int) { c.ignored.Add(int64(n)) },
		OnDropped: func(n int) { c.dropped.Add(int64(n)) }}
	for _, m := range mutate {
		m(&opts)
	}
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}

// join adds a reporter that has been told what the store tells now.
func join(s *Store, zone string) *Reporter {
	r := s.Join(&corepb.Node{Id: "n", Locality: &corepb.Locality{Zone: zone}}, func() {})
	r.Next()
	return r
}

func loc(zone string) *corepb.Locality { return &corepb.Locality{Region: "r", Zone: zone} }

// locStats is one locality's stats of a report.
func locStats(zone string, succ, errs, issued, inProgress uint64) *endpointpb.UpstreamLocalityStats {
	return &endpointpb.UpstreamLocalityStats{Locality: loc(zone), TotalSuccessfulRequests: succ, TotalErrorRequests: errs,
		TotalIssuedRequests: issued, TotalRequestsInProgress: inProgress}
}

func clusterStats(name string, drops uint64, ls ...*endpointpb.UpstreamLocalityStats) *endpointpb.ClusterStats {
	return &endpointpb.ClusterStats{ClusterName: name, ClusterServiceName: name + "-eds", TotalDroppedRequests: drops,
		UpstreamLocalityStats: ls, LoadReportInterval: durationpb.New(time.Second)}
}

// cut ends a period and returns its stats, each load_report_interval
// checked to be positive and then cleared for comparison.
func cut(t *testing.T, s *Store) []*endpointpb.ClusterStats {
	t.Helper()
	time.Sleep(time.Millisecond) // a period is never empty of time
	s.Cut(time.Now())
	stats, n := s.Pending()
	s.Delivered(n, nil)
	return cleared(t, stats)
}

func cleared(t *testing.T, stats []*endpointpb.ClusterStats) []*endpointpb.ClusterStats {
	t.Helper()
	out := make([]*endpointpb.ClusterStats, len(stats))
	for i, cs := range stats {
		if cs.GetLoadReportInterval().AsDuration() <= 0 {
			t.Errorf("cluster %s: load_report_interval %v", cs.GetClusterName(), cs.GetLoadReportInterval())
		}
		cs = proto.Clone(cs).(*endpointpb.ClusterStats)
		cs.LoadReportInterval = nil
		out[i] = cs
	}
	return out
}

func want(stats ...*endpointpb.ClusterStats) []*endpointpb.ClusterStats {
	for _, cs := range stats {
		cs.LoadReportInterval = nil
	}
	return stats
}

func diff(t *testing.T, got, want []*endpointpb.ClusterStats) {
	t.Helper()
	same := len(got) == len(want)
	for i := 0; same && i < len(got); i++ {
		same = proto.Equal(got[i], want[i])
	}
	if !same {
		t.Errorf("stats:\n%s\nwant:\n%s", text(got...), text(want...))
	}
}

func text[M proto.Message](ms ...M) string {
	var out string
	for _, m := range ms {
		out += prototext.Format(m) + "--\n"
	}
	return out
}

// Counts are summed over reports and clients, per cluster and locality;
// requests in progress are the sum of each client's latest value.
func TestCountsSumAndGaugesAreLatest(t *testing.T) {
	s, _ := newStore(t)
	a, b := join(s, "z1"), join(s, "z1")
	a.Report([]*endpointpb.ClusterStats{clusterStats("c", 1, locStats("z1", 10, 1, 11, 5))})
	a.Report([]*endpointpb.ClusterStats{clusterStats("c", 2, locStats("z1", 20, 2, 22, 3))})
	b.Report([]*endpointpb.ClusterStats{clusterStats("c", 0, locStats("z1", 1, 0, 1, 4), locStats("z2", 7, 0, 7, 0))})
	diff(t, cut(t, s), want(clusterStats("c", 3, locStats("z1", 31, 3, 34, 7), locStats("z2", 7, 0, 7, 0))))

	// A new period: counts start again; gauges stand as last reported.
	diff(t, cut(t, s), want(clusterStats("c", 0, locStats("z1", 0, 0, 0, 7))))

	// A report that leaves a locality out has nothing in progress there.
	a.Report([]*endpointpb.ClusterStats{clusterStats("c", 0)})
	diff(t, cut(t, s), want(clusterStats("c", 0, locStats("z1", 0, 0, 0, 4))))
}

// A client that leaves keeps its counts in the sum and takes its gauges.
func TestLeaveKeepsCounts(t *testing.T) {
	s, _ := newStore(t)
	a, b := join(s, "z1"), join(s, "z1")
	a.Report([]*endpointpb.ClusterStats{clusterStats("c", 0, locStats("z1", 10, 0, 10, 2))})
	b.Report([]*endpointpb.ClusterStats{clusterStats("c", 0, locStats("z1", 5, 0, 5, 1))})
	a.Leave()
	a.Leave()
	a.Report([]*endpointpb.ClusterStats{clusterStats("c", 0, locStats("z1", 100, 0, 100, 0))}) // after Leave: nothing
	diff(t, cut(t, s), want(clusterStats("c", 0, locStats("z1", 15, 0, 15, 1))))
	if _, idle := s.Idle(); idle {
		t.Error("idle with a reporter joined")
	}
	b.Leave()
	if since, idle := s.Idle(); !idle || since.IsZero() {
		t.Errorf("Idle() = %v, %v after the last reporter left", since, idle)
	}
}

// Stats for a cluster the client was not told to report, or that the
// control plane no longer asks for, are ignored and counted; a client told
// nothing yet reports nothing.
func TestIgnoredClusters(t *testing.T) {
	s, c := newStore(t)
	untold := s.Join(&corepb.Node{}, func() {})
	untold.Report([]*endpointpb.ClusterStats{clusterStats("a", 1)})
	if n := c.ignored.Load(); n != 1 {
		t.Fatalf("ignored %d, want 1 (a client told nothing yet)", n)
	}
	all := join(s, "") // told send_all_clusters
	s.Instruct(Instructions{Clusters: []string{"a"}, Interval: time.Second})
	narrow := join(s, "") // told [a]
	all.Report([]*endpointpb.ClusterStats{clusterStats("a", 1), clusterStats("b", 1)})
	narrow.Report([]*endpointpb.ClusterStats{clusterStats("a", 1), clusterStats("b", 1), clusterStats("", 1)})
	if n := c.ignored.Load(); n != 4 {
		t.Errorf("ignored %d, want 4 (b twice, the unnamed one, the first)", n)
	}
	diff(t, cut(t, s), want(clusterStats("a", 2)))

	// Counted in a period for a cluster the control plane then stops
	// asking for: left out of the period, and counted.
	s.Instruct(Instructions{Clusters: []string{"a", "b"}, Interval: time.Second})
	narrow.Next()
	narrow.Report([]*endpointpb.ClusterStats{clusterStats("b", 1)})
	s.Instruct(Instructions{Clusters: []string{"a"}, Interval: time.Second})
	before := c.ignored.Load()
	diff(t, cut(t, s), nil)
	if n := c.ignored.Load() - before; n != 1 {
		t.Errorf("the period left out %d clusters uncounted, want 1", n)
	}
}

// Instruct tells every reporter once, and only what changed; Next hands
// out each version once. A missing interval is the store's own.
func TestInstruct(t *testing.T) {
	s, _ := newStore(t)
	var notified atomic.Int64
	r := s.Join(&corepb.Node{}, func() { notified.Add(1) })
	first := r.Next()
	if !first.GetSendAllClusters() || first.GetLoadReportingInterval().AsDuration() != 10*time.Second {
		t.Fatalf("before the control plane answers: %v, want send_all_clusters and 10s", first)
	}
	if r.Next() != nil {
		t.Fatal("Next repeated what the client was told")
	}
	for _, tc := range []struct {
		resp    *lrspb.LoadStatsResponse
		changed bool
		want    *lrspb.LoadStatsResponse
	}{
		{&lrspb.LoadStatsResponse{SendAllClusters: true, LoadReportingInterval: durationpb.New(10 * time.Second)}, false, nil},
		{&lrspb.LoadStatsResponse{SendAllClusters: true}, false, nil}, // no interval: the store's
		{&lrspb.LoadStatsResponse{Clusters: []string{"b", "a", "b"}, LoadReportingInterval: durationpb.New(time.Second)}, true,
			&lrspb.LoadStatsResponse{Clusters: []string{"a", "b"}, LoadReportingInterval: durationpb.New(time.Second)}},
		{&lrspb.LoadStatsResponse{Clusters: []string{"a", "b"}, LoadReportingInterval: durationpb.New(time.Second)}, false, nil},
		{&lrspb.LoadStatsResponse{Clusters: []string{"a", "b"}, LoadReportingInterval: &durationpb.Duration{Seconds: -1}, ReportEndpointGranularity: true}, true,
			&lrspb.LoadStatsResponse{Clusters: []string{"a", "b"}, LoadReportingInterval: durationpb.New(10 * time.Second), ReportEndpointGranularity: true}},
	} {
		n := notified.Load()
		if got := s.Instruct(FromResponse(tc.resp)); got != tc.changed {
			t.Errorf("Instruct(%v) = %v, want %v", tc.resp, got, tc.changed)
		}
		if d := notified.Load() - n; (d == 1) != tc.changed || d > 1 {
			t.Errorf("Instruct(%v) notified %d times", tc.resp, d)
		}
		if got := r.Next(); !proto.Equal(got, tc.want) {
			t.Errorf("after Instruct(%v), Next = %v, want %v", tc.resp, got, tc.want)
		}
	}
	if !s.Status().Answered {
		t.Error("Status().Answered is false after Instruct")
	}
}

// Periods that cannot be delivered are held, up to MaxPending, and go out
// as one report: counts summed, the latest gauges, over their whole time.
// Past MaxPending the oldest is dropped and counted.
func TestPendingPeriods(t *testing.T) {
	s, c := newStore(t, func(o *Options) { o.MaxPending = 3 })
	r := join(s, "")
	start := time.Now()
	for i := range 5 {
		r.Report([]*endpointpb.ClusterStats{clusterStats("c", 1, locStats("z", 10, 0, 10, uint64(i)))})
		s.Cut(start.Add(time.Duration(i+1) * time.Second))
	}
	if n := c.dropped.Load(); n != 2 {
		t.Errorf("dropped %d periods, want 2", n)
	}
	stats, n := s.Pending()
	if n != 3 {
		t.Fatalf("Pending holds %d periods, want 3", n)
	}
	if iv := stats[0].GetLoadReportInterval().AsDuration(); iv != 3*time.Second {
		t.Errorf("load_report_interval %v, want 3s (the three periods held)", iv)
	}
	diff(t, cleared(t, stats), want(clusterStats("c", 3, locStats("z", 30, 0, 30, 4))))
	s.Delivered(n, nil)
	if _, n := s.Pending(); n != 0 {
		t.Errorf("%d periods pending once delivered", n)
	}
	// A report sent in parts, the last failing: that part stays pending,
	// over the same time.
	r.Report([]*endpointpb.ClusterStats{clusterStats("c", 1), clusterStats("d", 1)})
	s.Cut(start.Add(6 * time.Second))
	stats, n = s.Pending()
	s.Delivered(n, stats[1:])
	stats, n = s.Pending()
	if n != 1 || len(stats) != 1 || stats[0].GetClusterName() != "d" || stats[0].GetLoadReportInterval().AsDuration() != time.Second {
		t.Fatalf("after a part failed, pending %d: %s", n, text(stats...))
	}
	s.Cut(start.Add(7 * time.Second))
	s.Discard()
	if n := c.dropped.Load(); n != 4 {
		t.Errorf("dropped %d periods after Discard, want 4", n)
	}
}

// Per-endpoint stats are summed only when the control plane asks for them.
func TestEndpointGranularity(t *testing.T) {
	s, _ := newStore(t)
	r := join(s, "")
	ep := func(port uint32, succ, inProgress uint64) *endpointpb.UpstreamEndpointStats {
		return &endpointpb.UpstreamEndpointStats{
			Address: &corepb.Address{Address: &corepb.Address_SocketAddress{SocketAddress: &corepb.SocketAddress{
				Address: "10.0.0.1", PortSpecifier: &corepb.SocketAddress_PortValue{PortValue: port}}}},
			TotalSuccessfulRequests: succ, TotalIssuedRequests: succ, TotalRequestsInProgress: inProgress,
			LoadMetricStats: []*endpointpb.EndpointLoadMetricStats{{MetricName: "qps", NumRequestsFinishedWithMetric: succ, TotalMetricValue: 0.5}},
		}
	}
	withEndpoints := func(ls *endpointpb.UpstreamLocalityStats, eps ...*endpointpb.UpstreamEndpointStats) *endpointpb.UpstreamLocalityStats {
		ls.UpstreamEndpointStats = eps
		return ls
	}
	r.Report([]*endpointpb.ClusterStats{clusterStats("c", 0, withEndpoints(locStats("z", 3, 0, 3, 0), ep(1, 3, 0)))})
	diff(t, cut(t, s), want(clusterStats("c", 0, locStats("z", 3, 0, 3, 0))))

	s.Instruct(Instructions{SendAll: true, EndpointGranularity: true})
	r.Next()
	r.Report([]*endpointpb.ClusterStats{clusterStats("c", 0, withEndpoints(locStats("z", 3, 0, 3, 1), ep(1, 1, 0), ep(2, 2, 1)))})
	r.Report([]*endpointpb.ClusterStats{clusterStats("c", 0, withEndpoints(locStats("z", 1, 0, 1, 1), ep(1, 1, 0), ep(2, 0, 1)))})
	e1, e2 := ep(1, 2, 0), ep(2, 2, 1)
	e1.LoadMetricStats[0].TotalMetricValue = 1 // two reports of 0.5
	e2.LoadMetricStats[0].TotalMetricValue = 1
	diff(t, cut(t, s), want(clusterStats("c", 0, withEndpoints(locStats("z", 4, 0, 4, 1), e1, e2))))
	// The next period: only the endpoint in progress, its address known.
	e2 = ep(2, 0, 1)
	e2.LoadMetricStats = nil
	diff(t, cut(t, s), want(clusterStats("c", 0, withEndpoints(locStats("z", 0, 0, 0, 1), e2))))
}

// Clients of one group reporting from two zones are reported once, unless
// the group's key holds a locality field.
func TestMixedZones(t *testing.T) {
	for _, byLocality := range []bool{false, true} {
		var calls atomic.Int64
		var got [2]string
		s, _ := newStore(t, func(o *Options) {
			o.ByLocality = byLocality
			o.OnMixedZones = func(a, b *corepb.Locality) {
				calls.Add(1)
				got = [2]string{a.GetZone(), b.GetZone()}
			}
		})
		for _, z := range []string{"z1", "z1", "z2", "z3"} {
			join(s, z)
		}
		want := int64(1)
		if byLocality {
			want = 0
		}
		if calls.Load() != want || (want == 1 && got != [2]string{"z1", "z2"}) {
			t.Errorf("ByLocality %v: OnMixedZones called %d times with %v", byLocality, calls.Load(), got)
		}
	}
}

// Reports from many clients while periods are cut lose nothing: every
// count is in exactly one period.
func TestConcurrentReportsAndCuts(t *testing.T) {
	s, _ := newStore(t)
	const clients, reports = 8, 500
	var wg sync.WaitGroup
	for range clients {
		r := join(s, "")
		wg.Go(func() {
			for range reports {
				r.Report([]*endpointpb.ClusterStats{clusterStats("c", 1, locStats("z", 1, 0, 1, 1))})
			}
			r.Leave()
		})
	}
	var total, drops uint64
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	add := func() {
		s.Cut(time.Now())
		stats, n := s.Pending()
		s.Delivered(n, nil)
		for _, cs := range stats {
			drops += cs.GetTotalDroppedRequests()
			for _, ls := range cs.GetUpstreamLocalityStats() {
				total += ls.GetTotalSuccessfulRequests()
			}
		}
	}
	for {
		select {
		case <-done:
			add()
			if total != clients*reports || drops != clients*reports {
				t.Errorf("summed %d requests and %d drops, want %d each", total, drops, clients*reports)
			}
			return
		default:
			add()
		}
	}
}

func TestNewChecksOptions(t *testing.T) {
	ok := Options{Interval: time.Second, MinInterval: time.Second, MaxPending: 1, MaxNames: 1, MaxPendingBytes: 1}
	if _, err := New(ok); err != nil {
		t.Fatal(err)
	}
	for _, mutate := range []func(*Options){
		func(o *Options) { o.Interval = 0 },
		func(o *Options) { o.MinInterval = 0 },
		func(o *Options) { o.MinInterval = 2 * time.Second }, // past Interval
		func(o *Options) { o.MaxPending = 0 },
		func(o *Options) { o.MaxNames = 0 },
		func(o *Options) { o.MaxPendingBytes = 0 },
	} {
		o := ok
		mutate(&o)
		if _, err := New(o); err == nil {
			t.Errorf("New(%+v) accepted", o)
		}
	}
}

// The store calls what it is given (notify, OnIgnored, OnDropped,
// OnMixedZones, OnDroppedStats, OnSaturated, OnClamped) without holding
// its lock: each may call the store back.
func TestCallbacksMayCallTheStore(t *testing.T) {
	var s *Store
	var notified, ignored, dropped, mixed, droppedStats, saturated, clamped atomic.Int64
	back := func(n *atomic.Int64) { n.Add(1); s.Status() }
	s, _ = newStore(t, func(o *Options) {
		o.MaxPending = 1
		o.MaxNames = 2
		o.MinInterval = time.Second
		o.OnIgnored = func(int) { back(&ignored) }
		o.OnDropped = func(int) { back(&dropped) }
		o.OnMixedZones = func(_, _ *corepb.Locality) { back(&mixed) }
		o.OnDroppedStats = func(string, int) { back(&droppedStats) }
		o.OnSaturated = func(int) { back(&saturated) }
		o.OnClamped = func(time.Duration) { back(&clamped) }
	})
	done := make(chan struct{})
	go func() {
		defer close(done)
		r := s.Join(&corepb.Node{Locality: loc("z1")}, func() { back(&notified) })
		r.Next()
		s.Join(&corepb.Node{Locality: loc("z2")}, func() {})
		r.Report([]*endpointpb.ClusterStats{clusterStats("a", 1)})
		r.Report([]*endpointpb.ClusterStats{clusterStats("a", math.MaxUint64), clusterStats("c", 1), clusterStats("d", 1)})
		s.Instruct(Instructions{Clusters: []string{"b"}, Interval: time.Nanosecond})
		r.Report([]*endpointpb.ClusterStats{clusterStats("a", 1)})
		s.Cut(time.Now())
		s.Cut(time.Now())
		s.Discard()
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("a callback that calls the store back did not return: called with the store's lock held")
	}
	for name, n := range map[string]*atomic.Int64{"notify": &notified, "OnIgnored": &ignored, "OnDropped": &dropped, "OnMixedZones": &mixed,
		"OnDroppedStats": &droppedStats, "OnSaturated": &saturated, "OnClamped": &clamped} {
		if n.Load() == 0 {
			t.Errorf("%s was not called", name)
		}
	}
}
