package metrics

import (
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
