package main

import (
	"regexp"
	"testing"

	clusterpb "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerpb "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	hcmpb "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// What Envoy Gateway sends, as this test builds it without linking the
// extensions itself: a health_check HTTP filter in a listener and a
// least_request policy in a cluster (their bytes by hand), and a filter of
// a type no one links.
func gatewayResources(t *testing.T) (*listenerpb.Listener, *clusterpb.Cluster) {
	t.Helper()
	const prefix = "type.googleapis.com/envoy.extensions."
	// pass_through_mode (1): a BoolValue whose value (1) is true.
	healthCheck := &anypb.Any{TypeUrl: prefix + "filters.http.health_check.v3.HealthCheck", Value: []byte{0x0a, 0x02, 0x08, 0x01}}
	private := &anypb.Any{TypeUrl: "type.googleapis.com/example.v3.Private", Value: []byte{1, 2, 3}}
	hcm, err := anypb.New(&hcmpb.HttpConnectionManager{StatPrefix: "eg", HttpFilters: []*hcmpb.HttpFilter{
		{Name: "envoy.filters.http.health_check", ConfigType: &hcmpb.HttpFilter_TypedConfig{TypedConfig: healthCheck}},
		{Name: "example.private", ConfigType: &hcmpb.HttpFilter_TypedConfig{TypedConfig: private}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	l := &listenerpb.Listener{Name: "eg-listener", FilterChains: []*listenerpb.FilterChain{{Filters: []*listenerpb.Filter{
		{Name: "envoy.filters.network.http_connection_manager", ConfigType: &listenerpb.Filter_TypedConfig{TypedConfig: hcm}}}}}}
	c := testcp.Cluster("eg-cluster")
	// choice_count (1): a UInt32Value whose value (1) is 3.
	leastRequest := &anypb.Any{TypeUrl: prefix + "load_balancing_policies.least_request.v3.LeastRequest", Value: []byte{0x0a, 0x02, 0x08, 0x03}}
	c.LoadBalancingPolicy = &clusterpb.LoadBalancingPolicy{Policies: []*clusterpb.LoadBalancingPolicy_Policy{
		{TypedExtensionConfig: &corepb.TypedExtensionConfig{Name: "envoy.load_balancing_policies.least_request", TypedConfig: leastRequest}}}}
	return l, c
}

// watch prints Envoy Gateway's Listeners and Clusters: the extensions it
// uses decoded, and an Any of a type not linked raw (its type URL and its
// bytes in base64), rather than failing with "unable to resolve".
func TestWatchPrintsGatewayExtensions(t *testing.T) {
	cp := testcp.Start(t)
	l, c := gatewayResources(t)
	cp.Set(t, "c1", "1", l, c)
	for _, tc := range []struct {
		typ  string
		want []string
	}{
		{"lds", []string{"passThroughMode: true", "'@type': type.googleapis.com/example.v3.Private", "value: AQID"}},
		{"cds", []string{"'@type': type.googleapis.com/envoy.extensions.load_balancing_policies.least_request.v3.LeastRequest", "choiceCount: 3"}},
	} {
		out, errOut := &syncBuffer{}, &syncBuffer{}
		stop := startRun(t, []string{"watch", "--server", cp.Addr, "--node-id", "n1", "--cluster", "c1", "--type", tc.typ}, nil, out, errOut)
		for _, w := range tc.want {
			waitForOutput(t, out, `(?m)^ *`+regexp.QuoteMeta(w)+`$`)
		}
		if code := stop(); code != 0 {
			t.Errorf("watch --type %s: exit %d: %s", tc.typ, code, errOut)
		}
	}
}
