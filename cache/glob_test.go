package cache

import "testing"

func TestGlobs(t *testing.T) {
	for _, tc := range []struct {
		name, glob string
		isGlob     bool
	}{
		{"xdstp://a/envoy.config.endpoint.v3.LbEndpoint/foo/ep1", "xdstp://a/envoy.config.endpoint.v3.LbEndpoint/foo/*", false},
		{"xdstp://a/envoy.config.endpoint.v3.LbEndpoint/foo/*", "", true},
		{"xdstp://a/envoy.config.endpoint.v3.LbEndpoint/foo/ep1?k=v", "xdstp://a/envoy.config.endpoint.v3.LbEndpoint/foo/*?k=v", false},
		{"xdstp://a/envoy.config.endpoint.v3.LbEndpoint/foo/*?k=v", "", true},
		{"plain-name", "", false},
		{"*", "", false},
	} {
		if got := GlobOf(tc.name); got != tc.glob {
			t.Errorf("GlobOf(%q) = %q, want %q", tc.name, got, tc.glob)
		}
		if got := IsGlob(tc.name); got != tc.isGlob {
			t.Errorf("IsGlob(%q) = %v", tc.name, got)
		}
	}
}
