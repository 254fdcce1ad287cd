package metrics

import (
	"slices"
	"testing"
)

func TestFamilies(t *testing.T) {
	r := New(Options{NoGroupLabel: true})
	r.Gauge("b_age_seconds", "Age.", "group").Max()
	r.Counter("a_total", "Things.", "type", "group")
	r.Histogram("c_seconds", "Time.", LatencyBuckets)
	r.Counter("a_total", "Registered again: the first wins.")
	want := []Family{
		{Name: "a_total", Type: "counter", Labels: []string{"type", "group"}, Help: "Things."},
		{Name: "b_age_seconds", Type: "gauge", Labels: []string{"group"}, Help: "Age.", Max: true},
		{Name: "c_seconds", Type: "histogram", Labels: []string{}, Help: "Time."},
	}
	got := r.Families()
	if !slices.EqualFunc(got, want, func(a, b Family) bool {
		return a.Name == b.Name && a.Type == b.Type && slices.Equal(a.Labels, b.Labels) && a.Help == b.Help && a.Max == b.Max
	}) {
		t.Errorf("Families() = %+v, want %+v", got, want)
	}
}
