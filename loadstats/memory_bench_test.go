package loadstats

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointpb "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
)

// namesReport is one client's report of clusters clusters, each with two
// localities (one with a named metric): five names a cluster, as an
// Istio-style cluster name.
func namesReport(clusters int) []*endpointpb.ClusterStats {
	out := make([]*endpointpb.ClusterStats, 0, clusters)
	for i := range clusters {
		ls := func(zone string) *endpointpb.UpstreamLocalityStats {
			return &endpointpb.UpstreamLocalityStats{Locality: &corepb.Locality{Region: "region-1", Zone: zone},
				TotalSuccessfulRequests: 1000, TotalIssuedRequests: 1000, TotalRequestsInProgress: 3}
		}
		a, b := ls("zone-a"), ls("zone-b")
		a.LoadMetricStats = []*endpointpb.EndpointLoadMetricStats{{MetricName: "cpu_utilization", NumRequestsFinishedWithMetric: 1000, TotalMetricValue: 512.5}}
		out = append(out, &endpointpb.ClusterStats{ClusterName: fmt.Sprintf("outbound|8080||service-%06d.namespace.svc.cluster.local", i),
			UpstreamLocalityStats: []*endpointpb.UpstreamLocalityStats{a, b}})
	}
	return out
}

// heapNow is the live heap, after a collection.
func heapNow() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

func benchStore(b *testing.B, maxNames int) (*Store, *Reporter) {
	s, err := New(Options{Interval: 10 * time.Second, MinInterval: time.Second, MaxPending: 1000, MaxNames: maxNames, MaxPendingBytes: 16 << 20})
	if err != nil {
		b.Fatal(err)
	}
	r := s.Join(&corepb.Node{}, func() {})
	r.Next()
	return s, r
}

// BenchmarkHeldReport measures, for one report of 2,000 clusters (10,000
// names) and of 20,000 (100,000 names), what a group's store holds: the
// heap of the period being summed (sums and gauges), the heap once it is
// cut and held (the encoded period and the gauges), the held period's
// encoded bytes (what lrs.max_pending_bytes counts), and the heap the
// report takes as messages: about what a period took when periods were
// held as messages; and the heap once the period is delivered (the
// gauges alone: each client's latest). max_names=50000 is the default: a 100,000-name report is
// cut at it.
func BenchmarkHeldReport(b *testing.B) {
	for _, c := range []struct{ clusters, maxNames int }{{2_000, 100_000}, {20_000, 100_000}, {20_000, 50_000}} {
		b.Run(fmt.Sprintf("clusters=%d/max_names=%d", c.clusters, c.maxNames), func(b *testing.B) {
			var summing, held, encoded, messages, delivered int64
			for b.Loop() {
				base := heapNow()
				stats := namesReport(c.clusters)
				messages = heapNow() - base
				base = heapNow()
				s, r := benchStore(b, c.maxNames)
				r.Report(stats)
				summing = heapNow() - base
				s.Cut(time.Now())
				held = heapNow() - base
				encoded = int64(len(s.pending[0].encoded))
				_, n := s.Pending()
				s.Delivered(n, nil)
				delivered = heapNow() - base
				runtime.KeepAlive(stats)
			}
			b.ReportMetric(float64(summing)/(1<<20), "MiB-summing")
			b.ReportMetric(float64(held)/(1<<20), "MiB-held")
			b.ReportMetric(float64(encoded)/(1<<20), "MiB-encoded")
			b.ReportMetric(float64(messages)/(1<<20), "MiB-as-messages")
			b.ReportMetric(float64(delivered)/(1<<20), "MiB-delivered")
		})
	}
}

// BenchmarkOutage holds 1,000 periods of one client's 2,000-cluster
// report, the same clusters each period, as through an outage at the
// default bounds (lrs.max_pending 1000, lrs.max_pending_bytes 16 MiB): the
// heap held at the end, the periods it spans, and how many were dropped.
func BenchmarkOutage(b *testing.B) {
	var held int64
	var st Status
	var dropped int
	for b.Loop() {
		stats := namesReport(2_000)
		base := heapNow()
		s, r := benchStore(b, 100_000)
		s.opts.OnDropped = func(n int) { dropped += n }
		start := time.Now()
		for i := range 1000 {
			r.Report(stats)
			s.Cut(start.Add(time.Duration(i+1) * 10 * time.Second))
		}
		held = heapNow() - base
		st = s.Status()
		runtime.KeepAlive(stats)
	}
	b.ReportMetric(float64(held)/(1<<20), "MiB-held")
	b.ReportMetric(float64(st.PendingBytes)/(1<<20), "MiB-encoded")
	b.ReportMetric(float64(st.Pending), "periods-held")
	b.ReportMetric(float64(dropped), "periods-dropped")
}
