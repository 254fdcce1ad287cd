package main

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlspb "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// docs/control-planes.md's "Several control planes" YAML, with its four servers moved
// to real control planes, boots a relay whose ADS client gets clusters from
// the default, secrets from the secrets server and an xdstp cluster from the
// partner; none of them is asked for another's names.
func TestDocSeveralControlPlanes(t *testing.T) {
	cpA, cpB, secrets, partner := testcp.Start(t), testcp.Start(t), testcp.Start(t), testcp.Start(t)
	const xdstpCluster = "xdstp://partner.example.com/envoy.config.cluster.v3.Cluster/pay"
	cpA.Set(t, "c1", "1", testcp.Cluster("web"), &tlspb.Secret{Name: "cert"}) // a decoy secret
	secrets.Set(t, "c1", "1", &tlspb.Secret{Name: "cert", Type: &tlspb.Secret_GenericSecret{}})
	partner.Set(t, "c1", "1", testcp.Cluster(xdstpCluster))

	yaml := docBlock(t, "docs/control-planes.md", "yaml", "upstreams:")
	yaml = replaceOnce(t, yaml, "cp-a:18000", cpA.Addr)
	yaml = replaceOnce(t, yaml, "cp-b:18000", cpB.Addr)
	yaml = replaceOnce(t, yaml, "secrets:18000", secrets.Addr)
	yaml = replaceOnce(t, yaml, "partner-cp:18000", partner.Addr)
	file := filepath.Join(t.TempDir(), "several.yaml")
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	r := bootConfig(t, file)

	st := deltaADS(t, r.Addr(), 20*time.Second)
	n := &corepb.Node{Id: "envoy-1", Cluster: "c1"}
	for _, req := range []*discoverypb.DeltaDiscoveryRequest{
		{Node: n, TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"web", xdstpCluster}},
		{Node: n, TypeUrl: resourcev3.SecretType, ResourceNamesSubscribe: []string{"cert"}},
	} {
		if err := st.Send(req); err != nil {
			t.Fatal(err)
		}
	}
	got := map[string]*discoverypb.Resource{}
	for len(got) < 3 {
		resp, err := st.Recv()
		if err != nil {
			t.Fatalf("after %v: %v", slices.Collect(maps.Keys(got)), err)
		}
		for _, res := range resp.GetResources() {
			got[res.GetName()] = res
		}
		if err := st.Send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()}); err != nil {
			t.Fatal(err)
		}
	}
	secret := &tlspb.Secret{}
	if err := got["cert"].GetResource().UnmarshalTo(secret); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(secret, &tlspb.Secret{Name: "cert", Type: &tlspb.Secret_GenericSecret{}}) {
		t.Fatalf("secret %v is not the secrets server's", secret)
	}
	for _, c := range []struct {
		cp    *testcp.ControlPlane
		names []string
	}{{cpA, []string{"web"}}, {secrets, []string{"cert"}}, {partner, []string{xdstpCluster}}, {cpB, nil}} {
		var asked []string
		for _, req := range c.cp.Requests() {
			if req.GetTypeUrl() == resourcev3.EndpointType {
				continue // the endpoints of an EDS Cluster, fetched as what it points at
			}
			asked = append(asked, req.GetResourceNamesSubscribe()...)
		}
		if !slices.Equal(asked, c.names) {
			t.Errorf("control plane %s was asked for %q, want %q", c.cp.Addr, asked, c.names)
		}
	}
}
