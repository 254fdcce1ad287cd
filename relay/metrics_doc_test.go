package relay

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	dto "github.com/prometheus/client_model/go"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// docMetric is a row of docs/metrics.md's table.
type docMetric struct {
	kind   string   // counter, gauge or histogram
	labels []string // sorted
}

var docMetricRow = regexp.MustCompile("^\\| `(xdsrelay_[a-z_]+)` \\| ([a-z]+)[^|]*\\| ([^|]*)\\|")

// docMetrics reads the table of docs/metrics.md.
func docMetrics(t *testing.T) map[string]docMetric {
	t.Helper()
	b, err := os.ReadFile("../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]docMetric{}
	for _, line := range strings.Split(string(b), "\n") {
		m := docMetricRow.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		var labels []string
		for _, l := range backquotedWords.FindAllStringSubmatch(m[3], -1) {
			labels = append(labels, l[1])
		}
		slices.Sort(labels)
		out[m[1]] = docMetric{kind: m[2], labels: labels}
	}
	if len(out) == 0 {
		t.Fatal("docs/metrics.md: no metrics table")
	}
	return out
}

var backquotedWords = regexp.MustCompile("`([a-z_]+)`")

// gathered is what /metrics serves (the handler's own gatherer), by family.
func gathered(t *testing.T, r *Relay) map[string]*dto.MetricFamily {
	t.Helper()
	mfs, err := r.metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out
}

func labelNames(m *dto.Metric) []string {
	var out []string
	for _, l := range m.GetLabel() {
		out = append(out, l.GetName())
	}
	slices.Sort(out)
	return out
}

func counterValue(m *dto.Metric) float64 { return m.GetCounter().GetValue() }

// docs/metrics.md's table is /metrics: every family it lists is
// served, of its type and with its labels, and every xdsrelay_ family
// served is listed. A counter whose labels take a finite set of values
// (not a group) has its series at 0 from the start, every type's for a
// type label, so that a first event is an increase; a group's counters
// are born with the group.
func TestMetricsDocIsMetrics(t *testing.T) {
	want := docMetrics(t)
	cp := testcp.Start(t)
	cp.Set(t, "tenant-a", "1", testcp.Cluster("x"))
	certs := testcp.MakeCerts(t)
	// A control plane, a second one for secrets (the router), and admin
	// TLS (a certificate's expiry).
	a := startRelay(t, cp.Addr, withUpstream("secrets", cp.Addr, []string{"secrets"}, nil), func(c *Config) {
		c.Admin.TLS.CertFile, c.Admin.TLS.KeyFile = certs.ServerCert, certs.ServerKey
	})
	start := gathered(t, a)
	for name, rm := range want {
		if rm.kind != "counter" || slices.Contains(rm.labels, "group") {
			continue
		}
		mf := start[name]
		if mf == nil || len(mf.GetMetric()) == 0 {
			t.Errorf("%s: not on /metrics at start", name)
			continue
		}
		types := map[string]bool{}
		for _, m := range mf.GetMetric() {
			if v := counterValue(m); v != 0 {
				t.Errorf("%s%v: %v at start, want 0", name, m.GetLabel(), v)
			}
			for _, l := range m.GetLabel() {
				if l.GetName() == "type" {
					types[l.GetValue()] = true
				}
			}
		}
		if slices.Contains(rm.labels, "type") && len(types) != len(xds.Types) {
			t.Errorf("%s: at start, series of types %v, want every type's", name, types)
		}
	}

	s := openDelta(t, a.Addr())
	s.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "tenant-a"), TypeUrl: resourcev3.ClusterType})
	s.recv()
	// Resource files, and an admin address that is not loopback without
	// TLS (a configuration warning).
	b := startRelay(t, FilePrefix+t.TempDir(), publicAdmin(t))
	got := gathered(t, a)
	for name, mf := range gathered(t, b) {
		if got[name] == nil {
			got[name] = mf
		}
	}
	for name, mf := range got {
		if !strings.HasPrefix(name, "xdsrelay_") {
			continue
		}
		rm, ok := want[name]
		switch {
		case !ok:
			t.Errorf("%s is on /metrics, not in docs/metrics.md", name)
			continue
		case !strings.EqualFold(mf.GetType().String(), rm.kind):
			t.Errorf("%s: a %s, docs/metrics.md says %s", name, strings.ToLower(mf.GetType().String()), rm.kind)
		}
		for _, m := range mf.GetMetric() {
			if ln := labelNames(m); !slices.Equal(ln, rm.labels) {
				t.Errorf("%s: labels %v, docs/metrics.md says %v", name, ln, rm.labels)
				break
			}
		}
	}
	for name := range want {
		if got[name] == nil {
			t.Errorf("docs/metrics.md lists %s, which is not on /metrics", name)
		}
	}
	for _, name := range []string{"xdsrelay_upstream_reconnects_total", "xdsrelay_cache_evictions_total"} {
		if mf := got[name]; mf == nil || len(mf.GetMetric()) != 1 || counterValue(mf.GetMetric()[0]) != 0 {
			t.Errorf("%s: %v, want the group's series at 0", name, mf.GetMetric())
		}
	}
}

// Every family docs/metrics.md lists is on /metrics right after start,
// whatever the upstream: a control plane, resource files, several control
// planes. A family with a finite set of label values has each series (at 0,
// or with no observation); the exceptions are the group's families, born
// with the group (every one is there once a client joins), and the
// certificates' expiry, a series per configured certificate (here the
// admin's).
func TestEveryFamilyFromTheStart(t *testing.T) {
	want := docMetrics(t)
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("x"))
	certs := testcp.MakeCerts(t)
	adminTLS := func(c *Config) { c.Admin.TLS.CertFile, c.Admin.TLS.KeyFile = certs.ServerCert, certs.ServerKey }
	for _, tc := range []struct {
		name     string
		upstream string
		more     []func(*Config)
	}{
		{"a control plane", cp.Addr, nil},
		{"resource files", exampleFiles(), nil},
		{"several control planes", cp.Addr, []func(*Config){withUpstream("secrets", cp.Addr, []string{"secrets"}, nil)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := startRelay(t, tc.upstream, append(tc.more, adminTLS)...)
			start := gathered(t, r)
			for name, rm := range want {
				if slices.Contains(rm.labels, "group") {
					continue
				}
				if mf := start[name]; mf == nil || len(mf.GetMetric()) == 0 {
					t.Errorf("%s: not on /metrics at start", name)
				}
			}
			s := openDelta(t, r.Addr())
			s.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "c1"), TypeUrl: resourcev3.ClusterType})
			s.recv()
			joined := gathered(t, r)
			for name := range want {
				if mf := joined[name]; mf == nil || len(mf.GetMetric()) == 0 {
					t.Errorf("%s: not on /metrics once a client joined", name)
				}
			}
		})
	}
}
