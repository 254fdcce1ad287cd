package deploy

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const (
	dashboardFile = "grafana/xdsrelay.json"
	alertsFile    = "prometheus/alerts.yaml"
)

// targetLabels are the labels Prometheus adds to every series it scrapes.
var targetLabels = []string{"instance", "job"}

// scraperMetrics are the series Prometheus makes for each target rather
// than scraping them, with their labels.
var scraperMetrics = map[string][]string{"up": targetLabels}

// dashboardVars are values for the dashboard's template variables (and
// Grafana's built-in ones), so that its expressions parse as PromQL.
var dashboardVars = strings.NewReplacer(
	"$__rate_interval", "5m",
	"$instance", ".*",
	"$group", ".*",
)

// query is one PromQL expression of the dashboard or the alerts.
type query struct {
	where string // file and panel, variable or alert
	expr  string
}

// panel is the part of a Grafana panel the tests read; rows nest panels.
type panel struct {
	ID         int            `json:"id"`
	Type       string         `json:"type"`
	Title      string         `json:"title"`
	Datasource *datasourceRef `json:"datasource"`
	Targets    []panelTarget  `json:"targets"`
	Panels     []panel        `json:"panels"`
}

type panelTarget struct {
	RefID      string         `json:"refId"`
	Expr       string         `json:"expr"`
	Datasource *datasourceRef `json:"datasource"`
}

type datasourceRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

// dashboard is the part of the Grafana JSON model the tests read.
type dashboard struct {
	Title      string  `json:"title"`
	UID        string  `json:"uid"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name       string         `json:"name"`
			Type       string         `json:"type"`
			Query      any            `json:"query"` // a string, or {query, refId}
			Datasource *datasourceRef `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

// allPanels is every panel, rows' nested ones included.
func allPanels(ps []panel) []panel {
	var out []panel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, allPanels(p.Panels)...)
	}
	return out
}

// labelValues matches a Grafana variable query label_values(SELECTOR, LABEL).
var labelValues = regexp.MustCompile(`^label_values\((.+),\s*(\w+)\)$`)

// dashboardQueries are the dashboard's panel expressions and variable
// queries (label_values(s, l) as count by (l) (s): the metric and the label
// must exist), template variables substituted.
func dashboardQueries(t *testing.T) []query {
	t.Helper()
	d := loadDashboard(t)
	var qs []query
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, _ := v.Query.(string)
		if m, ok := v.Query.(map[string]any); ok {
			q, _ = m["query"].(string)
		}
		m := labelValues.FindStringSubmatch(q)
		if m == nil {
			t.Errorf("%s: variable %s: query %q is not label_values(selector, label)", dashboardFile, v.Name, q)
			continue
		}
		qs = append(qs, query{fmt.Sprintf("%s variable %s", dashboardFile, v.Name),
			fmt.Sprintf("count by (%s) (%s)", m[2], dashboardVars.Replace(m[1]))})
	}
	for _, p := range allPanels(d.Panels) {
		for _, tg := range p.Targets {
			qs = append(qs, query{fmt.Sprintf("%s panel %q %s", dashboardFile, p.Title, tg.RefID), dashboardVars.Replace(tg.Expr)})
		}
	}
	return qs
}

// loadAlerts loads the rules file with Prometheus's own loader, which
// parses every expression and annotation template.
func loadAlerts(t *testing.T) *rulefmt.RuleGroups {
	t.Helper()
	groups, errs := rulefmt.ParseFile(alertsFile, false, model.UTF8Validation,
		parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	for _, err := range errs {
		t.Error(err)
	}
	if groups == nil {
		t.FailNow()
	}
	return groups
}

func alertQueries(t *testing.T) []query {
	t.Helper()
	var qs []query
	for _, g := range loadAlerts(t).Groups {
		for _, r := range g.Rules {
			qs = append(qs, query{fmt.Sprintf("%s alert %s", alertsFile, r.Alert), r.Expr})
		}
	}
	return qs
}

func TestDashboard(t *testing.T) {
	d := loadDashboard(t)
	if d.Title == "" || d.UID == "" {
		t.Errorf("%s: title %q, uid %q: want both", dashboardFile, d.Title, d.UID)
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
		if v.Type == "query" && (v.Datasource == nil || v.Datasource.UID != "${datasource}") {
			t.Errorf("%s: variable %s does not query ${datasource}", dashboardFile, v.Name)
		}
	}
	if vars["datasource"] != "datasource" {
		t.Errorf("%s: no datasource variable: %v", dashboardFile, vars)
	}
	ids := map[int]string{}
	for _, p := range allPanels(d.Panels) {
		if prev, dup := ids[p.ID]; dup {
			t.Errorf("%s: panels %q and %q share id %d", dashboardFile, prev, p.Title, p.ID)
		}
		ids[p.ID] = p.Title
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("%s: panel %q has no query", dashboardFile, p.Title)
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("%s: panel %q does not query ${datasource}", dashboardFile, p.Title)
		}
		for _, tg := range p.Targets {
			if tg.Datasource != nil && tg.Datasource.UID != "${datasource}" {
				t.Errorf("%s: panel %q %s does not query ${datasource}", dashboardFile, p.Title, tg.RefID)
			}
		}
	}
	for _, q := range dashboardQueries(t) {
		if strings.Contains(q.expr, "$") {
			t.Errorf("%s: a template variable the test does not know: %s", q.where, q.expr)
			continue
		}
		if _, err := parser.NewParser(parser.Options{}).ParseExpr(q.expr); err != nil {
			t.Errorf("%s: %v", q.where, err)
		}
	}
}

func TestAlerts(t *testing.T) {
	doc, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, g := range loadAlerts(t).Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				t.Errorf("%s: group %s: a rule that is not an alert: %q", alertsFile, g.Name, r.Expr)
				continue
			}
			if seen[r.Alert] {
				t.Errorf("%s: alert %s twice", alertsFile, r.Alert)
			}
			seen[r.Alert] = true
			if !strings.Contains(string(doc), "`"+r.Alert+"`") {
				t.Errorf("docs/operations.md does not list alert %s", r.Alert)
			}
			if s := r.Labels["severity"]; s != "warning" && s != "critical" {
				t.Errorf("%s: alert %s: severity %q, want warning or critical", alertsFile, r.Alert, s)
			}
			for _, a := range []string{"summary", "description"} {
				if r.Annotations[a] == "" {
					t.Errorf("%s: alert %s has no %s", alertsFile, r.Alert, a)
				}
			}
		}
	}
}

// TestMonitoringMatchesMetrics boots the relay, drives it until it has
// shown every kind of event the dashboard and the alerts watch (a fallback,
// NACKs both ways, a guard hold, a rollout halt, a limit refusal), and
// checks that each metric they name, and each label they select or group
// by, is on its /metrics. A family appears there only once it has a series,
// so it is not enough to boot the relay.
func TestMonitoringMatchesMetrics(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the relay")
	}
	queries := append(dashboardQueries(t), alertQueries(t)...)
	bin := relayBinary(t)
	cp := startControlPlane(t)
	certFile, keyFile, pool := makeCert(t)
	r := startRelay(t, bin, monitoredRelayConfig(deadAddress(t), cp.addr, certFile, keyFile), pool)
	exercise(t, r, cp)

	deadline := time.Now().Add(wait)
	for {
		exposed := exposedLabels(r.scrape(t))
		var problems []string
		for _, q := range queries {
			problems = append(problems, checkQuery(q, exposed)...)
		}
		if len(problems) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("on the relay's /metrics:\n%s", strings.Join(problems, "\n"))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// monitoredRelayConfig is the relay under test: its control plane at a
// dead address with cp as the fallback, admin over TLS (a certificate to
// expire), one canary per group, the guard, and one group at most.
func monitoredRelayConfig(dead, cp, certFile, keyFile string) string {
	return fmt.Sprintf(`upstream:
  address: %s
  addresses: [%s]
  fallback_recheck: 1m
  group_by: [cluster]
  reconnect:
    base_delay: 20ms
    max_delay: 100ms
downstream:
  address: 127.0.0.1:0
admin:
  address: 127.0.0.1:0
  tls:
    cert_file: %s
    key_file: %s
limits:
  max_groups: 1
guard:
  max_removed_fraction: 0.5
  min_resources: 10
rollout:
  canary: 1
  bake: 1m
shutdown_timeout: 1s
log:
  format: json
`, dead, cp, strconv.Quote(certFile), strconv.Quote(keyFile))
}

// exercise makes the relay fall back to cp, serve a canary client that
// NACKs a change, NACK a response from cp, hold cp's mass removal, refuse a
// second group, and take a client's load report.
func exercise(t *testing.T, r *relayProc, cp *controlPlane) {
	names := make([]string, 10)
	for i := range names {
		names[i] = fmt.Sprintf("c%d", i)
	}
	canary := dialClient(t, r.downstream)
	canary.send(t, subscribe("canary", "fleet", names))

	// The group's stream finds the primary dead and falls back to cp.
	up := cp.stream(t)
	wanted := map[string]bool{}
	for len(wanted) < len(names) {
		for _, n := range up.recv(t).GetResourceNamesSubscribe() {
			wanted[n] = true
		}
	}
	initial := make([]*discoverypb.Resource, len(names))
	for i, n := range names {
		initial[i] = cluster(t, n, "1", 1)
	}
	up.send(t, &discoverypb.DeltaDiscoveryResponse{TypeUrl: clusterType, Nonce: "1", Resources: initial})
	got := map[string]bool{}
	for len(got) < len(names) {
		resp := recvOK(t, canary)
		for _, res := range resp.GetResources() {
			got[res.GetName()] = true
		}
		canary.send(t, ack(resp))
	}

	// A change goes to the canary first, which NACKs it: the rollout halts.
	up.send(t, &discoverypb.DeltaDiscoveryResponse{TypeUrl: clusterType, Nonce: "2",
		Resources: []*discoverypb.Resource{cluster(t, "c0", "2", 2)}})
	for {
		resp := recvOK(t, canary)
		if slices.ContainsFunc(resp.GetResources(), func(r *discoverypb.Resource) bool { return r.GetName() == "c0" }) {
			canary.send(t, nack(resp, "c0 is broken"))
			break
		}
		canary.send(t, ack(resp))
	}

	// A name twice in one response: the relay NACKs it.
	up.send(t, &discoverypb.DeltaDiscoveryResponse{TypeUrl: clusterType, Nonce: "3",
		Resources: []*discoverypb.Resource{cluster(t, "c8", "3", 3), cluster(t, "c8", "3", 3)}})
	if up.answer(t, "3").GetErrorDetail() == nil {
		t.Fatal("the relay ACKed a response that names c8 twice")
	}

	// Seven of ten removed at once: the guard holds the removals.
	up.send(t, &discoverypb.DeltaDiscoveryResponse{TypeUrl: clusterType, Nonce: "4", RemovedResources: names[1:8]})
	up.answer(t, "4")

	// A second group is one past limits.max_groups.
	other := dialClient(t, r.downstream)
	other.send(t, subscribe("other", "another-fleet", names[:1]))
	if _, err := other.recv(t); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a second group: %v, want RESOURCE_EXHAUSTED", err)
	}

	reportLoad(t, r.downstream, "fleet")
}

func recvOK(t *testing.T, c *xdsClient) *discoverypb.DeltaDiscoveryResponse {
	t.Helper()
	resp, err := c.recv(t)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// exposedLabels maps every series name a scrape holds (a histogram's
// _bucket, _sum and _count) to its label names.
func exposedLabels(families map[string]*dto.MetricFamily) map[string][]string {
	out := map[string][]string{}
	add := func(name string, labels ...string) {
		for _, l := range labels {
			if !slices.Contains(out[name], l) {
				out[name] = append(out[name], l)
			}
		}
		if out[name] == nil {
			out[name] = []string{}
		}
	}
	for name, f := range families {
		var labels []string
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				labels = append(labels, lp.GetName())
			}
		}
		if f.GetType() == dto.MetricType_HISTOGRAM {
			add(name+"_bucket", append(labels, "le")...)
			add(name+"_sum", labels...)
			add(name+"_count", labels...)
			continue
		}
		add(name, labels...)
	}
	for name, labels := range scraperMetrics {
		add(name, labels...)
	}
	return out
}

// checkQuery lists what q names that exposed lacks: metrics, the labels its
// selectors match on, and those it aggregates or matches by.
func checkQuery(q query, exposed map[string][]string) []string {
	expr, err := parser.NewParser(parser.Options{}).ParseExpr(q.expr)
	if err != nil {
		return []string{fmt.Sprintf("%s: %v", q.where, err)}
	}
	var problems []string
	report := func(format string, args ...any) {
		problems = append(problems, q.where+": "+fmt.Sprintf(format, args...))
	}
	parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
		switch n := node.(type) {
		case *parser.VectorSelector:
			labels, ok := exposed[n.Name]
			if !ok {
				report("no metric %q", n.Name)
				return nil
			}
			for _, m := range n.LabelMatchers {
				if m.Name != model.MetricNameLabel && !slices.Contains(labels, m.Name) && !slices.Contains(targetLabels, m.Name) {
					report("%s has no label %q", n.Name, m.Name)
				}
			}
		case *parser.AggregateExpr:
			if !n.Without {
				problems = append(problems, missingLabels(q.where, n.Grouping, exposed, n.Expr)...)
			}
		case *parser.BinaryExpr:
			if n.VectorMatching != nil && n.VectorMatching.On {
				problems = append(problems, missingLabels(q.where, n.VectorMatching.MatchingLabels, exposed, n.LHS, n.RHS)...)
			}
		}
		return nil
	})
	return problems
}

// missingLabels reports the labels that no metric selected under exprs
// carries (target labels aside).
func missingLabels(where string, labels []string, exposed map[string][]string, exprs ...parser.Node) []string {
	var have []string
	var metrics []string
	for _, e := range exprs {
		parser.Inspect(e, func(node parser.Node, _ []parser.Node) error {
			if vs, ok := node.(*parser.VectorSelector); ok {
				have = append(have, exposed[vs.Name]...)
				metrics = append(metrics, vs.Name)
			}
			return nil
		})
	}
	var problems []string
	for _, l := range labels {
		if !slices.Contains(have, l) && !slices.Contains(targetLabels, l) {
			problems = append(problems, fmt.Sprintf("%s: no label %q on %v", where, l, metrics))
		}
	}
	return problems
}
