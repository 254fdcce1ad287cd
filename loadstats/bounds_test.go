package loadstats

import (
	"fmt"
	"math"
	"sync/atomic"
	"testing"
	"time"

	endpointpb "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	lrspb "github.com/envoyproxy/go-control-plane/envoy/service/load_stats/v3"
	"google.golang.org/protobuf/types/known/durationpb"
)

// bounded are a store's OnDroppedStats and OnSaturated, counted.
type bounded struct {
	maxNames, invalid, saturated atomic.Int64
}

func (b *bounded) options(o *Options) {
	o.OnDroppedStats = func(reason string, n int) {
		switch reason {
		case ReasonMaxNames:
			b.maxNames.Add(int64(n))
		case ReasonInvalidValue:
			b.invalid.Add(int64(n))
		default:
			panic("unknown reason " + reason)
		}
	}
	o.OnSaturated = func(n int) { b.saturated.Add(int64(n)) }
}

// A count of 2^64-1 from one client holds the sum at 2^64-1 rather than
// wrapping it past the others' load; so do gauges, and a client that
// leaves takes its own gauge out exactly. Each time a sum is held, it is
// counted.
func TestSumsSaturate(t *testing.T) {
	b := &bounded{}
	s, _ := newStore(t, b.options)
	huge, small := join(s, ""), join(s, "")
	const max = math.MaxUint64
	huge.Report([]*endpointpb.ClusterStats{clusterStats("c", max, locStats("z", max, max, max, max))})
	small.Report([]*endpointpb.ClusterStats{clusterStats("c", 5, locStats("z", 5, 5, 5, 5))})
	if n := b.saturated.Load(); n != 4 { // drops, succeeded, errors, issued
		t.Errorf("%d sums counted as held at their edge, want 4", n)
	}
	diff(t, cut(t, s), want(clusterStats("c", max, locStats("z", max, max, max, max))))
	if n := b.saturated.Load(); n != 5 { // and the gauge, at the cut
		t.Errorf("%d sums counted as held at their edge after the cut, want 5", n)
	}
	huge.Leave()
	small.Report([]*endpointpb.ClusterStats{clusterStats("c", 1, locStats("z", 1, 0, 1, 5))})
	diff(t, cut(t, s), want(clusterStats("c", 1, locStats("z", 1, 0, 1, 5))))

	// A named metric's count, and its total past the largest double.
	m := func(n uint64, v float64) *endpointpb.UpstreamLocalityStats {
		ls := locStats("z", 0, 0, 0, 0)
		ls.LoadMetricStats = []*endpointpb.EndpointLoadMetricStats{{MetricName: "m", NumRequestsFinishedWithMetric: n, TotalMetricValue: v}}
		return ls
	}
	small.Report([]*endpointpb.ClusterStats{clusterStats("c", 0, m(max, math.MaxFloat64))})
	small.Report([]*endpointpb.ClusterStats{clusterStats("c", 0, m(2, math.MaxFloat64))})
	diff(t, cut(t, s), want(clusterStats("c", 0, m(max, math.MaxFloat64))))
	if n := b.saturated.Load(); n != 7 {
		t.Errorf("%d sums counted as held, want 7", n)
	}
}

// A NaN, an infinity or a negative total in a load metric is refused,
// that stat alone: the same metric from other clients, the client's other
// metrics and the rest of its report are summed. Each refusal is counted.
func TestInvalidMetricValues(t *testing.T) {
	b := &bounded{}
	s, _ := newStore(t, b.options)
	bad, good := join(s, ""), join(s, "")
	metric := func(name string, v float64) *endpointpb.EndpointLoadMetricStats {
		return &endpointpb.EndpointLoadMetricStats{MetricName: name, NumRequestsFinishedWithMetric: 1, TotalMetricValue: v}
	}
	util := func(v float64) *endpointpb.UnnamedEndpointLoadMetricStats {
		return &endpointpb.UnnamedEndpointLoadMetricStats{NumRequestsFinishedWithMetric: 1, TotalMetricValue: v}
	}
	ls := locStats("z", 3, 0, 3, 0)
	ls.LoadMetricStats = []*endpointpb.EndpointLoadMetricStats{metric("m", math.NaN()), metric("m", math.Inf(1)),
		metric("m", -1), metric("n", 2)}
	ls.CpuUtilization, ls.MemUtilization, ls.ApplicationUtilization = util(math.NaN()), util(math.Inf(-1)), util(0.5)
	if got := bad.Report([]*endpointpb.ClusterStats{clusterStats("c", 0, ls)}); got.InvalidValues != 5 || got.MaxNames != 0 {
		t.Errorf("Report returned %+v, want 5 invalid values", got)
	}
	ls = locStats("z", 1, 0, 1, 0)
	ls.LoadMetricStats = []*endpointpb.EndpointLoadMetricStats{metric("m", 4)}
	ls.CpuUtilization = util(0.25)
	good.Report([]*endpointpb.ClusterStats{clusterStats("c", 0, ls)})
	if n := b.invalid.Load(); n != 5 {
		t.Errorf("%d invalid values counted, want 5", n)
	}
	wl := locStats("z", 4, 0, 4, 0)
	wl.LoadMetricStats = []*endpointpb.EndpointLoadMetricStats{metric("m", 4), metric("n", 2)}
	wl.CpuUtilization, wl.ApplicationUtilization = util(0.25), util(0.5)
	diff(t, cut(t, s), want(clusterStats("c", 0, wl)))
}

// A period holds at most MaxNames distinct names (clusters, localities,
// endpoints, named metrics, drop categories): a report's stats past it are
// left out and counted, names already held are still summed, and the next
// period starts afresh. Gauges are held for MaxNames places at most.
func TestMaxNames(t *testing.T) {
	b := &bounded{}
	s, _ := newStore(t, b.options, func(o *Options) { o.MaxNames = 4 })
	r := join(s, "")
	var stats []*endpointpb.ClusterStats
	for i := range 3 {
		stats = append(stats, clusterStats(fmt.Sprint("c", i), 1, locStats("z", 1, 0, 1, 0)))
	}
	// c0 and its locality, c1 and its locality: four names; c2 is left out.
	if got := r.Report(stats); got.MaxNames != 1 {
		t.Errorf("Report returned %+v, want 1 left out past max_names", got)
	}
	// Names held are summed; a new locality, category or metric is not.
	more := clusterStats("c0", 1, locStats("z", 1, 0, 1, 0), locStats("y", 1, 0, 1, 0))
	more.DroppedRequests = []*endpointpb.ClusterStats_DroppedRequests{{Category: "throttle", DroppedCount: 1}}
	more.UpstreamLocalityStats[0].LoadMetricStats = []*endpointpb.EndpointLoadMetricStats{{MetricName: "m", TotalMetricValue: 1}}
	r.Report([]*endpointpb.ClusterStats{more})
	if n := b.maxNames.Load(); n != 4 {
		t.Errorf("%d stats counted past max_names, want 4", n)
	}
	diff(t, cut(t, s), want(clusterStats("c0", 2, locStats("z", 2, 0, 2, 0)), clusterStats("c1", 1, locStats("z", 1, 0, 1, 0))))
	// A new period: c2 has its place.
	r.Report(stats[2:])
	diff(t, cut(t, s), want(clusterStats("c2", 1, locStats("z", 1, 0, 1, 0))))

	// Gauges: a second client's, at places new to the gauges, past
	// MaxNames of them, are left out.
	b.maxNames.Store(0)
	g := func(c string) *endpointpb.ClusterStats { return clusterStats(c, 0, locStats("z", 0, 0, 0, 1)) }
	r.Report([]*endpointpb.ClusterStats{g("a"), g("b")}) // four names, two gauges
	cut(t, s)
	other := join(s, "")
	other.Report([]*endpointpb.ClusterStats{g("c"), g("d")}) // four gauges held
	// The period's four names are c's and d's: a's and b's gauges have no
	// room in its report.
	diff(t, cut(t, s), want(g("c"), g("d")))
	if n := b.maxNames.Load(); n != 2 {
		t.Errorf("%d stats counted past max_names, want 2 (the gauges of a and b at the cut)", n)
	}
	third := join(s, "")
	if got := third.Report([]*endpointpb.ClusterStats{g("e")}); got.MaxNames != 1 {
		t.Errorf("a gauge past max_names places: Report returned %+v, want 1 left out", got)
	}
	if n := b.maxNames.Load(); n != 3 {
		t.Errorf("%d stats counted past max_names, want 3 (and e's gauge)", n)
	}
	if n := len(s.gauges); n > 4 {
		t.Errorf("%d gauges held, past MaxNames (4)", n)
	}
}

// Gauges are exact however large: 2^64-1 and 5 from two clients, then
// the first leaves.
func TestWide(t *testing.T) {
	var tl tally
	w := wide{lo: math.MaxUint64}.plus(wide{lo: 5})
	if got := w.uint64(&tl); got != math.MaxUint64 || tl.saturated != 1 {
		t.Errorf("2^64-1 + 5 = %d (saturated %d), want 2^64-1, counted", got, tl.saturated)
	}
	if got := w.minus(wide{lo: math.MaxUint64}).uint64(&tl); got != 5 {
		t.Errorf("less 2^64-1: %d, want 5", got)
	}
}

// The periods held undelivered are bounded in bytes
// (MaxPendingBytes): past it they are merged into one when that fits,
// which a group that names the same clusters every period always does,
// losing nothing; when even the merge does not fit (new names every
// period), the oldest are dropped, counted, and the newest kept.
func TestMaxPendingBytes(t *testing.T) {
	b := &bounded{}
	var droppedStats atomic.Int64
	s, c := newStore(t, b.options, func(o *Options) {
		o.MaxPendingBytes = 400
		o.OnDroppedStats = func(reason string, n int) {
			if reason != ReasonMaxPendingBytes {
				t.Errorf("dropped for %s", reason)
			}
			droppedStats.Add(int64(n))
		}
	})
	r := join(s, "")
	start := s.start
	report := func(i int, names ...string) {
		var stats []*endpointpb.ClusterStats
		for _, n := range names {
			stats = append(stats, clusterStats(n, 1, locStats("z", 1, 0, 1, uint64(i))))
		}
		r.Report(stats)
		s.Cut(start.Add(time.Duration(i+1) * time.Second))
	}
	for i := range 20 { // the same three clusters every period
		report(i, "a", "b", "c")
		if st := s.Status(); st.PendingBytes > 400 {
			t.Fatalf("period %d: %d bytes held, past MaxPendingBytes (400)", i, st.PendingBytes)
		}
	}
	if st := s.Status(); st.Pending != 20 || c.dropped.Load() != 0 || droppedStats.Load() != 0 {
		t.Errorf("%d periods held, %d dropped, %d stats dropped; want 20, merged, none dropped", st.Pending, c.dropped.Load(), droppedStats.Load())
	}
	stats, n := s.Pending()
	if len(s.pending) > 2 {
		t.Errorf("%d held reports, want them merged", len(s.pending))
	}
	if iv := stats[0].GetLoadReportInterval().AsDuration(); iv != 20*time.Second {
		t.Errorf("the merged report spans %v, want the 20 s held", iv)
	}
	diff(t, cleared(t, stats), want(clusterStats("a", 20, locStats("z", 20, 0, 20, 19)),
		clusterStats("b", 20, locStats("z", 20, 0, 20, 19)), clusterStats("c", 20, locStats("z", 20, 0, 20, 19))))
	s.Delivered(n, nil)

	// New names every period: the merge cannot fit, the oldest go.
	for i := range 20 {
		report(20+i, fmt.Sprint("x", i), fmt.Sprint("y", i), fmt.Sprint("z", i))
	}
	st := s.Status()
	if st.PendingBytes > 400 || st.Pending == 0 {
		t.Errorf("%d periods held in %d bytes, want some within MaxPendingBytes (400)", st.Pending, st.PendingBytes)
	}
	if got := int(c.dropped.Load()) + st.Pending; got != 20 {
		t.Errorf("%d periods dropped and %d held, want 20 in all", c.dropped.Load(), st.Pending)
	}
	if droppedStats.Load() == 0 || droppedStats.Load()%3 != 0 {
		t.Errorf("%d cluster stats dropped, want three a period dropped", droppedStats.Load())
	}
	stats, _ = s.Pending()
	if got := stats[len(stats)-1].GetClusterName(); got != "z19" {
		t.Errorf("the last cluster held is %s, want the newest period's z19", got)
	}

	// One period larger than the bound alone is kept: it is the one to send.
	var many []string
	for i := range 50 {
		many = append(many, fmt.Sprint("many-", i))
	}
	report(40, many...)
	if st := s.Status(); st.Pending != 1 || st.PendingBytes <= 400 {
		t.Errorf("a period past the bound alone: %d held in %d bytes, want it kept", st.Pending, st.PendingBytes)
	}
}

// An interval below MinInterval is raised to it and reported (OnClamped);
// none (zero) takes the store's own, unreported; one at the floor is kept.
func TestIntervalFloor(t *testing.T) {
	var asked []time.Duration
	s, _ := newStore(t, func(o *Options) {
		o.MinInterval = time.Second
		o.OnClamped = func(d time.Duration) { asked = append(asked, d) }
	})
	for _, c := range []struct {
		asked, want time.Duration
		clamped     bool
	}{
		{asked: time.Nanosecond, want: time.Second, clamped: true},
		{asked: -time.Second, want: 10 * time.Second},
		{asked: 0, want: 10 * time.Second},
		{asked: time.Second, want: time.Second},
		{asked: 999 * time.Millisecond, want: time.Second, clamped: true},
	} {
		n := len(asked)
		s.Instruct(Instructions{SendAll: true, Interval: c.asked})
		if got := s.Instructions().Interval; got != c.want {
			t.Errorf("asked %v: clients told %v, want %v", c.asked, got, c.want)
		}
		if clamped := len(asked) > n; clamped != c.clamped || clamped && asked[n] != c.asked {
			t.Errorf("asked %v: OnClamped %v, want %v", c.asked, asked[n:], c.clamped)
		}
	}
	// A duration that is not one (nanos out of range) is no interval: the
	// store's own, unreported, not the floor.
	n := len(asked)
	s.Instruct(FromResponse(&lrspb.LoadStatsResponse{SendAllClusters: true, LoadReportingInterval: &durationpb.Duration{Seconds: 1, Nanos: -5}}))
	if got := s.Instructions().Interval; got != 10*time.Second || len(asked) != n {
		t.Errorf("an invalid duration: clients told %v (OnClamped %v), want the store's 10s, not reported", got, asked[n:])
	}
}
