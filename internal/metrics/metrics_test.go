package metrics

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
)

func text(t *testing.T, r *Registry) string {
	t.Helper()
	var b strings.Builder
	if _, err := r.WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestBound(t *testing.T) {
	short := strings.Repeat("a", MaxLabelLen)
	if Bound(short) != short {
		t.Errorf("a %d-byte value is changed", MaxLabelLen)
	}
	long, other := Bound(short+"a"), Bound(short+"b")
	if !strings.HasPrefix(long, "sha256:") || len(long) > MaxLabelLen || long == other {
		t.Errorf("long values: %q, %q", long, other)
	}
	if got := Bound("\xff"); !strings.HasPrefix(got, "sha256:") {
		t.Errorf("invalid UTF-8 kept: %q", got)
	}
}

// Without the group label, the groups' series are summed, or the largest
// kept for a Max family; deleting a group's series still works.
func TestNoGroupLabel(t *testing.T) {
	r := New(Options{NoGroupLabel: true})
	sum := r.Gauge("sum", "Sum.", "group", "type")
	most := r.Gauge("most", "Most.", "group").Max()
	sum.With("a", "x").Set(2)
	sum.With("b", "x").Set(3)
	sum.With("c", "y").Set(7)
	most.With("a").Set(4)
	most.With("b").Set(9)
	got := text(t, r)
	for _, want := range []string{"sum{type=\"x\"} 5\n", "sum{type=\"y\"} 7\n", "most 9\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("no %q in:\n%s", want, got)
		}
	}
	most.Delete("b")
	if got := text(t, r); !strings.Contains(got, "most 4\n") {
		t.Errorf("after delete:\n%s", got)
	}
}

// A family registered twice is the same family, and OnScrape runs first.
func TestRegistry(t *testing.T) {
	var r Registry
	c := r.Counter("c_total", "C.", "group")
	if r.Counter("c_total", "C.", "group") != c {
		t.Error("a second registration made another family")
	}
	r.OnScrape(func() { c.With("g\t\"").Set(3) })
	h := r.Histogram("h_seconds", "H.", []float64{1}, "type")
	h.With("t").Observe(0.5)
	got := text(t, &r)
	for _, want := range []string{"c_total{group=\"g\t\\\"\"} 3\n", "h_seconds_bucket{type=\"t\",le=\"1\"} 1\n", "go_goroutines"} {
		if !strings.Contains(got, want) {
			t.Errorf("no %q in:\n%s", want, got)
		}
	}
}

// OnScrape functions run without the registry's lock: one may register a
// family or another function, and scrapes may run beside registrations.
func TestOnScrapeRunsUnlocked(t *testing.T) {
	var r Registry
	r.OnScrape(func() {
		r.Gauge("late", "Late.", "group").With("g").Set(1)
		r.OnScrape(func() {})
	})
	done := make(chan string, 1)
	go func() {
		var b strings.Builder
		_, _ = r.WriteTo(&b)
		done <- b.String()
	}()
	for i := range 100 {
		r.Counter("c_total", "C.", "group").With(strconv.Itoa(i)).Inc()
	}
	select {
	case got := <-done:
		if !strings.Contains(got, "late{group=\"g\"} 1\n") {
			t.Errorf("the family the OnScrape function registered is not gathered:\n%s", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a scrape whose OnScrape function registers a family never ended")
	}
}

// The handler serves OpenMetrics to a scraper that asks for it in its
// Accept header (as Prometheus's does), and the text format otherwise; a
// series made with Zero is there at 0 before its first event.
func TestHandlerServesOpenMetricsWhenAsked(t *testing.T) {
	var r Registry
	r.Counter("events_total", "Events.", "kind", "why").Zero(Cross([]string{"a", "b"}, []string{"x"})...)
	r.Counter("holds_total", "Holds.", "type").ZeroEach("Cluster")
	srv := httptest.NewServer(r.Handler())
	defer srv.Close()
	fetch := func(accept string) (string, string) {
		req, err := http.NewRequest(http.MethodGet, srv.URL, nil)
		if err != nil {
			t.Fatal(err)
		}
		if accept != "" {
			req.Header.Set("Accept", accept)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.Header.Get("Content-Type"), string(b)
	}
	ct, body := fetch("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
	if !strings.HasPrefix(ct, "application/openmetrics-text; version=1.0.0") {
		t.Errorf("Content-Type %q, want OpenMetrics 1.0.0", ct)
	}
	for _, want := range []string{"# TYPE events counter\n", `events_total{kind="a",why="x"} 0.0` + "\n", `events_total{kind="b",why="x"} 0.0` + "\n",
		`holds_total{type="Cluster"} 0.0` + "\n"} {
		if !strings.Contains(body, want) {
			t.Errorf("OpenMetrics: no %q in:\n%s", want, body)
		}
	}
	if !strings.HasSuffix(body, "# EOF\n") {
		t.Errorf("OpenMetrics body does not end with # EOF: %q", body[max(0, len(body)-40):])
	}
	ct, body = fetch("")
	if !strings.HasPrefix(ct, "text/plain; version=0.0.4") || strings.Contains(body, "# EOF") {
		t.Errorf("without Accept: Content-Type %q, want the text format", ct)
	}
}
