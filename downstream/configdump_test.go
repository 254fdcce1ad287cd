package downstream

import (
	"testing"
	"time"

	adminpb "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	clusterpb "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	tlspb "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	runtimepb "github.com/envoyproxy/go-control-plane/envoy/service/runtime/v3"
	statuspb "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

func encodeFor(t *testing.T, name, version string, m proto.Message) *cache.Resource {
	t.Helper()
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	r, err := xds.Encode(name, version, a, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// ConfigDump's rules, one case each: a body the cache holds at the
// version sent goes in its type's form; a version the cache let go, a
// name not sent, and a type Envoy's dump has no form for go in the CSDS
// form (the last with its body); a Secret never shows its body.
func TestConfigDumpForms(t *testing.T) {
	c := cache.New(cache.Options{Retention: time.Minute})
	w := cache.NewWatch()
	for typeURL, names := range map[string][]string{resourcev3.ClusterType: {"a", "b", "c"}, resourcev3.SecretType: {"s"}, resourcev3.RuntimeType: {"rt"}} {
		if err := c.Watch(w, typeURL, names...); err != nil {
			t.Fatal(err)
		}
	}
	c.Apply(resourcev3.ClusterType, cache.Change{Upserts: []*cache.Resource{
		encodeFor(t, "a", "2", &clusterpb.Cluster{Name: "a"}), encodeFor(t, "b", "2", &clusterpb.Cluster{Name: "b"})}})
	c.Apply(resourcev3.SecretType, cache.Change{Upserts: []*cache.Resource{encodeFor(t, "s", "1", &tlspb.Secret{Name: "s"})}})
	c.Apply(resourcev3.RuntimeType, cache.Change{Upserts: []*cache.Resource{encodeFor(t, "rt", "1", &runtimepb.Runtime{Name: "rt"})}})
	now := time.Now()
	cs := ClientStatus{Cache: c, Types: []TypeStatus{
		{TypeURL: resourcev3.ClusterType, AckVersion: "7", Resources: []ResourceStatus{
			{Name: "a", Version: "2", State: Acked, Sent: now}, // held at that version
			{Name: "b", Version: "1", State: Acked, Sent: now}, // the cache has moved on
			{Name: "c", State: Requested},                      // not sent
		}},
		{TypeURL: resourcev3.SecretType, Resources: []ResourceStatus{{Name: "s", Version: "1", State: Acked, Sent: now}}},
		{TypeURL: resourcev3.RuntimeType, Resources: []ResourceStatus{{Name: "rt", Version: "1", State: Acked, Sent: now}}},
	}}
	dump, err := ConfigDump(cs, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(dump.GetConfigs()) != 3 {
		t.Fatalf("%d configs, want clusters, secrets and the rest: %v", len(dump.GetConfigs()), dump)
	}
	var cds adminpb.ClustersConfigDump
	var sds adminpb.SecretsConfigDump
	var rest statuspb.ClientConfig
	for i, m := range []proto.Message{&cds, &sds, &rest} {
		if err := dump.GetConfigs()[i].UnmarshalTo(m); err != nil {
			t.Fatalf("config %d: %v", i, err)
		}
	}
	if dc := cds.GetDynamicActiveClusters(); cds.GetVersionInfo() != "7" || len(dc) != 1 || dc[0].GetVersionInfo() != "2" ||
		dc[0].GetClientStatus() != adminpb.ClientResourceStatus_ACKED || dc[0].GetCluster() == nil {
		t.Errorf("clusters: %v", &cds)
	}
	if ds := sds.GetDynamicActiveSecrets(); len(ds) != 1 || ds[0].GetName() != "s" || ds[0].GetVersionInfo() != "1" || ds[0].GetSecret() != nil {
		t.Errorf("secrets: %v", &sds)
	}
	got := map[string]*statuspb.ClientConfig_GenericXdsConfig{}
	for _, g := range rest.GetGenericXdsConfigs() {
		got[g.GetName()] = g
	}
	if g := got["b"]; len(got) != 3 || g.GetVersionInfo() != "1" || g.GetXdsConfig() != nil || g.GetClientStatus() != adminpb.ClientResourceStatus_ACKED {
		t.Errorf("b, whose version the cache let go: %v", g)
	}
	if g := got["c"]; g.GetClientStatus() != adminpb.ClientResourceStatus_REQUESTED || g.GetXdsConfig() != nil {
		t.Errorf("c, not sent: %v", g)
	}
	if g := got["rt"]; g.GetTypeUrl() != resourcev3.RuntimeType || g.GetXdsConfig() == nil {
		t.Errorf("rt, a type with no form of its own: %v", g)
	}

	only, err := ConfigDump(cs, resourcev3.SecretType)
	if err != nil || len(only.GetConfigs()) != 1 || !only.GetConfigs()[0].MessageIs(&adminpb.SecretsConfigDump{}) {
		t.Errorf("secrets only: %v %v", only, err)
	}
}
