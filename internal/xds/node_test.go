package xds

import (
	"testing"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

// user_agent is a kind by MAJOR.MINOR when its version is dotted numeric,
// else by its whole version; user_agent_patch by the whole version: gRPC's
// version string and Envoy's build version alike.
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
		{grpc("1.86.0-dev"), "gRPC Go/1.86.0-dev", "gRPC Go/1.86.0-dev"},
		{grpc("1.85.1.7"), "gRPC Go/1.85", "gRPC Go/1.85.1.7"},
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

// What is presented upstream for a kind: a dotted numeric version as
// MAJOR.MINOR.0, any other string cut to MAJOR.MINOR when it starts with
// two numbers, else whole; and every version of one kind presents one.
func TestPresentedVersion(t *testing.T) {
	for _, tc := range []struct{ v, kind, presented string }{
		{"1.78.0", "1.78", "1.78.0"},
		{"1.78.3", "1.78", "1.78.0"},
		{"1.78", "1.78", "1.78.0"},
		{"1.78.3.1", "1.78", "1.78.0"},
		{"01.2.3", "01.2", "01.2.0"},
		{"1.86.0-dev", "1.86.0-dev", "1.86"},
		{"1.86.x", "1.86.x", "1.86"},
		{"1.86-rc1", "1.86-rc1", "1.86-rc1"},
		{"1.86.", "1.86.", "1.86"},
		{"1", "1", "1"},
		{"v1.78.0", "v1.78.0", "v1.78.0"},
		{"1..3", "1..3", "1..3"},
		{"", "", ""},
	} {
		if got := KindVersion(tc.v); got != tc.kind {
			t.Errorf("KindVersion(%q) = %q, want %q", tc.v, got, tc.kind)
		}
		if got := PresentedVersion(tc.v); got != tc.presented {
			t.Errorf("PresentedVersion(%q) = %q, want %q", tc.v, got, tc.presented)
		}
	}
	// One kind, one presented version: a kind's versions never present two.
	presented := map[string]string{}
	for _, v := range []string{"1.78", "1.78.0", "1.78.9", "1.78.0.1", "1.78.0-dev", "1.78.1-dev", "1.78-dev", "1.78.x"} {
		k, p := KindVersion(v), PresentedVersion(v)
		if was, ok := presented[k]; ok && was != p {
			t.Errorf("kind %q presents %q and %q", k, was, p)
		}
		presented[k] = p
	}
}
