package upstream

import (
	"strings"
	"testing"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
)

func TestRoutesOf(t *testing.T) {
	routes, err := NewRoutes([]Claim{
		{Name: DefaultUpstream, Authorities: []string{"mesh.example.com"}},
		{Name: "secrets", Types: []string{resourcev3.SecretType}},
		{Name: "partner", Authorities: []string{"partner.example.com"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		typeURL, name string
		want          int
	}{
		{resourcev3.ClusterType, "a", 0},
		{resourcev3.ClusterType, "*", 0},
		{resourcev3.SecretType, "cert", 1},
		{resourcev3.SecretType, "*", 1},
		{resourcev3.ClusterType, "xdstp://partner.example.com/envoy.config.cluster.v3.Cluster/a", 2},
		{resourcev3.ClusterType, "xdstp://partner.example.com/envoy.config.cluster.v3.Cluster/ns/*", 2},
		// An xdstp secret goes by its authority, not by its type.
		{resourcev3.SecretType, "xdstp://partner.example.com/envoy.extensions.transport_sockets.tls.v3.Secret/s", 2},
		{resourcev3.ClusterType, "xdstp://mesh.example.com/envoy.config.cluster.v3.Cluster/a", 0},
		{resourcev3.ClusterType, "xdstp://other.example.com/envoy.config.cluster.v3.Cluster/a", Unroutable},
		{resourcev3.ClusterType, "xdstp:///envoy.config.cluster.v3.Cluster/a", Unroutable},
	} {
		if got := routes.Of(tc.typeURL, tc.name); got != tc.want {
			t.Errorf("Of(%s, %q) = %d, want %d", tc.typeURL, tc.name, got, tc.want)
		}
	}
}

// Without authorities, xdstp names are routed as any other name.
func TestRoutesXdstpWithoutAuthorities(t *testing.T) {
	routes, err := NewRoutes([]Claim{{Name: DefaultUpstream}, {Name: "secrets", Types: []string{resourcev3.SecretType}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := routes.Of(resourcev3.SecretType, "xdstp://any/envoy.extensions.transport_sockets.tls.v3.Secret/s"); got != 1 {
		t.Errorf("xdstp secret without authorities: %d, want 1 (by type)", got)
	}
}

func TestNewRoutesErrors(t *testing.T) {
	for _, tc := range []struct {
		name   string
		claims []Claim
		want   string
	}{
		{"type twice", []Claim{{Name: DefaultUpstream}, {Name: "a", Types: []string{resourcev3.SecretType}}, {Name: "b", Types: []string{resourcev3.SecretType}}}, `claimed by "a" too`},
		{"authority twice", []Claim{{Name: DefaultUpstream, Authorities: []string{"x"}}, {Name: "a", Authorities: []string{"x"}}}, `authority "x" is claimed by "default" too`},
		{"name twice", []Claim{{Name: DefaultUpstream}, {Name: "a"}, {Name: "a"}}, "used twice"},
		{"bad name", []Claim{{Name: DefaultUpstream}, {Name: "Secrets"}}, "[a-z0-9-]+"},
		{"default named again", []Claim{{Name: DefaultUpstream}, {Name: DefaultUpstream}}, "[a-z0-9-]+"},
		{"bad authority", []Claim{{Name: DefaultUpstream}, {Name: "a", Authorities: []string{"x/y"}}}, "not an xdstp authority"},
		{"default with types", []Claim{{Name: DefaultUpstream, Types: []string{resourcev3.SecretType}}}, "without types"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewRoutes(tc.claims)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// A view keeps one upstream's share of the interest and its changes.
func TestViewInterest(t *testing.T) {
	v := newView()
	v.note(resourcev3.ClusterType, "a", true)
	v.note(resourcev3.ClusterType, "*", true)
	v.note(resourcev3.SecretType, "s", true)
	v.signal()
	select {
	case <-v.InterestChanged():
	default:
		t.Fatal("no signal after a change")
	}
	changes, all := v.InterestChanges()
	if all || len(changes[resourcev3.ClusterType]) != 2 || !changes[resourcev3.SecretType]["s"] {
		t.Fatalf("changes %v all %v", changes, all)
	}
	in := v.Interest()
	if c := in[resourcev3.ClusterType]; !c.Wildcard || len(c.Names) != 1 || c.Names[0] != "a" {
		t.Fatalf("cluster interest %+v", c)
	}
	v.note(resourcev3.SecretType, "s", false)
	v.note(resourcev3.ClusterType, "a", false)
	v.note(resourcev3.ClusterType, "*", false)
	if !v.empty() {
		t.Fatalf("view not empty: %+v", v.Interest())
	}
	v.signal()
	v.signal() // nothing changed since: no second signal pending beyond the first
	<-v.InterestChanged()
	select {
	case <-v.InterestChanged():
		t.Fatal("signalled twice for one change")
	default:
	}
}
