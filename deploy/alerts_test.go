package deploy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/textparse"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/util/teststorage"
)

// firstEventAlerts are the alerts on an event in the last 10 minutes, each
// with the counter that counts the event.
var firstEventAlerts = map[string]string{
	"XdsrelayGuardHold":        "xdsrelay_guard_holds_total",
	"XdsrelayRolloutHalted":    "xdsrelay_rollout_halts_total",
	"XdsrelayUpstreamFallback": "xdsrelay_upstream_fallbacks_total",
	"XdsrelayUpstreamNACKs":    "xdsrelay_upstream_nacks_total",
}

// scrapeInterval is the time between the synthetic scrapes.
const scrapeInterval = 15 * time.Second

// sample is one scrape's body, as Prometheus's scraper receives it.
type sample struct {
	body        []byte
	contentType string
}

// prometheusAccept is the Accept header of Prometheus's scraper with its
// default scrape_protocols (config.DefaultScrapeProtocols: OpenMetrics
// 1.0.0 and 0.0.1, then the text format 1.0.0 and 0.0.4), as its
// acceptHeader writes it.
const prometheusAccept = "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6," +
	"application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4," +
	"text/plain;version=0.0.4;q=0.3,*/*;q=0.2"

// scrapeAsPrometheus GETs /metrics as Prometheus's scraper does.
func scrapeAsPrometheus(t *testing.T, p *relayProc) sample {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, p.scheme+"://"+p.admin+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", prometheusAccept)
	resp, err := p.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %d %v", resp.StatusCode, err)
	}
	return sample{body: body, contentType: resp.Header.Get("Content-Type")}
}

// ingest parses a scrape with Prometheus's own parser and appends its
// samples at ts, with the target's labels, as the scraper would.
func ingest(t *testing.T, st storage.Appendable, s sample, ts time.Time) {
	t.Helper()
	p, err := textparse.New(s.body, s.contentType, labels.NewSymbolTable(), textparse.ParserOptions{})
	if err != nil {
		t.Fatalf("parsing a scrape of %s: %v", s.contentType, err)
	}
	app := st.Appender(context.Background())
	for {
		entry, err := p.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("parsing a scrape: %v", err)
		}
		if entry != textparse.EntrySeries {
			continue
		}
		_, _, v := p.Series()
		var lset labels.Labels
		p.Labels(&lset)
		b := labels.NewBuilder(lset)
		b.Set("instance", "relay-0")
		b.Set("job", "xdsrelay")
		if _, err := app.Append(0, b.Labels(), ts.UnixMilli(), v); err != nil {
			t.Fatalf("append %s: %v", lset, err)
		}
	}
	if err := app.Commit(); err != nil {
		t.Fatal(err)
	}
}

// alertRule is an alert of the rules file, as Prometheus's loader reads
// it.
type alertRule struct {
	name string
	expr string
	hold time.Duration // for:
}

func loadAlertRule(t *testing.T, name string) alertRule {
	t.Helper()
	for _, g := range loadAlerts(t).Groups {
		for _, r := range g.Rules {
			if r.Alert == name {
				return alertRule{name: r.Alert, expr: r.Expr, hold: time.Duration(r.For)}
			}
		}
	}
	t.Fatalf("%s: no alert %s", alertsFile, name)
	return alertRule{}
}

// firing evaluates the alert's expression at ts with Prometheus's PromQL
// engine, as its rule manager does at each evaluation, and returns the
// label sets that fire: those the expression returns, for an alert with
// for: 0m.
func firing(t *testing.T, rule alertRule, st storage.Queryable, ts time.Time) []string {
	t.Helper()
	if rule.hold != 0 {
		t.Fatalf("%s: for: %v, want 0m: the alert is on an event", rule.name, rule.hold)
	}
	engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 1e6, Timeout: 10 * time.Second, LookbackDelta: 5 * time.Minute})
	q, err := engine.NewInstantQuery(context.Background(), st, nil, rule.expr, ts)
	if err != nil {
		t.Fatalf("%s: %v", rule.name, err)
	}
	defer q.Close()
	res := q.Exec(context.Background())
	if res.Err != nil {
		t.Fatalf("%s: %v", rule.name, res.Err)
	}
	vec, err := res.Vector()
	if err != nil {
		t.Fatalf("%s: %v", rule.name, err)
	}
	var out []string
	for _, s := range vec {
		out = append(out, s.Metric.String())
	}
	return out
}

// The alerts on an event fire on a process's first one, by Prometheus's
// own PromQL engine over the relay's scraped samples: scraped before
// and after the event; scraped for the first time after it (the series is
// new to Prometheus, and already above 0); and not any more once the event
// is older than the alert's 10 minutes.
func TestAlertsFireOnFirstEvent(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the relay")
	}
	cp := startControlPlane(t)
	certFile, keyFile, pool := makeCert(t)
	r := startRelay(t, relayBinary(t), monitoredRelayConfig(deadAddress(t), cp.addr, certFile, keyFile), pool)
	before := scrapeAsPrometheus(t, r)
	if !strings.HasPrefix(before.contentType, "application/openmetrics-text") {
		t.Errorf("/metrics to Prometheus's scraper: %s, want OpenMetrics", before.contentType)
	}
	exercise(t, r, cp)
	var after sample
	deadline := time.Now().Add(wait)
	for {
		after = scrapeAsPrometheus(t, r)
		if allCounted(t, after) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not every event counted:\n%s", after.body)
		}
		time.Sleep(50 * time.Millisecond)
	}

	t0 := time.Now().Truncate(time.Minute)
	// The canary that NACKed the change rejects the current version: a
	// state, held by for: 10m, absent before it.
	t.Run("XdsrelayClientsRejecting", func(t *testing.T) {
		st := holdsAfter(t, "XdsrelayClientsRejecting", 10*time.Minute, before, after, t0, "Cluster", "with the canary rejecting the change")
		behind := loadAlertRule(t, "XdsrelayClientsBehind")
		if got := holding(t, behind, st, t0); len(got) != 0 {
			t.Errorf("XdsrelayClientsBehind before any change: %v", got)
		}
	})
	// The alerts on a state no exercise reaches in a test's time (clients
	// slow for minutes, references that keep timing out): over the
	// relay's own scrape with one series' values moved.
	t.Run("XdsrelaySlowConvergence", func(t *testing.T) { testSlowConvergence(t, before, t0) })
	t.Run("XdsrelayReferenceWaitsTimingOut", func(t *testing.T) { testReferenceWaitsTimingOut(t, before, t0) })
	t.Run("XdsrelayClientsBehind", func(t *testing.T) { testClientsBehind(t, before, t0) })
	t.Run("XdsrelayFleetViewDisagrees", func(t *testing.T) { testFleetViewDisagrees(t, before, t0) })
	t.Run("XdsrelayFleetPeersUnreachable", func(t *testing.T) { testFleetPeersUnreachable(t, before, t0) })
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for n := range firstEventAlerts {
			if !yield(n) {
				return
			}
		}
	}) {
		t.Run(name, func(t *testing.T) {
			// Scraped before the event (the counter at 0) and after it.
			both := teststorage.New(t)
			ingest(t, both, before, t0)
			ingest(t, both, after, t0.Add(scrapeInterval))
			if got := firing(t, loadAlertRule(t, name), both, t0.Add(scrapeInterval)); len(got) == 0 {
				t.Error("does not fire on the first event, scraped before and after it")
			}
			if got := firing(t, loadAlertRule(t, name), both, t0); len(got) != 0 {
				t.Errorf("fires before the event: %v", got)
			}

			// First scraped after the event.
			late := teststorage.New(t)
			ingest(t, late, after, t0)
			if got := firing(t, loadAlertRule(t, name), late, t0); len(got) == 0 {
				t.Error("does not fire on the first event when the first scrape came after it")
			}

			// The event 11 minutes old, the process scraped all along.
			for ts := t0.Add(2 * scrapeInterval); !ts.After(t0.Add(11 * time.Minute)); ts = ts.Add(scrapeInterval) {
				ingest(t, both, after, ts)
			}
			if got := firing(t, loadAlertRule(t, name), both, t0.Add(11*time.Minute)); len(got) != 0 {
				t.Errorf("still fires 11 minutes after the event: %v", got)
			}
		})
	}
}

// holding evaluates the expression of an alert on a state (with a for:
// hold, which Prometheus's rule manager applies) at ts with Prometheus's
// PromQL engine, and returns the label sets it returns.
func holding(t *testing.T, rule alertRule, st storage.Queryable, ts time.Time) []string {
	t.Helper()
	if rule.hold == 0 {
		t.Fatalf("%s: for: 0m, want a hold: the alert is on a state", rule.name)
	}
	rule.hold = 0
	return firing(t, rule, st, ts)
}

// allCounted reports whether every first-event alert's counter is above 0
// in the scrape.
func allCounted(t *testing.T, s sample) bool {
	t.Helper()
	p, err := textparse.New(s.body, s.contentType, labels.NewSymbolTable(), textparse.ParserOptions{})
	if err != nil {
		t.Fatal(err)
	}
	counted := map[string]bool{}
	for {
		entry, err := p.Next()
		if err != nil {
			break
		}
		if entry != textparse.EntrySeries {
			continue
		}
		_, _, v := p.Series()
		var lset labels.Labels
		p.Labels(&lset)
		if v > 0 {
			counted[lset.Get(model.MetricNameLabel)] = true
		}
	}
	for _, metric := range firstEventAlerts {
		if !counted[metric] {
			return false
		}
	}
	return true
}
