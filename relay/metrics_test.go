package relay

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/xdsrelay/xdsrelay/internal/metrics"
	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// hostileClusters are node.cluster values (group keys) that broke the
// hand-written exposition or made it huge.
var hostileClusters = []string{"tab\there", `quo"te`, "new\nline", `back\slash`, strings.Repeat("x", 64<<10)}

// scrape parses /metrics with Prometheus's own text parser.
func scrape(t *testing.T, r *Relay) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + r.AdminAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics does not parse: %v", err)
	}
	return mfs
}

// connectHostile opens a SotW stream per hostile cluster, each getting its
// group's clusters, then changes the first group's so that a push follows.
func connectHostile(t *testing.T, cp *testcp.ControlPlane, r *Relay) {
	t.Helper()
	var first *sotwStream
	for i, cluster := range hostileClusters {
		cp.Set(t, cluster, "1", testcp.Cluster("a"))
		s := openSotW(t, r.Addr())
		s.send(&discoverypb.DiscoveryRequest{Node: node(fmt.Sprint("n", i), cluster), TypeUrl: resourcev3.ClusterType})
		if got := s.recv(); len(got.GetResources()) != 1 {
			t.Fatalf("cluster %.20q: %v", cluster, got)
		}
		if first == nil {
			first = s
		}
	}
	cp.Set(t, hostileClusters[0], "2", testcp.Cluster("a"), testcp.Cluster("b"))
	if got := first.recv(); len(got.GetResources()) != 2 {
		t.Fatalf("after the change: %v", got)
	}
}

// Whatever clients put in their nodes, /metrics parses, every label value is
// bounded, and the histograms and the runtime and process metrics are there.
func TestMetricsHostileLabels(t *testing.T) {
	cp := testcp.Start(t)
	r := startRelay(t, cp.Addr)
	connectHostile(t, cp, r)
	mfs := scrape(t, r)

	groups := map[string]bool{}
	for name, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if len(l.GetValue()) > metrics.MaxLabelLen {
					t.Errorf("%s: label %s is %d bytes", name, l.GetName(), len(l.GetValue()))
				}
				if l.GetName() == "group" {
					groups[l.GetValue()] = true
				}
			}
		}
	}
	for _, want := range []string{GroupID(keyOf("tab\there")), GroupID(keyOf(`quo"te`)), GroupID(keyOf("new\nline")), GroupID(keyOf(`back\slash`))} {
		if !groups[want] {
			t.Errorf("no group label %q among %v", want, groups)
		}
	}
	if !groups[GroupID(keyOf(hostileClusters[4]))] {
		t.Errorf("the long group key is not hashed: %v", groups)
	}
	for _, h := range []string{"xdsrelay_upstream_apply_seconds", "xdsrelay_downstream_response_bytes",
		"xdsrelay_downstream_first_response_seconds", "xdsrelay_downstream_push_latency_seconds"} {
		if n := histogramCount(mfs[h]); n == 0 {
			t.Errorf("histogram %s: no observations", h)
		}
	}
	for _, f := range []string{"go_goroutines", "go_memstats_heap_alloc_bytes", "process_cpu_seconds_total"} {
		if mfs[f] == nil {
			t.Errorf("no %s", f)
		}
	}
}

// histogramCount is the observations of a histogram family, across series.
func histogramCount(mf *dto.MetricFamily) uint64 {
	if mf.GetType() != dto.MetricType_HISTOGRAM {
		return 0
	}
	var n uint64
	for _, m := range mf.GetMetric() {
		n += m.GetHistogram().GetSampleCount()
	}
	return n
}

// With metrics.group_label false, the per-group families are one series each.
func TestMetricsNoGroupLabel(t *testing.T) {
	cp := testcp.Start(t)
	r := startRelay(t, cp.Addr, func(c *Config) { c.Metrics.GroupLabel = false })
	connectHostile(t, cp, r)
	mfs := scrape(t, r)
	for _, name := range []string{"xdsrelay_upstream_connected", "xdsrelay_cache_resources", "xdsrelay_cache_age_seconds"} {
		ms := mfs[name].GetMetric()
		if len(ms) != 1 || len(ms[0].GetLabel()) != 0 {
			t.Fatalf("%s: %v", name, ms)
		}
	}
	// One resource in each group but the first, which has two.
	if got, want := mfs["xdsrelay_cache_resources"].GetMetric()[0].GetGauge().GetValue(), float64(len(hostileClusters)+1); got != want {
		t.Errorf("xdsrelay_cache_resources = %v, want the sum %v", got, want)
	}
}

// value is the sum of a family's samples whose labels include want.
func value(mfs map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	sum := 0.0
	for _, m := range mfs[name].GetMetric() {
		ok := true
		for k, v := range want {
			found := false
			for _, l := range m.GetLabel() {
				found = found || (l.GetName() == k && l.GetValue() == v)
			}
			ok = ok && found
		}
		if ok {
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}

// ACKs by type, upstream reconnects by group, and the cache by type are on
// /metrics: a client ACKs, the control plane restarts, the cache holds a
// cluster.
func TestMetricsACKsReconnectsAndCacheByType(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("one"))
	r := startRelay(t, cp.Addr, func(c *Config) {
		c.Upstream.ReconnectBaseDelay, c.Upstream.ReconnectMaxDelay = 10*time.Millisecond, 50*time.Millisecond
	})
	s := openDelta(t, r.Addr())
	s.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "c1"), TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"one"}})
	resp := s.recv()
	s.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResponseNonce: resp.GetNonce()})
	cp.Stop()
	cp.Restart()
	eventually(t, "the ACK, the reconnect and the cache by type on /metrics", func() bool {
		mfs := scrape(t, r)
		return value(mfs, "xdsrelay_downstream_acks_total", map[string]string{"type": "Cluster"}) == 1 &&
			value(mfs, "xdsrelay_upstream_reconnects_total", map[string]string{"group": keyOf("c1")}) >= 1 &&
			value(mfs, "xdsrelay_cache_type_resources", map[string]string{"group": keyOf("c1"), "type": "Cluster"}) == 1 &&
			value(mfs, "xdsrelay_cache_type_bytes", map[string]string{"group": keyOf("c1"), "type": "Cluster"}) > 0 &&
			value(mfs, "xdsrelay_cache_type_age_seconds", map[string]string{"group": keyOf("c1"), "type": "Cluster"}) >= 0
	})
}

// The time left on the relay's own certificate is on /metrics, by side.
func TestMetricsCertificateExpiry(t *testing.T) {
	r, _, _ := startTenantRelay(t) // downstream TLS: a certificate valid for an hour
	left := value(scrape(t, r), "xdsrelay_certificate_expiry_seconds", map[string]string{"side": "downstream"})
	if left <= 3000 || left > 3600 {
		t.Fatalf("downstream certificate expires in %vs, want about an hour", left)
	}
}

// A group's series end with the group, whatever its upstream: with
// resource files as with a control plane, /metrics keeps nothing of a
// group once it has ended.
func TestGroupSeriesEndWithTheGroup(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("one"))
	for name, upstream := range map[string]string{"files": exampleFiles(), "control plane": cp.Addr} {
		r := startRelay(t, upstream, func(c *Config) { c.Cache.Retention = 20 * time.Millisecond })
		s := openDelta(t, r.Addr())
		s.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "c1"), TypeUrl: resourcev3.ClusterType})
		s.recv()
		label := `group="` + keyOf("c1") + `"`
		if !strings.Contains(getMetrics(t, r), label) {
			t.Fatalf("%s: no series of the group while it runs", name)
		}
		s.close()
		eventually(t, "the group to end", func() bool { return len(r.snapshotGroups()) == 0 })
		getMetrics(t, r) // the scrape that notices the group has gone
		eventually(t, name+": the group's series to go", func() bool { return !strings.Contains(getMetrics(t, r), label) })
	}
}
