package relay

import (
	"fmt"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointpb "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	lrspb "github.com/envoyproxy/go-control-plane/envoy/service/load_stats/v3"
	"google.golang.org/grpc"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// A real gRPC client reports absurd cardinalities and values: a thousand
// clusters and localities and metric names in one report, a count of
// 2^64-1, load metrics that are NaN, infinite or negative. The control
// plane is sent lrs.max_names names a period at most, a sum held at 2^64-1
// instead of wrapped, and another client's metric unharmed; each bound is
// counted on /metrics, and the client is logged once, however many
// reports it sends.
func TestLoadReportsAbsurdClient(t *testing.T) {
	const maxNames = 100
	cp := testcp.Start(t)
	cp.LRS.Answer(t, lrsAnswer(30*time.Millisecond))
	logs := &logBuffer{}
	r := startRelayLogged(t, cp.Addr, slog.New(slog.NewJSONHandler(logs, nil)), func(c *Config) { c.LRS.MaxNames = maxNames })
	for _, line := range []string{`xdsrelay_lrs_dropped_stats_total{reason="max_names"} 0`,
		`xdsrelay_lrs_dropped_stats_total{reason="invalid_value"} 0`, `xdsrelay_lrs_saturated_sums_total 0`} {
		waitMetric(t, r, line) // there from the start
	}
	bad, _ := startLRSClient(t, r.Addr(), lrsNode("bad", "c1", "z1"))
	good, _ := startLRSClient(t, r.Addr(), lrsNode("good", "c1", "z1"))

	// Cardinality: 1,000 clusters, each with two localities and two metric
	// names, twice.
	flood := &lrspb.LoadStatsRequest{}
	for i := range 1000 {
		ls := func(zone string) *endpointpb.UpstreamLocalityStats {
			return &endpointpb.UpstreamLocalityStats{Locality: &corepb.Locality{Zone: zone}, TotalSuccessfulRequests: 1,
				LoadMetricStats: []*endpointpb.EndpointLoadMetricStats{{MetricName: fmt.Sprint("m", i), TotalMetricValue: 1},
					{MetricName: fmt.Sprint("n", i), TotalMetricValue: 1}}}
		}
		flood.ClusterStats = append(flood.ClusterStats, &endpointpb.ClusterStats{ClusterName: fmt.Sprint("flood-", i),
			UpstreamLocalityStats: []*endpointpb.UpstreamLocalityStats{ls("x"), ls("y")}})
	}
	bad.send(flood)
	bad.send(flood)
	waitMetric(t, r, `xdsrelay_lrs_reports_total{side="downstream"} 2`)
	requests := func(l *testcp.LRS) int {
		n := 0
		for _, s := range l.Streams() {
			n += len(l.Reports(s))
		}
		return n
	}
	// Two more reports: the period that read the flood has ended.
	if seen := requests(cp.LRS); !cp.LRS.Wait(wait, func(l *testcp.LRS) bool { return requests(l) >= seen+2 }) {
		t.Fatal("the relay stopped reporting to the control plane")
	}

	// Values: 2^64-1 requests, and NaN, +Inf and -1 as load metrics, beside
	// a good client's.
	absurd := loadReport(math.MaxUint64, "a")
	ls := absurd.ClusterStats[0].UpstreamLocalityStats[0]
	for _, v := range []float64{math.NaN(), math.Inf(1), -1} {
		ls.LoadMetricStats = append(ls.LoadMetricStats, &endpointpb.EndpointLoadMetricStats{MetricName: "cpu", TotalMetricValue: v, NumRequestsFinishedWithMetric: 1})
	}
	ls.CpuUtilization = &endpointpb.UnnamedEndpointLoadMetricStats{TotalMetricValue: math.NaN(), NumRequestsFinishedWithMetric: 1}
	sane := loadReport(5, "a")
	sane.ClusterStats[0].UpstreamLocalityStats[0].LoadMetricStats = []*endpointpb.EndpointLoadMetricStats{{MetricName: "cpu", TotalMetricValue: 2, NumRequestsFinishedWithMetric: 1}}
	good.send(sane)
	bad.send(absurd)
	waitMetric(t, r, `xdsrelay_lrs_dropped_stats_total{reason="invalid_value"} 4`)
	var saturated bool
	if !cp.LRS.Wait(wait, func(l *testcp.LRS) bool {
		saturated = false
		for _, s := range l.Streams() {
			for _, req := range l.Reports(s) {
				if cs := testcp.ClusterStats(req, "a"); cs != nil && cs.GetUpstreamLocalityStats()[0].GetTotalSuccessfulRequests() == math.MaxUint64 {
					saturated = true
				}
			}
		}
		return saturated
	}) {
		t.Errorf("no report of a held at 2^64-1 requests: %+v", cp.LRS.Load("a"))
	}

	names, cpu := 0, 0.0
	for _, s := range cp.LRS.Streams() {
		for _, req := range cp.LRS.Reports(s) {
			n := 0
			for _, cs := range req.GetClusterStats() {
				n++
				for _, l := range cs.GetUpstreamLocalityStats() {
					n += 1 + len(l.GetLoadMetricStats())
					for _, m := range l.GetLoadMetricStats() {
						if v := m.GetTotalMetricValue(); math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
							t.Errorf("the control plane was sent %v as %s of %s", v, m.GetMetricName(), cs.GetClusterName())
						}
						if cs.GetClusterName() == "a" && m.GetMetricName() == "cpu" {
							cpu += m.GetTotalMetricValue()
						}
					}
					if u := l.GetCpuUtilization(); u != nil {
						t.Errorf("the control plane was sent cpu_utilization %v", u)
					}
				}
			}
			names = max(names, n)
		}
	}
	if names > maxNames {
		t.Errorf("a report to the control plane held %d names, past lrs.max_names (%d)", names, maxNames)
	}
	if cpu != 2 {
		t.Errorf("the control plane was sent a cpu metric of %v for a, want the good client's 2", cpu)
	}
	m := getMetrics(t, r)
	for _, line := range []string{`xdsrelay_lrs_dropped_stats_total{reason="max_names"} 0`, "xdsrelay_lrs_saturated_sums_total 0"} {
		if strings.Contains(m, line+"\n") {
			t.Errorf("%s after the absurd reports", line)
		}
	}
	if n := strings.Count(logs.String(), "stats in a client's load report left out"); n != 1 {
		t.Errorf("the client was logged %d times, want once", n)
	}
}

// While the control plane cannot be reached, the relay's held reports stay
// within lrs.max_pending_bytes: a client that names new clusters every
// period makes the oldest go, counted on both counters, and what is held
// is shown on /debug/groups; once the control plane is back, the newest
// reports reach it.
func TestLoadReportsMaxPendingBytes(t *testing.T) {
	const bound = 2 << 10
	cp := testcp.Start(t)
	cp.LRS.Answer(t, lrsAnswer(20*time.Millisecond))
	r := startRelay(t, cp.Addr, fastReconnect, func(c *Config) { c.LRS.MaxPendingBytes = bound })
	waitMetric(t, r, `xdsrelay_lrs_dropped_stats_total{reason="max_pending_bytes"} 0`)
	c, _ := startLRSClient(t, r.Addr(), lrsNode("a", "c1", "z1"))
	waitMetric(t, r, `xdsrelay_lrs_streams{side="upstream"} 1`)
	stopAfterReport(t, cp)
	sent := 0
	report := func() {
		var names []string
		for range 10 {
			names = append(names, fmt.Sprintf("cluster-%04d", sent))
			sent++
		}
		c.send(loadReport(1, names...))
	}
	eventually(t, "held reports dropped past lrs.max_pending_bytes", func() bool {
		report()
		time.Sleep(20 * time.Millisecond) // a period: the client reports as Envoy does
		return !strings.Contains(getMetrics(t, r), `xdsrelay_lrs_dropped_stats_total{reason="max_pending_bytes"} 0`+"\n")
	})
	for range 10 { // more periods: the early ones are surely gone
		report()
		time.Sleep(20 * time.Millisecond)
	}
	if strings.Contains(getMetrics(t, r), "xdsrelay_lrs_dropped_reports_total 0\n") {
		t.Error("reports dropped past lrs.max_pending_bytes are not in xdsrelay_lrs_dropped_reports_total")
	}
	var groups []debugGroup
	getJSON(t, r, "/debug/groups", &groups)
	if l := groups[0].Loads; l.PendingBytes > bound+1<<10 || l.Pending == 0 {
		t.Errorf("%d reports held in %d bytes; want some, within lrs.max_pending_bytes (%d) but for the newest period", l.Pending, l.PendingBytes, bound)
	}
	last := fmt.Sprintf("cluster-%04d", sent-1)
	cp.Restart()
	if !cp.LRS.Wait(wait, func(l *testcp.LRS) bool { return l.Load(last).Succeeded == 1 }) {
		t.Errorf("the newest cluster, %s, did not reach the control plane once it was back", last)
	}
	if got := cp.LRS.Load("cluster-0010"); got.Reports != 0 {
		t.Errorf("an old cluster reached the control plane: %+v; want it dropped", got)
	}
}

// A control plane that asks for a 1 ns interval, and then for another
// below lrs.min_interval, has both raised to it: clients are told
// lrs.min_interval, the relay reports to the control plane at it (a short
// window sees a handful of reports, not a flood), the group is logged
// once and each instruction counted.
func TestLoadReportsIntervalFloor(t *testing.T) {
	const floor = 100 * time.Millisecond
	cp := testcp.Start(t)
	cp.LRS.Answer(t, lrsAnswer(time.Nanosecond))
	logs := &logBuffer{}
	r := startRelayLogged(t, cp.Addr, slog.New(slog.NewJSONHandler(logs, nil)), func(c *Config) { c.LRS.MinInterval = floor })
	waitMetric(t, r, "xdsrelay_lrs_clamped_intervals_total 0")
	c, told := startLRSClient(t, r.Addr(), lrsNode("a", "c1", "z1"))
	for told.GetLoadReportingInterval().AsDuration() != floor { // until told what the control plane asks
		if iv := told.GetLoadReportingInterval().AsDuration(); iv < floor {
			t.Fatalf("the client was told to report every %v, below lrs.min_interval (%v)", iv, floor)
		}
		told = c.recv()
	}
	waitMetric(t, r, "xdsrelay_lrs_clamped_intervals_total 1")
	cp.LRS.Answer(t, lrsAnswer(time.Millisecond, "a"))
	told = c.recv()
	wantAnswer(t, told, false, floor, "a")
	waitMetric(t, r, "xdsrelay_lrs_clamped_intervals_total 2")

	requests := func() int {
		n := 0
		for _, s := range cp.LRS.Streams() {
			n += len(cp.LRS.Reports(s))
		}
		return n
	}
	before := requests()
	const window = 5 * floor
	cp.LRS.Wait(window, func(*testcp.LRS) bool { return false })
	n := requests() - before
	t.Logf("%d reports to the control plane in %v", n, window)
	if n > int(window/floor)*2 {
		t.Errorf("%d reports to the control plane in %v, want about one per lrs.min_interval (%v)", n, window, floor)
	}
	if n := strings.Count(logs.String(), "below lrs.min_interval"); n != 1 {
		t.Errorf("the clamped interval was logged %d times, want once", n)
	}
}

// A control plane that answers and then reads nothing more: a report it
// does not read within lrs.send_timeout ends the stream, counted
// (send_blocked), and the stream is opened again; the group still ends
// cache.retention after its last client leaves, and the relay shuts down
// at once, with no error.
func TestLoadReportsControlPlaneNeverReads(t *testing.T) {
	cp := testcp.StartWith(t, grpc.InitialWindowSize(64<<10), grpc.InitialConnWindowSize(64<<10))
	cp.LRS.Answer(t, lrsAnswer(30*time.Millisecond))
	cp.LRS.NeverRead()
	r := startRelay(t, cp.Addr, fastReconnect, func(c *Config) {
		c.LRS.SendTimeout = 200 * time.Millisecond
		c.Cache.Retention = 300 * time.Millisecond
	})
	waitMetric(t, r, `xdsrelay_lrs_dropped_stats_total{reason="send_blocked"} 0`)
	c, _ := startLRSClient(t, r.Addr(), lrsNode("a", "c1", "z1"))
	var names []string
	for i := range 500 { // about 150 KiB: past the stream's window
		names = append(names, fmt.Sprintf("%0300d", i))
	}
	c.send(loadReport(1, names...))
	eventually(t, "a blocked report counted", func() bool {
		return !strings.Contains(getMetrics(t, r), `xdsrelay_lrs_dropped_stats_total{reason="send_blocked"} 0`+"\n")
	})
	if !cp.LRS.Wait(wait, func(l *testcp.LRS) bool { return len(l.Streams()) >= 2 }) {
		t.Error("the relay did not open the stream again")
	}
	finish(t, c)
	eventually(t, "the group to end", func() bool { return r.groupCache(keyOf("c1")) == nil })
	waitMetric(t, r, `xdsrelay_lrs_streams{side="upstream"} 0`)

	// With a send_timeout past shutdown_timeout, a send blocked when the
	// relay shuts down is ended with it: no error, no wait.
	r = startRelay(t, cp.Addr, func(c *Config) { c.LRS.SendTimeout, c.ShutdownTimeout = time.Minute, 2*time.Second })
	c, _ = startLRSClient(t, r.Addr(), lrsNode("b", "c1", "z1"))
	c.send(loadReport(1, names...))
	waitMetric(t, r, `xdsrelay_lrs_reports_total{side="downstream"} 1`)
	cp.LRS.Wait(300*time.Millisecond, func(*testcp.LRS) bool { return false }) // periods end; a send blocks
	shutdown(t, r)                                                             // fails the test on an error
}
