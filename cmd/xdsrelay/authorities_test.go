package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc/codes"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// upstream.authorities routes names in every shape the key takes: alone in
// the file, beside upstreams:, from the environment, and over resource
// files. In each, an
// xdstp name under an authority nobody lists is removed with NOT_FOUND
// although the default control plane (or directory) holds a copy (docs/control-planes.md,
// rule 1), and a name under the listed authority is served by the default.
func TestUpstreamAuthoritiesShapes(t *testing.T) {
	const (
		listed   = "xdstp://mine.example.com/envoy.config.cluster.v3.Cluster/a"
		unlisted = "xdstp://other.example.com/envoy.config.cluster.v3.Cluster/b"
	)
	def, secrets := testcp.Start(t), testcp.Start(t)
	def.Set(t, "c1", "1", testcp.Cluster(listed), testcp.Cluster(unlisted))
	dir := t.TempDir()
	for i, n := range []string{listed, unlisted} {
		writeFile(t, filepath.Join(dir, fmt.Sprintf("c%d.yaml", i)),
			"\"@type\": type.googleapis.com/envoy.config.cluster.v3.Cluster\nname: "+n+"\ntype: EDS\neds_cluster_config: {eds_config: {ads: {}}}\n")
	}
	for _, tc := range []struct {
		name string
		yaml string
		env  map[string]string
	}{
		{name: "only upstream.authorities", yaml: "upstream:\n  address: " + def.Addr + "\n  authorities: [mine.example.com]\n"},
		{name: "with upstreams", yaml: "upstream:\n  address: " + def.Addr + "\n  authorities: [mine.example.com]\n" +
			"upstreams:\n  - {name: secrets, address: " + secrets.Addr + ", types: [secrets]}\n"},
		{name: "from the environment", yaml: "upstream:\n  address: " + def.Addr + "\n",
			env: map[string]string{"XDSRELAY_UPSTREAM_AUTHORITIES": "mine.example.com"}},
		{name: "resource files", yaml: "upstream:\n  address: file://" + dir + "\n  authorities: [mine.example.com]\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "relay.yaml")
			if err := os.WriteFile(file, []byte(tc.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			r := bootConfigEnv(t, file, tc.env)
			got, removed := subscribeDelta(t, r.Addr(), listed, unlisted)
			if !slices.Equal(got, []string{listed}) || !slices.Equal(removed, []string{unlisted}) {
				t.Errorf("got %v, removed %v; want [%s] and [%s] removed", got, removed, listed, unlisted)
			}
		})
	}
}

// subscribeDelta asks a delta stream of node c1 for the clusters names
// and returns, once every name has been answered, those it got and those
// removed with a NOT_FOUND error.
func subscribeDelta(t *testing.T, addr string, names ...string) (got, removed []string) {
	t.Helper()
	st := deltaADS(t, addr, 10*time.Second)
	if err := st.Send(&discoverypb.DeltaDiscoveryRequest{Node: &corepb.Node{Id: "n1", Cluster: "c1"},
		TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: names}); err != nil {
		t.Fatal(err)
	}
	for len(got)+len(removed) < len(names) {
		resp, err := st.Recv()
		if err != nil {
			t.Fatalf("after %v and %v removed: %v", got, removed, err)
		}
		for _, res := range resp.GetResources() {
			got = append(got, res.GetName())
		}
		for _, n := range resp.GetRemovedResources() {
			if !slices.ContainsFunc(resp.GetResourceErrors(), func(e *discoverypb.ResourceError) bool {
				return e.GetResourceName().GetName() == n && e.GetErrorDetail().GetCode() == int32(codes.NotFound)
			}) {
				t.Errorf("%s removed without a NOT_FOUND error", n)
			}
			removed = append(removed, n)
		}
		if err := st.Send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()}); err != nil {
			t.Fatal(err)
		}
	}
	return got, removed
}
