package deploy

import (
	"math"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/util/teststorage"
)

// seriesLine is a sample line of the text formats: name, labels, value,
// and what follows (a timestamp, an exemplar).
var seriesLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})? (\S+)(.*)$`)

// labelPair is one label of a sample line.
var labelPair = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)

// withValues is scrape s with the value of each series that set chooses
// replaced: set is given the series' name and labels as the relay wrote
// them, and returns its new value and true, or false to keep it. It fails
// t if set chose no series.
func withValues(t *testing.T, s sample, set func(name string, labels map[string]string) (float64, bool)) sample {
	t.Helper()
	lines := strings.Split(string(s.body), "\n")
	changed := 0
	for i, line := range lines {
		m := seriesLine.FindStringSubmatch(line)
		if m == nil || strings.HasPrefix(line, "#") {
			continue
		}
		labels := map[string]string{}
		for _, p := range labelPair.FindAllStringSubmatch(m[2], -1) {
			labels[p[1]] = p[2]
		}
		v, ok := set(m[1], labels)
		if !ok {
			continue
		}
		lines[i] = m[1] + "{" + m[2] + "} " + strconv.FormatFloat(v, 'g', -1, 64) + m[4]
		changed++
	}
	if changed == 0 {
		t.Fatal("no series of the scrape to change")
	}
	return sample{body: []byte(strings.Join(lines, "\n")), contentType: s.contentType}
}

// testSlowConvergence: with 100 ACKs of Cluster changes each taken more
// than 30s and 100 of RouteConfiguration changes each taken under 1s,
// between two scrapes, XdsrelaySlowConvergence returns the Cluster series
// alone; before, nothing.
func testSlowConvergence(t *testing.T, before sample, t0 time.Time) {
	after := withValues(t, before, func(name string, l map[string]string) (float64, bool) {
		slow := l["type"] == "Cluster"
		if !slow && l["type"] != "RouteConfiguration" {
			return 0, false
		}
		switch name {
		case "xdsrelay_convergence_seconds_count":
			return 100, true
		case "xdsrelay_convergence_seconds_sum":
			if slow {
				return 100 * 45, true
			}
			return 100 * 0.5, true
		case "xdsrelay_convergence_seconds_bucket":
			le, err := strconv.ParseFloat(l["le"], 64)
			if err != nil {
				t.Fatalf("bucket le %q: %v", l["le"], err)
			}
			if (slow && le > 30) || (!slow && le >= 1) || math.IsInf(le, 1) {
				return 100, true
			}
			return 0, true
		}
		return 0, false
	})
	holdsAfter(t, "XdsrelaySlowConvergence", 10*time.Minute, before, after, t0, "Cluster", "with Clusters accepted after more than 30s and Routes within 1s")
}

// testReferenceWaitsTimingOut: with RouteConfiguration waits that timed
// out and Cluster removals' waits that resolved between two scrapes,
// XdsrelayReferenceWaitsTimingOut returns the RouteConfiguration series
// alone; before, nothing.
func testReferenceWaitsTimingOut(t *testing.T, before sample, t0 time.Time) {
	after := withValues(t, before, func(name string, l map[string]string) (float64, bool) {
		if name != "xdsrelay_reference_waits_total" {
			return 0, false
		}
		switch {
		case l["type"] == "RouteConfiguration" && l["outcome"] == "timeout",
			l["type"] == "Cluster" && l["outcome"] == "resolved":
			return 3, true
		}
		return 0, false
	})
	holdsAfter(t, "XdsrelayReferenceWaitsTimingOut", 10*time.Minute, before, after, t0, "RouteConfiguration", "with Route waits timing out and Cluster removals' waits resolved")
}

// testFleetViewDisagrees: with a member whose view differs from another's
// between two scrapes, XdsrelayFleetViewDisagrees returns the instance's
// series, held for a minute; before, nothing.
func testFleetViewDisagrees(t *testing.T, before sample, t0 time.Time) {
	after := withValues(t, before, func(name string, _ map[string]string) (float64, bool) {
		return 1, name == "xdsrelay_fleet_view_disagreements"
	})
	rule := loadAlertRule(t, "XdsrelayFleetViewDisagrees")
	if rule.hold != time.Minute {
		t.Errorf("XdsrelayFleetViewDisagrees for: %v, want 1m", rule.hold)
	}
	st := teststorage.New(t)
	ingest(t, st, before, t0)
	ingest(t, st, after, t0.Add(scrapeInterval))
	if got := holding(t, rule, st, t0); len(got) != 0 {
		t.Errorf("XdsrelayFleetViewDisagrees with every view agreeing: %v", got)
	}
	if got := holding(t, rule, st, t0.Add(scrapeInterval)); len(got) != 1 || !strings.Contains(got[0], "instance=") {
		t.Errorf("XdsrelayFleetViewDisagrees with a view that differs: %v, want the instance's series", got)
	}
}

// testFleetPeersUnreachable: with a listed peer that does not answer
// between two scrapes, XdsrelayFleetPeersUnreachable returns the
// instance's series, held for 5 minutes; before, nothing.
func testFleetPeersUnreachable(t *testing.T, before sample, t0 time.Time) {
	after := withValues(t, before, func(name string, _ map[string]string) (float64, bool) {
		return 1, name == "xdsrelay_fleet_unreachable_peers"
	})
	rule := loadAlertRule(t, "XdsrelayFleetPeersUnreachable")
	if rule.hold != 5*time.Minute {
		t.Errorf("XdsrelayFleetPeersUnreachable for: %v, want 5m", rule.hold)
	}
	st := teststorage.New(t)
	ingest(t, st, before, t0)
	ingest(t, st, after, t0.Add(scrapeInterval))
	if got := holding(t, rule, st, t0); len(got) != 0 {
		t.Errorf("XdsrelayFleetPeersUnreachable with every peer answering: %v", got)
	}
	if got := holding(t, rule, st, t0.Add(scrapeInterval)); len(got) != 1 || !strings.Contains(got[0], "instance=") {
		t.Errorf("XdsrelayFleetPeersUnreachable with a peer that does not answer: %v, want the instance's series", got)
	}
}

// holdsAfter checks the state alert name (for: hold) over scrape before at
// t0 and scrape after one interval later: it returns nothing at t0, and
// one series, of type typ, after (what says how after differs). It
// returns the storage, for other rules to be read over the same scrapes.
func holdsAfter(t *testing.T, name string, hold time.Duration, before, after sample, t0 time.Time, typ, what string) storage.Queryable {
	t.Helper()
	rule := loadAlertRule(t, name)
	if rule.hold != hold {
		t.Errorf("%s for: %v, want %v", name, rule.hold, hold)
	}
	st := teststorage.New(t)
	ingest(t, st, before, t0)
	ingest(t, st, after, t0.Add(scrapeInterval))
	if got := holding(t, rule, st, t0); len(got) != 0 {
		t.Errorf("%s before: %v", name, got)
	}
	if got := holding(t, rule, st, t0.Add(scrapeInterval)); len(got) != 1 || !strings.Contains(got[0], `type="`+typ+`"`) {
		t.Errorf("%s %s: %v, want one series of type %s", name, what, got, typ)
	}
	return st
}

// testClientsBehind: with 3 clients behind on a Cluster between two
// scrapes, XdsrelayClientsBehind returns the Cluster series alone; before,
// nothing.
func testClientsBehind(t *testing.T, before sample, t0 time.Time) {
	after := withValues(t, before, func(name string, l map[string]string) (float64, bool) {
		if name != "xdsrelay_clients_behind" {
			return 0, false
		}
		if l["type"] == "Cluster" {
			return 3, true
		}
		return 0, true
	})
	holdsAfter(t, "XdsrelayClientsBehind", 15*time.Minute, before, after, t0, "Cluster", "with 3 clients behind on a Cluster")
}
