package downstream

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/authz"
	"github.com/xdsrelay/xdsrelay/internal/metrics"
)

// Every variant a client can be denied on, load report streams included,
// has its xdsrelay_downstream_denied_total series at 0 from the start, so
// that an alert on increase() sees the first denial.
func TestDeniedSeriesExistAtZero(t *testing.T) {
	reg := &metrics.Registry{}
	if _, err := New(Options{Groups: noGroups{}, Metrics: reg}); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if _, err := reg.WriteTo(&out); err != nil {
		t.Fatal(err)
	}
	for _, variant := range []string{"sotw-ads", "delta-ads", "sotw", "delta", "fetch", "rest", variantLRS} {
		for _, reason := range []string{authz.ReasonIdentity, authz.ReasonNode} {
			want := `xdsrelay_downstream_denied_total{reason="` + reason + `",variant="` + variant + `"} 0` + "\n"
			if !strings.Contains(out.String(), want) {
				t.Errorf("no %q on /metrics at start", strings.TrimSpace(want))
			}
		}
	}
}

// Names a client's certificate does not allow count toward
// limits.max_names_per_stream as the names it is served do: the client
// subscribes to them (and is sent their errors), and the stream keeps
// them; a name dropped frees its place.
func TestRefusedNamesCountTowardTheStreamLimit(t *testing.T) {
	rules, err := authz.New([]authz.Rule{{Identity: "spiffe://example.org/a", Authorities: []string{"a.example.com"}}})
	if err != nil {
		t.Fatal(err)
	}
	node := &corepb.Node{Id: "n1"}
	grant, err := rules.Grant([]string{"spiffe://example.org/a"}, node)
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{Groups: noGroups{}, Metrics: &metrics.Registry{}, Limits: Limits{MaxNamesPerStream: 2}})
	if err != nil {
		t.Fatal(err)
	}
	refused := func(i int) string {
		return "xdstp://b.example.com/envoy.config.endpoint.v3.ClusterLoadAssignment/" + strconv.Itoa(i)
	}
	allowed := "xdstp://a.example.com/envoy.config.endpoint.v3.ClusterLoadAssignment/0"
	ss := &sotwStream{streamBase: s.newStreamBase(func(any) error { return nil }, eds, "sotw", cache.New(cache.Options{}), node)}
	ss.grant = grant
	for _, step := range []struct {
		names   []string
		refused bool
	}{
		{names: []string{refused(1), refused(2)}},
		{names: []string{refused(3), allowed}}, // two dropped, two added
		{names: []string{refused(3), allowed, refused(4)}, refused: true},
	} {
		err := ss.handle(&discoverypb.DiscoveryRequest{Node: node, TypeUrl: eds, ResourceNames: step.names})
		var le *LimitError
		if got := errors.As(err, &le) && le.Key == "limits.max_names_per_stream"; got != step.refused || !got && err != nil {
			t.Fatalf("%q: %v, want refused at limits.max_names_per_stream: %v", step.names, err, step.refused)
		}
	}
}
