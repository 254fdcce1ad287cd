package xds

import (
	"slices"
	"testing"

	clusterpb "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointpb "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerpb "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routepb "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmpb "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlspb "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func TestRefs(t *testing.T) {
	rdsFrom := func(route string, cs *corepb.ConfigSource) *anypb.Any {
		return mustAny(t, &hcmpb.HttpConnectionManager{RouteSpecifier: &hcmpb.HttpConnectionManager_Rds{
			Rds: &hcmpb.Rds{RouteConfigName: route, ConfigSource: cs}}})
	}
	rds := func(route string) *anypb.Any { return rdsFrom(route, nil) }
	route := func(rs ...*routepb.Route) *routepb.RouteConfiguration {
		return &routepb.RouteConfiguration{Name: "r", VirtualHosts: []*routepb.VirtualHost{{Name: "vh", Domains: []string{"*"}, Routes: rs}}}
	}
	to := func(a *routepb.RouteAction) *routepb.Route {
		return &routepb.Route{Action: &routepb.Route_Route{Route: a}}
	}
	sds := func(names ...string) *tlspb.CommonTlsContext {
		c := &tlspb.CommonTlsContext{}
		ads := &corepb.ConfigSource{ConfigSourceSpecifier: &corepb.ConfigSource_Ads{Ads: &corepb.AggregatedConfigSource{}}}
		for _, n := range names[1:] {
			c.TlsCertificateSdsSecretConfigs = append(c.TlsCertificateSdsSecretConfigs, &tlspb.SdsSecretConfig{Name: n, SdsConfig: ads})
		}
		// A static secret, and one from a local SDS agent: not the control plane's.
		c.TlsCertificateSdsSecretConfigs = append(c.TlsCertificateSdsSecretConfigs, &tlspb.SdsSecretConfig{Name: "static"},
			&tlspb.SdsSecretConfig{Name: "agent", SdsConfig: &corepb.ConfigSource{ConfigSourceSpecifier: &corepb.ConfigSource_ApiConfigSource{}}})
		c.ValidationContextType = &tlspb.CommonTlsContext_ValidationContextSdsSecretConfig{ValidationContextSdsSecretConfig: &tlspb.SdsSecretConfig{Name: names[0],
			SdsConfig: &corepb.ConfigSource{ConfigSourceSpecifier: &corepb.ConfigSource_Self{Self: &corepb.SelfConfigSource{}}}}}
		return c
	}
	socket := func(m proto.Message) *corepb.TransportSocket {
		return &corepb.TransportSocket{Name: "tls", ConfigType: &corepb.TransportSocket_TypedConfig{TypedConfig: mustAny(t, m)}}
	}
	R := func(n string) Ref { return Ref{resourcev3.RouteType, n} }
	C := func(n string) Ref { return Ref{resourcev3.ClusterType, n} }
	E := func(n string) Ref { return Ref{resourcev3.EndpointType, n} }
	S := func(n string) Ref { return Ref{resourcev3.SecretType, n} }
	for _, tc := range []struct {
		name string
		res  proto.Message
		want []Ref
	}{
		{name: "api listener", res: &listenerpb.Listener{Name: "l", ApiListener: &listenerpb.ApiListener{ApiListener: rds("r1")}}, want: []Ref{R("r1")}},
		{name: "filter chains, tls, default chain", res: &listenerpb.Listener{Name: "l",
			FilterChains: []*listenerpb.FilterChain{
				{Filters: []*listenerpb.Filter{{Name: "hcm", ConfigType: &listenerpb.Filter_TypedConfig{TypedConfig: rds("r1")}}},
					TransportSocket: socket(&tlspb.DownstreamTlsContext{CommonTlsContext: sds("ca", "cert")})},
				{Filters: []*listenerpb.Filter{{Name: "hcm", ConfigType: &listenerpb.Filter_TypedConfig{TypedConfig: rds("r1")}}}},
			},
			DefaultFilterChain: &listenerpb.FilterChain{Filters: []*listenerpb.Filter{{Name: "hcm", ConfigType: &listenerpb.Filter_TypedConfig{TypedConfig: rds("r2")}}}},
		}, want: []Ref{R("r1"), S("cert"), S("ca"), R("r2")}},
		{name: "inline route config", res: &listenerpb.Listener{Name: "l", ApiListener: &listenerpb.ApiListener{ApiListener: mustAny(t,
			&hcmpb.HttpConnectionManager{RouteSpecifier: &hcmpb.HttpConnectionManager_RouteConfig{RouteConfig: route(to(&routepb.RouteAction{ClusterSpecifier: &routepb.RouteAction_Cluster{Cluster: "x"}}))}})}},
			want: []Ref{C("x")}},
		{name: "rds from ads, self, and another config source", res: &listenerpb.Listener{Name: "l", FilterChains: []*listenerpb.FilterChain{{Filters: []*listenerpb.Filter{
			{Name: "ads", ConfigType: &listenerpb.Filter_TypedConfig{TypedConfig: rdsFrom("r1", &corepb.ConfigSource{ConfigSourceSpecifier: &corepb.ConfigSource_Ads{Ads: &corepb.AggregatedConfigSource{}}})}},
			{Name: "self", ConfigType: &listenerpb.Filter_TypedConfig{TypedConfig: rdsFrom("r2", &corepb.ConfigSource{ConfigSourceSpecifier: &corepb.ConfigSource_Self{Self: &corepb.SelfConfigSource{}}})}},
			{Name: "other", ConfigType: &listenerpb.Filter_TypedConfig{TypedConfig: rdsFrom("r3", &corepb.ConfigSource{ConfigSourceSpecifier: &corepb.ConfigSource_ApiConfigSource{}})}},
		}}}}, want: []Ref{R("r1"), R("r2")}},
		{name: "unknown filter", res: &listenerpb.Listener{Name: "l", FilterChains: []*listenerpb.FilterChain{{Filters: []*listenerpb.Filter{{Name: "tcp",
			ConfigType: &listenerpb.Filter_TypedConfig{TypedConfig: mustAny(t, wrapperspb.String("not a filter"))}}}}}}},
		{name: "route: cluster, weighted, header", res: route(
			to(&routepb.RouteAction{ClusterSpecifier: &routepb.RouteAction_Cluster{Cluster: "x"}}),
			to(&routepb.RouteAction{ClusterSpecifier: &routepb.RouteAction_WeightedClusters{WeightedClusters: &routepb.WeightedCluster{
				Clusters: []*routepb.WeightedCluster_ClusterWeight{{Name: "y"}, {Name: "x"}, {Name: "z"}}}}}),
			to(&routepb.RouteAction{ClusterSpecifier: &routepb.RouteAction_ClusterHeader{ClusterHeader: "x-cluster"}}),
			&routepb.Route{Action: &routepb.Route_DirectResponse{}},
		), want: []Ref{C("x"), C("y"), C("z")}},
		{name: "eds cluster with tls", res: &clusterpb.Cluster{Name: "a", ClusterDiscoveryType: &clusterpb.Cluster_Type{Type: clusterpb.Cluster_EDS},
			TransportSocket: socket(&tlspb.UpstreamTlsContext{CommonTlsContext: sds("ca")})}, want: []Ref{E("a"), S("ca")}},
		{name: "static cluster", res: &clusterpb.Cluster{Name: "a"}},
		{name: "endpoints point at nothing", res: &endpointpb.ClusterLoadAssignment{ClusterName: "a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := mustAny(t, tc.res)
			if got := Refs(a.GetTypeUrl(), a.GetValue()); !slices.Equal(got, tc.want) {
				t.Errorf("Refs = %v, want %v", got, tc.want)
			}
			r, err := Encode("n", "1", a, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(r.Refs, tc.want) {
				t.Errorf("Encode's Refs = %v, want %v", r.Refs, tc.want)
			}
		})
	}
}

// BenchmarkRefs is what reading a resource's references adds to its
// encoding (BenchmarkEncode), once per version that arrives.
func BenchmarkRefs(b *testing.B) {
	rc := &routepb.RouteConfiguration{Name: "r", VirtualHosts: []*routepb.VirtualHost{{Name: "vh", Domains: []string{"*"}}}}
	for i := range 50 {
		rc.VirtualHosts[0].Routes = append(rc.VirtualHosts[0].Routes, &routepb.Route{
			Match:  &routepb.RouteMatch{PathSpecifier: &routepb.RouteMatch_Prefix{Prefix: "/" + string(rune('a'+i%26))}},
			Action: &routepb.Route_Route{Route: &routepb.RouteAction{ClusterSpecifier: &routepb.RouteAction_Cluster{Cluster: "cluster-" + string(rune('a'+i%26)) + string(rune('a'+i/26))}}}})
	}
	for _, tc := range []struct {
		name string
		m    proto.Message
	}{{"cluster", cluster("c")}, {"cla-200-endpoints", endpoints200("c")}, {"route-50-routes", rc}} {
		a, err := anypb.New(tc.m)
		if err != nil {
			b.Fatal(err)
		}
		b.Run("refs/"+tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				Refs(a.GetTypeUrl(), a.GetValue())
			}
		})
		b.Run("encode/"+tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Encode("c", "v1", a, nil, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// Many references are each listed once, in the order found; a Cluster's
// transport_socket_matches are read too.
func TestRefsManyAndSocketMatches(t *testing.T) {
	rc := &routepb.RouteConfiguration{Name: "r", VirtualHosts: []*routepb.VirtualHost{{Name: "vh"}}}
	var want []Ref
	for pass := range 2 {
		for i := range 20 {
			name := "c" + string(rune('a'+i))
			rc.VirtualHosts[0].Routes = append(rc.VirtualHosts[0].Routes, &routepb.Route{
				Action: &routepb.Route_Route{Route: &routepb.RouteAction{ClusterSpecifier: &routepb.RouteAction_Cluster{Cluster: name}}}})
			if pass == 0 {
				want = append(want, Ref{resourcev3.ClusterType, name})
			}
		}
	}
	a := mustAny(t, rc)
	if got := Refs(a.GetTypeUrl(), a.GetValue()); !slices.Equal(got, want) {
		t.Errorf("Refs = %v, want %v", got, want)
	}
	ads := &corepb.ConfigSource{ConfigSourceSpecifier: &corepb.ConfigSource_Ads{Ads: &corepb.AggregatedConfigSource{}}}
	tls := mustAny(t, &tlspb.UpstreamTlsContext{CommonTlsContext: &tlspb.CommonTlsContext{
		TlsCertificateSdsSecretConfigs: []*tlspb.SdsSecretConfig{{Name: "m", SdsConfig: ads}}}})
	c := mustAny(t, &clusterpb.Cluster{Name: "a", TransportSocketMatches: []*clusterpb.Cluster_TransportSocketMatch{{Name: "tls",
		TransportSocket: &corepb.TransportSocket{Name: "tls", ConfigType: &corepb.TransportSocket_TypedConfig{TypedConfig: tls}}}}})
	if got := Refs(c.GetTypeUrl(), c.GetValue()); !slices.Equal(got, []Ref{{resourcev3.SecretType, "m"}}) {
		t.Errorf("Refs of a cluster with socket matches = %v", got)
	}
}
