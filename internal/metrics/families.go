package metrics

import (
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// Family describes a registered family, as the metrics reference
// (docs/metrics.md) lists it.
type Family struct {
	Name   string
	Type   string   // counter, gauge or histogram
	Labels []string // as registered, the group label included
	Help   string
	// Max is set for a family whose value, without the group label, is
	// the largest of the groups' rather than their sum (see Vec.Max).
	Max bool
}

// Families returns every family registered on r, sorted by name: the
// relay's own, not the Go runtime's and the process's.
func (r *Registry) Families() []Family {
	r.mu.Lock()
	out := make([]Family, 0, len(r.families)+len(r.hists))
	for _, f := range r.families {
		kind := "gauge"
		if f.kind == prometheus.CounterValue {
			kind = "counter"
		}
		out = append(out, Family{Name: f.name, Type: kind, Labels: slices.Clone(f.labels), Help: f.help, Max: f.max.Load()})
	}
	for _, h := range r.hists {
		out = append(out, Family{Name: h.name, Type: "histogram", Labels: slices.Clone(h.labels), Help: h.help})
	}
	r.mu.Unlock()
	slices.SortFunc(out, func(a, b Family) int { return strings.Compare(a.Name, b.Name) })
	return out
}
