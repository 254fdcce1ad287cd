package xds

import (
	"testing"
	"time"

	clusterpb "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointpb "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
)

func mustAny(t *testing.T, m proto.Message) *anypb.Any {
	t.Helper()
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func receiveSotW(t *testing.T, resp *discoverypb.DiscoveryResponse) Received {
	t.Helper()
	b, err := proto.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	var r SotWReceived
	if err := (Codec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &r); err != nil {
		t.Fatal(err)
	}
	return r.Received
}

// A SotW response reads as the delta one would: each resource named from
// itself (cluster_name for a ClusterLoadAssignment) or from its wrapper,
// versioned by its bytes (a wrapper's own version dropped), a wrapper's
// TTL kept and a wrapper without a resource a heartbeat.
func TestSotWReceived(t *testing.T) {
	c := mustAny(t, &clusterpb.Cluster{Name: "c"})
	wrapped := mustAny(t, &discoverypb.Resource{Name: "c", Version: "cp-7", Resource: c, Ttl: durationpb.New(time.Minute)})
	heartbeat := mustAny(t, &discoverypb.Resource{Name: "h", Ttl: durationpb.New(time.Minute)})
	cla := mustAny(t, &endpointpb.ClusterLoadAssignment{ClusterName: "e"})

	r := receiveSotW(t, &discoverypb.DiscoveryResponse{VersionInfo: "v1", Nonce: "n1", TypeUrl: resourcev3.ClusterType,
		Resources: []*anypb.Any{c, wrapped, heartbeat}})
	if !r.StateOfTheWorld || r.SystemVersionInfo != "v1" || r.Nonce != "n1" || r.TypeURL != resourcev3.ClusterType {
		t.Fatalf("response fields: %+v", r)
	}
	if len(r.Resources) != 3 {
		t.Fatalf("%d resources, want 3", len(r.Resources))
	}
	raw, err := r.Resources[0].Encode()
	if err != nil {
		t.Fatal(err)
	}
	fromWrapper, err := r.Resources[1].Encode()
	if err != nil {
		t.Fatal(err)
	}
	if raw.Name != "c" || fromWrapper.Name != "c" {
		t.Fatalf("names %q and %q, want c", raw.Name, fromWrapper.Name)
	}
	if raw.Version != fromWrapper.Version || raw.Version == "cp-7" || raw.Version == "" {
		t.Fatalf("versions %q (raw) and %q (wrapped): want the same, from the bytes", raw.Version, fromWrapper.Version)
	}
	if fromWrapper.TTL != time.Minute || raw.TTL != 0 {
		t.Fatalf("TTLs %s (wrapped) and %s (raw)", fromWrapper.TTL, raw.TTL)
	}
	if !r.Resources[2].Heartbeat || r.Resources[2].Name != "h" {
		t.Fatalf("heartbeat: %+v", r.Resources[2])
	}

	r = receiveSotW(t, &discoverypb.DiscoveryResponse{TypeUrl: resourcev3.EndpointType, Resources: []*anypb.Any{cla}})
	if got := r.Resources[0].Name; got != "e" {
		t.Fatalf("ClusterLoadAssignment named %q, want e", got)
	}
	again := receiveSotW(t, &discoverypb.DiscoveryResponse{TypeUrl: resourcev3.EndpointType, Resources: []*anypb.Any{cla}, Nonce: "2"})
	if r.Resources[0].BytesVersion() != again.Resources[0].BytesVersion() {
		t.Fatal("the same bytes in two responses have two versions")
	}
}

// A resource that came with a control plane's version, sent on over SotW
// (its Any as a SotW response carries it), is versioned below by its
// bytes: Resource.BytesVersion says that version where it is.
func TestBytesVersionIsTheSotWTiers(t *testing.T) {
	cla := mustAny(t, &endpointpb.ClusterLoadAssignment{ClusterName: "e"})
	here, err := Encode("e", "cp-version-9", cla, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var b []byte
	for _, p := range SotWResponse(3, resourcev3.EndpointType, "n", []*Resource{here}).Parts {
		b = append(b, p...)
	}
	var below SotWReceived
	if err := (Codec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &below); err != nil {
		t.Fatal(err)
	}
	enc, err := below.Resources[0].Encode()
	if err != nil {
		t.Fatal(err)
	}
	if enc.Version == here.Version || here.BytesVersion() != enc.Version || enc.BytesVersion() != enc.Version {
		t.Fatalf("here %q (bytes %q), below over SotW %q (bytes %q)", here.Version, here.BytesVersion(), enc.Version, enc.BytesVersion())
	}
}
