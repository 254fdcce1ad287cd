package downstream

import (
	"slices"
	"testing"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/lockorder/lockcheck"
)

func TestMain(m *testing.M) {
	lockcheck.Main(m)
}

// The four-step SotW example of "How the client specifies what resources to
// return".
func TestSotWSubscriptionRules(t *testing.T) {
	steps := []struct {
		names        []string
		wantWildcard bool
		wantNames    []string
	}{
		{names: nil, wantWildcard: true},                                          // unset: subscription to *
		{names: []string{"*", "A"}, wantWildcard: true, wantNames: []string{"A"}}, // * and A
		{names: []string{"A"}, wantNames: []string{"A"}},                          // unsubscribes *, keeps A
		{names: nil}, // unsubscribes A: not the legacy wildcard any more
	}
	var ts sotwType
	for i, s := range steps {
		wildcard, named := ts.subscription(s.names)
		got := named.appendKeys(nil)
		slices.Sort(got)
		if wildcard != s.wantWildcard || !slices.Equal(got, s.wantNames) {
			t.Errorf("step %d (%v): wildcard %v names %v, want %v %v", i+1, s.names, wildcard, got, s.wantWildcard, s.wantNames)
		}
	}
}

// A flush's types go in the spec's order whatever the order their changes
// arrived in ("Eventual consistency considerations"; order.go).
func TestOrderedIsTheSpecsOrder(t *testing.T) {
	const (
		cds = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
		eds = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
		lds = "type.googleapis.com/envoy.config.listener.v3.Listener"
		rds = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
	)
	types := func(s cache.DirtySet) []string {
		var out []string
		for _, d := range s {
			out = append(out, d.TypeURL)
		}
		return out
	}
	got := types(ordered(cache.DirtySet{
		{TypeURL: rds, Seq: 2}, {TypeURL: lds, Seq: 2}, {TypeURL: eds, Seq: 2}, {TypeURL: cds, Seq: 2},
	}))
	if want := []string{cds, eds, lds, rds}; !slices.Equal(got, want) {
		t.Errorf("changes that arrived together: %v, want %v", got, want)
	}
	got = types(ordered(cache.DirtySet{{TypeURL: rds, Seq: 1}, {TypeURL: lds, Seq: 4}, {TypeURL: cds, Seq: 3}}))
	if want := []string{cds, lds, rds}; !slices.Equal(got, want) {
		t.Errorf("changes that arrived apart: %v, want %v", got, want)
	}
}
