package xds

import (
	"strings"
	"testing"
	"unsafe"
)

// Canonical gives every copy of a known type URL the one copy in Types, so
// that map keys compare by pointer; an unknown type URL comes back as is.
func TestCanonicalSharesOneCopy(t *testing.T) {
	for _, typeURL := range Types {
		decoded := strings.Clone(typeURL) // as a request's decoded string is
		got := Canonical(decoded)
		if got != typeURL || unsafe.StringData(got) != unsafe.StringData(typeURL) {
			t.Errorf("Canonical(%q) is not the copy in Types", typeURL)
		}
	}
	unknown := "type.googleapis.com/example.Unknown"
	if got := Canonical(unknown); got != unknown {
		t.Errorf("Canonical(%q) = %q", unknown, got)
	}
}

// ParseType takes every name of every type, in any case, and the type URL.
func TestParseType(t *testing.T) {
	if len(typeNames) != len(Types) {
		t.Fatalf("%d types named, %d carried", len(typeNames), len(Types))
	}
	for i, n := range typeNames {
		if n.typeURL != Types[i] {
			t.Errorf("typeNames[%d] is %s, Types[%d] %s", i, n.typeURL, i, Types[i])
		}
		for _, name := range []string{n.typeURL, ShortName(n.typeURL), strings.ToLower(ShortName(n.typeURL)), n.abbrev, strings.ToLower(n.abbrev), n.rest, strings.ToUpper(n.rest)} {
			if got, err := ParseType(name); err != nil || got != n.typeURL {
				t.Errorf("ParseType(%q) = %q, %v; want %s", name, got, err, n.typeURL)
			}
		}
	}
	for _, tc := range []struct {
		name string
		want string
	}{
		{name: "", want: `"" is not a resource type: Cluster|CDS|clusters, `},
		{name: "xds", want: `"xds" is not a resource type`},
		{name: "type.googleapis.com/example.Unknown", want: "or a type URL (type.googleapis.com/envoy.config.cluster.v3.Cluster)"},
	} {
		if _, err := ParseType(tc.name); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseType(%q): %v, want %q", tc.name, err, tc.want)
		}
	}
}
