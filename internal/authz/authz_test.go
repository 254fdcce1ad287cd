package authz

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"net/url"
	"slices"
	"strings"
	"testing"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

func TestCheck(t *testing.T) {
	tenant := Rule{Identity: "spiffe://example.org/tenant/{tenant}", Node: map[string]string{"cluster": "{tenant}"}}
	istio := Rule{Identity: "spiffe://cluster.local/ns/{ns}/sa/*", Node: map[string]string{"id": "sidecar~*~*.{ns}~{ns}.svc.cluster.local"}}
	tests := []struct {
		name       string
		rules      []Rule
		identities []string
		node       *corepb.Node
		wantReason string // "" when admitted
		wantMsg    string // a substring of the denial
	}{
		{name: "capture equals the field", rules: []Rule{tenant},
			identities: []string{"spiffe://example.org/tenant/a"}, node: &corepb.Node{Cluster: "a"}},
		{name: "capture differs from the field", rules: []Rule{tenant},
			identities: []string{"spiffe://example.org/tenant/a"}, node: &corepb.Node{Cluster: "b"},
			wantReason: ReasonNode, wantMsg: `identity "spiffe://example.org/tenant/a" may not claim node cluster "b" (rules[0] wants "a")`},
		{name: "capture inside a node pattern", rules: []Rule{{Identity: "spiffe://example.org/tenant/{t}", Node: map[string]string{"cluster": "tenant-{t}"}}},
			identities: []string{"spiffe://example.org/tenant/a"}, node: &corepb.Node{Cluster: "tenant-b"},
			wantReason: ReasonNode, wantMsg: `may not claim node cluster "tenant-b" (rules[0] wants "tenant-a")`},
		{name: "a capture is never empty", rules: []Rule{tenant},
			identities: []string{"spiffe://example.org/tenant/"}, node: &corepb.Node{},
			wantReason: ReasonIdentity, wantMsg: `no rule matches identity "spiffe://example.org/tenant/"`},
		{name: "a capture does not cross '/'", rules: []Rule{tenant},
			identities: []string{"spiffe://example.org/tenant/a/b"}, node: &corepb.Node{Cluster: "a/b"},
			wantReason: ReasonIdentity},
		{name: "star in the identity does not cross '/'", rules: []Rule{{Identity: "spiffe://example.org/*"}},
			identities: []string{"spiffe://example.org/a/b"}, node: &corepb.Node{},
			wantReason: ReasonIdentity},
		{name: "star in the identity", rules: []Rule{{Identity: "spiffe://example.org/*"}},
			identities: []string{"spiffe://example.org/a"}, node: &corepb.Node{Cluster: "anything"}},
		{name: "star in a node pattern", rules: []Rule{istio},
			identities: []string{"spiffe://cluster.local/ns/shop/sa/cart"},
			node:       &corepb.Node{Id: "sidecar~10.1.2.3~cart-7d9f.shop~shop.svc.cluster.local"}},
		{name: "star in a node pattern, other namespace", rules: []Rule{istio},
			identities: []string{"spiffe://cluster.local/ns/shop/sa/cart"},
			node:       &corepb.Node{Id: "sidecar~10.1.2.3~pay-1.bank~bank.svc.cluster.local"},
			wantReason: ReasonNode, wantMsg: `(rules[0] wants "sidecar~*~*.shop~shop.svc.cluster.local")`},
		{name: "star in a node pattern does not cross '/'", rules: []Rule{{Identity: "x", Node: map[string]string{"cluster": "tenant-*"}}},
			identities: []string{"x"}, node: &corepb.Node{Cluster: "tenant-a/b"},
			wantReason: ReasonNode},
		{name: "star matches the empty run", rules: []Rule{{Identity: "x*", Node: map[string]string{"cluster": "a*"}}},
			identities: []string{"x"}, node: &corepb.Node{Cluster: "a"}},
		{name: "a captured value is literal, not a pattern", rules: []Rule{tenant},
			identities: []string{"spiffe://example.org/tenant/a.*"}, node: &corepb.Node{Cluster: "ab"},
			wantReason: ReasonNode},
		{name: "any of several SANs", rules: []Rule{tenant},
			identities: []string{"spiffe://other.org/x", "relay.example.org", "spiffe://example.org/tenant/a"}, node: &corepb.Node{Cluster: "a"}},
		{name: "none of several SANs", rules: []Rule{tenant},
			identities: []string{"spiffe://other.org/x", "relay.example.org", "client"}, node: &corepb.Node{Cluster: "a"},
			wantReason: ReasonIdentity, wantMsg: `no rule matches identities "spiffe://other.org/x", "relay.example.org", "client"`},
		{name: "subject CN", rules: []Rule{{Identity: "client-{t}", Node: map[string]string{"cluster": "{t}"}}},
			identities: []string{"localhost", "client-a"}, node: &corepb.Node{Cluster: "a"}},
		{name: "every field must match", rules: []Rule{{Identity: "spiffe://example.org/tenant/{t}", Node: map[string]string{"cluster": "{t}", "locality.zone": "z-*", "metadata.TENANT": "{t}"}}},
			identities: []string{"spiffe://example.org/tenant/a"},
			node:       &corepb.Node{Cluster: "a", Locality: &corepb.Locality{Zone: "z-1"}, Metadata: meta("TENANT", "b")},
			wantReason: ReasonNode, wantMsg: `may not claim node metadata.TENANT "b" (rules[0] wants "a")`},
		{name: "every field matches", rules: []Rule{{Identity: "spiffe://example.org/tenant/{t}", Node: map[string]string{"cluster": "{t}", "locality.zone": "z-*", "metadata.TENANT": "{t}"}}},
			identities: []string{"spiffe://example.org/tenant/a"},
			node:       &corepb.Node{Cluster: "a", Locality: &corepb.Locality{Zone: "z-1"}, Metadata: meta("TENANT", "a")}},
		{name: "a later rule admits", rules: []Rule{tenant, {Identity: "spiffe://example.org/tenant/a", Node: map[string]string{"cluster": "shared"}}},
			identities: []string{"spiffe://example.org/tenant/a"}, node: &corepb.Node{Cluster: "shared"}},
		{name: "the first rule that matches the identity is reported", rules: []Rule{{Identity: "other"}, tenant, {Identity: "spiffe://example.org/tenant/a", Node: map[string]string{"cluster": "shared"}}},
			identities: []string{"spiffe://example.org/tenant/a"}, node: &corepb.Node{Cluster: "b"},
			wantReason: ReasonNode, wantMsg: `(rules[1] wants "a")`},
		{name: "a rule without node patterns admits any node", rules: []Rule{{Identity: "spiffe://example.org/relay"}},
			identities: []string{"spiffe://example.org/relay"}, node: &corepb.Node{Cluster: "anything"}},
		{name: "no identity", rules: []Rule{{Identity: "*"}},
			node: &corepb.Node{}, wantReason: ReasonIdentity, wantMsg: "no identity"},
		{name: "a huge node value is cut in the message", rules: []Rule{tenant},
			identities: []string{"spiffe://example.org/tenant/a"}, node: &corepb.Node{Cluster: strings.Repeat("x", 1<<20)},
			wantReason: ReasonNode, wantMsg: "…(1048576 bytes)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, err := New(tc.rules)
			if err != nil {
				t.Fatal(err)
			}
			err = a.Check(tc.identities, tc.node)
			if tc.wantReason == "" {
				if err != nil {
					t.Fatalf("denied: %v", err)
				}
				return
			}
			var d *Denied
			if !errors.As(err, &d) {
				t.Fatalf("admitted (err %v), want a denial for %s", err, tc.wantReason)
			}
			if d.Reason != tc.wantReason || !strings.Contains(d.Error(), tc.wantMsg) {
				t.Fatalf("denied for %s: %q; want %s, %q", d.Reason, d.Error(), tc.wantReason, tc.wantMsg)
			}
			if len(d.Error()) > 2048 {
				t.Errorf("message of %d bytes", len(d.Error()))
			}
		})
	}
}

func meta(k, v string) *structpb.Struct {
	s, _ := structpb.NewStruct(map[string]any{k: v})
	return s
}

func TestNewRejects(t *testing.T) {
	tests := []struct {
		name    string
		rule    Rule
		wantErr string
	}{
		{"empty identity", Rule{Node: map[string]string{"cluster": "a"}}, "rules[0].identity: empty"},
		{"open brace", Rule{Identity: "spiffe://x/{tenant"}, "rules[0].identity: \"spiffe://x/{tenant\": unbalanced braces"},
		{"close brace", Rule{Identity: "spiffe://x/tenant}"}, "rules[0].identity: \"spiffe://x/tenant}\": unbalanced braces"},
		{"nested braces", Rule{Identity: "{a{b}}"}, "unbalanced braces"},
		{"empty capture", Rule{Identity: "x/{}"}, "rules[0].identity"},
		{"bad capture name", Rule{Identity: "x/{a-b}"}, "rules[0].identity"},
		{"captured twice", Rule{Identity: "x/{a}/{a}"}, "{a} is captured twice"},
		{"unknown node field", Rule{Identity: "x", Node: map[string]string{"foo": "a"}}, "rules[0].node.foo: unknown node field"},
		{"empty metadata key", Rule{Identity: "x", Node: map[string]string{"metadata.": "a"}}, "rules[0].node.metadata.: unknown node field"},
		{"undefined capture", Rule{Identity: "x/{a}", Node: map[string]string{"cluster": "{b}"}}, "rules[0].node.cluster: \"{b}\" uses {b}, which the identity does not capture"},
		{"unbalanced node pattern", Rule{Identity: "x/{a}", Node: map[string]string{"id": "{a"}}, "rules[0].node.id: \"{a\": unbalanced braces"},
		{"empty node pattern", Rule{Identity: "x", Node: map[string]string{"cluster": ""}}, "rules[0].node.cluster: empty pattern"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New([]Rule{tc.rule})
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %v, want %q", err, tc.wantErr)
			}
		})
	}
	if _, err := New([]Rule{{Identity: "a"}, {Identity: ""}}); err == nil || !strings.HasPrefix(err.Error(), "rules[1].identity") {
		t.Fatalf("the second rule: %v", err)
	}
}

func TestIdentities(t *testing.T) {
	u, _ := url.Parse("spiffe://example.org/tenant/a")
	cert := &x509.Certificate{URIs: []*url.URL{u}, DNSNames: []string{"a.example.org"}, Subject: pkix.Name{CommonName: "tenant-a"}}
	got := Identities(&tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{cert}}, PeerCertificates: []*x509.Certificate{cert}})
	if want := []string{"spiffe://example.org/tenant/a", "a.example.org", "tenant-a"}; !slices.Equal(got, want) {
		t.Errorf("identities %q, want %q", got, want)
	}
	if got := Identities(&tls.ConnectionState{PeerCertificates: []*x509.Certificate{cert}}); got != nil {
		t.Errorf("an unverified certificate gave identities %q", got)
	}
	if got := Identities(nil); got != nil {
		t.Errorf("no TLS gave identities %q", got)
	}
}

// A rule's authorities bound the xdstp names its clients may ask for;
// other names are not bound; a client admitted by several rules gets what
// each allows, and a rule without authorities allows them all.
func TestGrantAuthorities(t *testing.T) {
	tenant := Rule{Identity: "spiffe://example.org/tenant/{t}", Node: map[string]string{"cluster": "{t}"},
		Authorities: []string{"{t}.example.com", "shared-*.example.com"}}
	shared := Rule{Identity: "spiffe://example.org/tenant/a", Node: map[string]string{"cluster": "a"},
		Authorities: []string{"extra.example.com"}}
	open := Rule{Identity: "spiffe://example.org/admin", Node: map[string]string{"cluster": "*"}}
	a, err := New([]Rule{tenant, shared, open})
	if err != nil {
		t.Fatal(err)
	}
	grant := func(id, cluster string) *Grant {
		t.Helper()
		g, err := a.Grant([]string{id}, &corepb.Node{Cluster: cluster})
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	a1, b := grant("spiffe://example.org/tenant/a", "a"), grant("spiffe://example.org/tenant/b", "b")
	admin := grant("spiffe://example.org/admin", "x")
	for _, tc := range []struct {
		g    *Grant
		name string
		want bool
	}{
		{a1, "xdstp://a.example.com/envoy.config.cluster.v3.Cluster/x", true},
		{a1, "xdstp://b.example.com/envoy.config.cluster.v3.Cluster/x", false},
		{a1, "xdstp://shared-1.example.com/envoy.config.cluster.v3.Cluster/x", true},
		{a1, "xdstp://extra.example.com/envoy.config.cluster.v3.Cluster/x", true}, // the second rule's
		{b, "xdstp://extra.example.com/envoy.config.cluster.v3.Cluster/x", false},
		{b, "plain-name", true},
		{admin, "xdstp://b.example.com/envoy.config.cluster.v3.Cluster/x", true},
		{nil, "xdstp://b.example.com/envoy.config.cluster.v3.Cluster/x", true},
	} {
		if got := tc.g.Allows(tc.name); got != tc.want {
			t.Errorf("%v.Allows(%q) = %v, want %v", tc.g, tc.name, got, tc.want)
		}
	}
	for pattern, want := range map[string]string{
		"{u}.example.com": "rules[0].authorities[0]: \"{u}.example.com\" uses {u}, which the identity does not capture",
		"a/b":             "rules[0].authorities[0]: \"a/b\" is not an xdstp authority pattern",
		"":                "rules[0].authorities[0]: \"\" is not an xdstp authority pattern",
	} {
		_, err := New([]Rule{{Identity: "spiffe://x/{t}", Authorities: []string{pattern}}})
		if err == nil || err.Error() != want {
			t.Errorf("authority %q: %v, want %q", pattern, err, want)
		}
	}
}
