package relay

import (
	"testing"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

func TestGroupKey(t *testing.T) {
	md, _ := structpb.NewStruct(map[string]any{"team": "payments", "shard": 3})
	n := &corepb.Node{
		Id: "sidecar-1", Cluster: "checkout", Metadata: md,
		Locality: &corepb.Locality{Region: "eu-west1", Zone: "b"},
	}
	tests := []struct {
		fields []string
		want   string
	}{
		{nil, ""},
		{[]string{"cluster"}, "cluster=checkout"},
		{[]string{"id"}, "id=sidecar-1"},
		{[]string{"locality.region", "locality.zone"}, "locality.region=eu-west1,locality.zone=b"},
		{[]string{"metadata.team"}, "metadata.team=payments"},
		{[]string{"metadata.shard"}, "metadata.shard=3"},
		{[]string{"metadata.absent", "cluster"}, "metadata.absent=,cluster=checkout"},
		{[]string{"user_agent", "client_features"}, "user_agent=,client_features="},
	}
	for _, tc := range tests {
		if got := GroupKey(n, tc.fields); got != tc.want {
			t.Errorf("GroupKey(%v) = %q, want %q", tc.fields, got, tc.want)
		}
	}
}

// The kinds: the user agent with its version's MAJOR.MINOR (the whole
// version with user_agent_patch), string or Envoy's build version (its
// metadata left out), and the set of features.
func TestGroupKeyKinds(t *testing.T) {
	envoy := func(major, minor, patch uint32, build string, features ...string) *corepb.Node {
		meta, _ := structpb.NewStruct(map[string]any{"revision": build})
		return &corepb.Node{Cluster: "c", UserAgentName: "envoy", ClientFeatures: features,
			UserAgentVersionType: &corepb.Node_UserAgentBuildVersion{UserAgentBuildVersion: &corepb.BuildVersion{
				Version: &typev3.SemanticVersion{MajorNumber: major, MinorNumber: minor, Patch: patch}, Metadata: meta}}}
	}
	grpc := &corepb.Node{Cluster: "c", UserAgentName: "gRPC Go", ClientFeatures: []string{"b", "a", "b"},
		UserAgentVersionType: &corepb.Node_UserAgentVersion{UserAgentVersion: "1.85.0"}}
	by := Default().Upstream.GroupBy
	for _, tc := range []struct {
		node *corepb.Node
		want string
	}{
		{envoy(1, 36, 2, "abc"), "cluster=c,user_agent=envoy/1.36,client_features="},
		{envoy(1, 37, 0, "abc", "y", "x"), "cluster=c,user_agent=envoy/1.37,client_features=x,y"},
		{grpc, "cluster=c,user_agent=gRPC Go/1.85,client_features=a,b"},
		{&corepb.Node{Cluster: "c", UserAgentName: "bare"}, "cluster=c,user_agent=bare,client_features="},
	} {
		if got := GroupKey(tc.node, by); got != tc.want {
			t.Errorf("GroupKey = %q, want %q", got, tc.want)
		}
	}
	if GroupKey(envoy(1, 36, 2, "abc"), by) != GroupKey(envoy(1, 36, 2, "def"), by) {
		t.Error("two builds of one Envoy version are two kinds")
	}
	if GroupKey(envoy(1, 36, 2, "abc"), by) != GroupKey(envoy(1, 36, 3, "abc"), by) {
		t.Error("two patch releases of one Envoy minor version are two kinds")
	}
	patch := []string{"cluster", "user_agent_patch"}
	if got, want := GroupKey(envoy(1, 36, 2, "abc"), patch), "cluster=c,user_agent_patch=envoy/1.36.2"; got != want {
		t.Errorf("GroupKey by %v = %q, want %q", patch, got, want)
	}
}

func TestValidate(t *testing.T) {
	for name, mutate := range map[string]func(*Config){
		"upstream.address":   func(c *Config) { c.Upstream.Address = "no-port" },
		"upstream.group_by":  func(c *Config) { c.Upstream.GroupBy = []string{"metadata."} },
		"downstream.address": func(c *Config) { c.Downstream.Address = ":" },
		"admin.address":      func(c *Config) { c.Admin.Address = "127.0.0.1" },
		"cache.retention":    func(c *Config) { c.Cache.Retention = -1 },
		"shutdown_timeout":   func(c *Config) { c.ShutdownTimeout = 0 },
	} {
		c := Default()
		mutate(&c)
		if err := c.Validate(); err == nil || err.Error()[:len(name)] != name {
			t.Errorf("%s: error %v, want one naming the key", name, err)
		}
	}
	c := Default()
	if err := c.Validate(); err != nil {
		t.Errorf("default config: %v", err)
	}
}
