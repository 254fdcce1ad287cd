package xds

import (
	"testing"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

// user_agent is a kind by MAJOR.MINOR, user_agent_patch by the whole
// version: gRPC's version string and Envoy's build version alike.
func TestUserAgentFields(t *testing.T) {
	envoy := func(major, minor, patch uint32) *corepb.Node {
		return &corepb.Node{UserAgentName: "envoy", UserAgentVersionType: &corepb.Node_UserAgentBuildVersion{
			UserAgentBuildVersion: &corepb.BuildVersion{Version: &typev3.SemanticVersion{MajorNumber: major, MinorNumber: minor, Patch: patch}}}}
	}
	grpc := func(v string) *corepb.Node {
		return &corepb.Node{UserAgentName: "gRPC Go", UserAgentVersionType: &corepb.Node_UserAgentVersion{UserAgentVersion: v}}
	}
	for _, tc := range []struct {
		node         *corepb.Node
		minor, patch string
	}{
		{envoy(1, 36, 2), "envoy/1.36", "envoy/1.36.2"},
		{envoy(1, 36, 0), "envoy/1.36", "envoy/1.36.0"},
		{grpc("1.85.1"), "gRPC Go/1.85", "gRPC Go/1.85.1"},
		{grpc("1.86.0-dev"), "gRPC Go/1.86", "gRPC Go/1.86.0-dev"},
		{grpc("1.85"), "gRPC Go/1.85", "gRPC Go/1.85"},
		{grpc("v2"), "gRPC Go/v2", "gRPC Go/v2"},
		{grpc("a.b.c"), "gRPC Go/a.b.c", "gRPC Go/a.b.c"},
		{grpc("v1.85.1"), "gRPC Go/v1.85.1", "gRPC Go/v1.85.1"},
		{grpc("1.x.3"), "gRPC Go/1.x.3", "gRPC Go/1.x.3"},
		{grpc("1..3"), "gRPC Go/1..3", "gRPC Go/1..3"},
		{&corepb.Node{UserAgentName: "x"}, "x", "x"},
		{&corepb.Node{}, "", ""},
	} {
		if got := NodeField(tc.node, FieldUserAgent); got != tc.minor {
			t.Errorf("user_agent of %v: %q, want %q", tc.node, got, tc.minor)
		}
		if got := NodeField(tc.node, FieldUserAgentPatch); got != tc.patch {
			t.Errorf("user_agent_patch of %v: %q, want %q", tc.node, got, tc.patch)
		}
	}
	if err := CheckNodeField(FieldUserAgentPatch); err != nil {
		t.Error(err)
	}
}
