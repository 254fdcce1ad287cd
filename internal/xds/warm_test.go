package xds

import (
	"testing"

	clusterpb "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointpb "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

func TestWarm(t *testing.T) {
	eds := func(name, service string) *clusterpb.Cluster {
		return &clusterpb.Cluster{Name: name, ClusterDiscoveryType: &clusterpb.Cluster_Type{Type: clusterpb.Cluster_EDS},
			EdsClusterConfig: &clusterpb.Cluster_EdsClusterConfig{ServiceName: service}}
	}
	for _, tc := range []struct {
		name string
		res  proto.Message
		want string
	}{
		{name: "eds cluster, no service_name", res: eds("a", ""), want: "a"},
		{name: "eds cluster, service_name", res: eds("a", "shared"), want: "shared"},
		{name: "eds cluster, no eds_cluster_config", res: &clusterpb.Cluster{Name: "a",
			ClusterDiscoveryType: &clusterpb.Cluster_Type{Type: clusterpb.Cluster_EDS}}, want: "a"},
		{name: "static cluster", res: &clusterpb.Cluster{Name: "a"}, want: ""},
		{name: "dns cluster", res: &clusterpb.Cluster{Name: "a",
			ClusterDiscoveryType: &clusterpb.Cluster_Type{Type: clusterpb.Cluster_STRICT_DNS}}, want: ""},
		{name: "custom cluster type", res: &clusterpb.Cluster{Name: "a", EdsClusterConfig: &clusterpb.Cluster_EdsClusterConfig{ServiceName: "s"},
			ClusterDiscoveryType: &clusterpb.Cluster_ClusterType{ClusterType: &clusterpb.Cluster_CustomClusterType{Name: "aggregate"}}}, want: ""},
		{name: "endpoints are not warmed", res: &endpointpb.ClusterLoadAssignment{ClusterName: "a"}, want: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := anypb.New(tc.res)
			if err != nil {
				t.Fatal(err)
			}
			if got := Warm(a.GetTypeUrl(), a.GetValue()); got != tc.want {
				t.Errorf("Warm = %q, want %q", got, tc.want)
			}
			// Both encoders fill it: the file source's and the received one's.
			r, err := Encode("x", "1", a, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			if r.Warm != tc.want {
				t.Errorf("Encode: Warm = %q, want %q", r.Warm, tc.want)
			}
			rr := received(t, &discoverypb.Resource{Name: "x", Version: "1", Resource: a})
			if r, err = rr.Encode(); err != nil {
				t.Fatal(err)
			}
			if r.Warm != tc.want {
				t.Errorf("ReceivedResource.Encode: Warm = %q, want %q", r.Warm, tc.want)
			}
		})
	}
}

// A Cluster written in pieces, as proto.Unmarshal reads it: the last type
// wins, eds_cluster_config sent twice is merged.
func TestWarmReadsFieldsAsUnmarshalDoes(t *testing.T) {
	first, _ := proto.Marshal(&clusterpb.Cluster{Name: "a", ClusterDiscoveryType: &clusterpb.Cluster_Type{Type: clusterpb.Cluster_STATIC},
		EdsClusterConfig: &clusterpb.Cluster_EdsClusterConfig{ServiceName: "s1"}})
	second, _ := proto.Marshal(&clusterpb.Cluster{ClusterDiscoveryType: &clusterpb.Cluster_Type{Type: clusterpb.Cluster_EDS},
		EdsClusterConfig: &clusterpb.Cluster_EdsClusterConfig{EdsConfig: &corepb.ConfigSource{}}})
	value := append(first, second...)
	var c clusterpb.Cluster
	if err := proto.Unmarshal(value, &c); err != nil {
		t.Fatal(err)
	}
	if c.GetEdsClusterConfig().GetServiceName() != "s1" || c.GetType() != clusterpb.Cluster_EDS {
		t.Fatalf("the test's premise: %v", &c)
	}
	if got := Warm("type.googleapis.com/envoy.config.cluster.v3.Cluster", value); got != "s1" {
		t.Errorf("Warm = %q, want s1", got)
	}
}

// received is a Resource as the relay receives it.
func received(t *testing.T, r *discoverypb.Resource) ReceivedResource {
	t.Helper()
	b, err := proto.Marshal(&discoverypb.DeltaDiscoveryResponse{Resources: []*discoverypb.Resource{r}})
	if err != nil {
		t.Fatal(err)
	}
	var got Received
	if err := (Codec{}).Unmarshal(chunked(b, 1<<20), &got); err != nil {
		t.Fatal(err)
	}
	return got.Resources[0]
}
