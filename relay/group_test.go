package relay

import (
	"testing"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
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
	}
	for _, tc := range tests {
		if got := GroupKey(n, tc.fields); got != tc.want {
			t.Errorf("GroupKey(%v) = %q, want %q", tc.fields, got, tc.want)
		}
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
