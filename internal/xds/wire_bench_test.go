package xds

import (
	"fmt"
	"strconv"
	"testing"

	clusterpb "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointpb "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Benchmarks of response assembly: what the relay does per client and
// response (a header and the shared, pre-encoded resource fields, written by
// the Codec) against what a server that marshals each response does
// (proto.Marshal of the equivalent DiscoveryResponse, the Anys already
// built; and, as go-control-plane's caches do for each response they build,
// anypb.New of each resource first). Run them with
//
//	go test -run '^$' -bench . -benchmem ./internal/xds

// benchCLA is a ClusterLoadAssignment of n loopback endpoints.
func benchCLA(name string, n int) *endpointpb.ClusterLoadAssignment {
	lbs := make([]*endpointpb.LbEndpoint, n)
	for j := range lbs {
		addr := &corepb.SocketAddress{
			Address:       fmt.Sprintf("127.0.%d.%d", j/256%256, j%256),
			PortSpecifier: &corepb.SocketAddress_PortValue{PortValue: uint32(20000 + j)},
		}
		lbs[j] = &endpointpb.LbEndpoint{
			HostIdentifier: &endpointpb.LbEndpoint_Endpoint{Endpoint: &endpointpb.Endpoint{
				Address: &corepb.Address{Address: &corepb.Address_SocketAddress{SocketAddress: addr}},
			}},
			LoadBalancingWeight: wrapperspb.UInt32(1),
		}
	}
	return &endpointpb.ClusterLoadAssignment{
		ClusterName: name,
		Endpoints: []*endpointpb.LocalityLbEndpoints{{
			Locality:    &corepb.Locality{Region: "bench", Zone: "bench-a"},
			LbEndpoints: lbs,
		}},
	}
}

// benchCluster is an EDS cluster, the typical CDS resource.
func benchCluster(name string) *clusterpb.Cluster {
	return &clusterpb.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterpb.Cluster_Type{Type: clusterpb.Cluster_EDS},
		EdsClusterConfig: &clusterpb.Cluster_EdsClusterConfig{
			EdsConfig: &corepb.ConfigSource{
				ResourceApiVersion:    corepb.ApiVersion_V3,
				ConfigSourceSpecifier: &corepb.ConfigSource_Ads{Ads: &corepb.AggregatedConfigSource{}},
			},
			ServiceName: name,
		},
		ConnectTimeout: durationpb.New(1e9),
		LbPolicy:       clusterpb.Cluster_ROUND_ROBIN,
	}
}

// corpus is k resources, as messages, as Anys, and as the relay encodes them.
type corpus struct {
	msgs []proto.Message
	anys []*anypb.Any
	res  []*Resource
}

func newCorpus(b *testing.B, k int, build func(name string) proto.Message) corpus {
	b.Helper()
	var c corpus
	for i := range k {
		name := "r-" + strconv.Itoa(i)
		m := build(name)
		a, err := anypb.New(m)
		if err != nil {
			b.Fatal(err)
		}
		r, err := Encode(name, "v1", a, nil, nil)
		if err != nil {
			b.Fatal(err)
		}
		c.msgs, c.anys, c.res = append(c.msgs, m), append(c.anys, a), append(c.res, r)
	}
	return c
}

func endpoints200(name string) proto.Message { return benchCLA(name, 200) }
func cluster(name string) proto.Message      { return benchCluster(name) }

// wire is what the Codec hands gRPC for a message, flattened: the bytes
// on the wire.
func wire(b *testing.B, m any) []byte {
	b.Helper()
	bs, err := Codec{}.Marshal(m)
	if err != nil {
		b.Fatal(err)
	}
	return bs.Materialize()
}

// sink keeps results alive.
var sink mem.BufferSlice

func marshalAnys(b *testing.B, msgs []proto.Message) []*anypb.Any {
	anys := make([]*anypb.Any, len(msgs))
	for i, m := range msgs {
		a, err := anypb.New(m)
		if err != nil {
			b.Fatal(err)
		}
		anys[i] = a
	}
	return anys
}

// BenchmarkEncode is the relay's per-change upstream work on a resource:
// decode it (to NACK what does not decode) and encode its SotW and delta
// forms, once for every client.
func BenchmarkEncode(b *testing.B) {
	for _, tc := range []struct {
		name  string
		build func(string) proto.Message
	}{{"cla-200-endpoints", endpoints200}, {"cluster", cluster}} {
		b.Run(tc.name, func(b *testing.B) {
			a, err := anypb.New(tc.build("r-0"))
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(a.GetValue())))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Encode("r-0", "v1", a, nil, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDeltaResponse is one delta response of k changed 200-endpoint
// ClusterLoadAssignments (k=1: one change reaching a client).
func BenchmarkDeltaResponse(b *testing.B) {
	for _, k := range []int{1, 10} {
		c := newCorpus(b, k, endpoints200)
		want := &discoverypb.DeltaDiscoveryResponse{SystemVersionInfo: "7", TypeUrl: resourcev3.EndpointType, Nonce: "42"}
		for i, a := range c.anys {
			want.Resources = append(want.Resources, &discoverypb.Resource{Name: c.res[i].Name, Version: "v1", Resource: a})
		}
		checkSame(b, DeltaResponse(7, resourcev3.EndpointType, "42", c.res, nil), want)
		b.Run(fmt.Sprintf("cla-200x%d/xds", k), func(b *testing.B) {
			b.SetBytes(int64(proto.Size(want)))
			b.ReportAllocs()
			for b.Loop() {
				sink, _ = Codec{}.Marshal(DeltaResponse(7, resourcev3.EndpointType, "42", c.res, nil))
				sink.Free()
			}
		})
		b.Run(fmt.Sprintf("cla-200x%d/proto.Marshal", k), func(b *testing.B) {
			b.SetBytes(int64(proto.Size(want)))
			b.ReportAllocs()
			for b.Loop() {
				resp := &discoverypb.DeltaDiscoveryResponse{SystemVersionInfo: "7", TypeUrl: resourcev3.EndpointType, Nonce: "42"}
				for i, a := range c.anys {
					resp.Resources = append(resp.Resources, &discoverypb.Resource{Name: c.res[i].Name, Version: "v1", Resource: a})
				}
				sink, _ = Codec{}.Marshal(resp)
				sink.Free()
			}
		})
		b.Run(fmt.Sprintf("cla-200x%d/anypb.New+proto.Marshal", k), func(b *testing.B) {
			b.SetBytes(int64(proto.Size(want)))
			b.ReportAllocs()
			for b.Loop() {
				resp := &discoverypb.DeltaDiscoveryResponse{SystemVersionInfo: "7", TypeUrl: resourcev3.EndpointType, Nonce: "42"}
				for i, a := range marshalAnys(b, c.msgs) {
					resp.Resources = append(resp.Resources, &discoverypb.Resource{Name: c.res[i].Name, Version: "v1", Resource: a})
				}
				sink, _ = Codec{}.Marshal(resp)
				sink.Free()
			}
		})
	}
}

// BenchmarkSotWResponse is one SotW response of k 200-endpoint
// ClusterLoadAssignments (EDS sends the subscribed ones).
func BenchmarkSotWResponse(b *testing.B) {
	for _, k := range []int{1, 10} {
		c := newCorpus(b, k, endpoints200)
		want := &discoverypb.DiscoveryResponse{VersionInfo: "7", TypeUrl: resourcev3.EndpointType, Nonce: "42", Resources: c.anys}
		checkSame(b, SotWResponse(7, resourcev3.EndpointType, "42", c.res), want)
		b.Run(fmt.Sprintf("cla-200x%d/xds", k), func(b *testing.B) {
			b.SetBytes(int64(proto.Size(want)))
			b.ReportAllocs()
			for b.Loop() {
				sink, _ = Codec{}.Marshal(SotWResponse(7, resourcev3.EndpointType, "42", c.res))
				sink.Free()
			}
		})
		b.Run(fmt.Sprintf("cla-200x%d/proto.Marshal", k), func(b *testing.B) {
			b.SetBytes(int64(proto.Size(want)))
			b.ReportAllocs()
			for b.Loop() {
				resp := &discoverypb.DiscoveryResponse{VersionInfo: "7", TypeUrl: resourcev3.EndpointType, Nonce: "42", Resources: c.anys}
				sink, _ = Codec{}.Marshal(resp)
				sink.Free()
			}
		})
		b.Run(fmt.Sprintf("cla-200x%d/anypb.New+proto.Marshal", k), func(b *testing.B) {
			b.SetBytes(int64(proto.Size(want)))
			b.ReportAllocs()
			for b.Loop() {
				resp := &discoverypb.DiscoveryResponse{VersionInfo: "7", TypeUrl: resourcev3.EndpointType, Nonce: "42", Resources: marshalAnys(b, c.msgs)}
				sink, _ = Codec{}.Marshal(resp)
				sink.Free()
			}
		})
	}
}

// BenchmarkSotWFullState is the complete CDS state of k clusters sent to a
// wildcard SotW client: the relay writes a header and the body built once
// for every client (cache.State.SotW).
func BenchmarkSotWFullState(b *testing.B) {
	for _, k := range []int{100, 1000} {
		c := newCorpus(b, k, cluster)
		var body []byte
		for _, r := range c.res {
			body = append(body, r.Any...)
		}
		want := &discoverypb.DiscoveryResponse{VersionInfo: "7", TypeUrl: resourcev3.ClusterType, Nonce: "42", Resources: c.anys}
		checkSame(b, SotWFullState(7, resourcev3.ClusterType, "42", body), want)
		b.Run(fmt.Sprintf("clusters=%d/xds", k), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				sink, _ = Codec{}.Marshal(SotWFullState(7, resourcev3.ClusterType, "42", body))
				sink.Free()
			}
		})
		b.Run(fmt.Sprintf("clusters=%d/proto.Marshal", k), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				resp := &discoverypb.DiscoveryResponse{VersionInfo: "7", TypeUrl: resourcev3.ClusterType, Nonce: "42", Resources: c.anys}
				sink, _ = Codec{}.Marshal(resp)
				sink.Free()
			}
		})
		b.Run(fmt.Sprintf("clusters=%d/anypb.New+proto.Marshal", k), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				resp := &discoverypb.DiscoveryResponse{VersionInfo: "7", TypeUrl: resourcev3.ClusterType, Nonce: "42", Resources: marshalAnys(b, c.msgs)}
				sink, _ = Codec{}.Marshal(resp)
				sink.Free()
			}
		})
	}
}

// checkSame fails the benchmark unless the assembled message decodes to
// want: the comparison is between equivalent responses.
func checkSame(b *testing.B, m *Message, want proto.Message) {
	b.Helper()
	got := want.ProtoReflect().New().Interface()
	if err := proto.Unmarshal(wire(b, m), got); err != nil {
		b.Fatal(err)
	}
	if !proto.Equal(got, want) {
		b.Fatalf("assembled response differs from the marshalled one")
	}
}
