package loadtest

import (
	"testing"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// TestMarkCodecReadsWhatAFullDecodeReads: for every kind, the codec's
// responses give the clients the same nonce, version, newest update and
// foreign verdict as gRPC's proto codec, whether the message arrives in one
// buffer or several.
func TestMarkCodecReadsWhatAFullDecodeReads(t *testing.T) {
	for name, kd := range kinds {
		t.Run(name, func(t *testing.T) {
			coding := newSeqCoding(kd, 5)
			other := coding
			other.base = coding.base + 100 // an earlier run's marks
			x := &xdsClients{coding: coding}
			codec := newMarkCodec(coding)
			pack := func(c seqCoding, i, seq int) *anypb.Any {
				a, err := anypb.New(c.resource(kd.prefix+"x", i, seq, 3))
				if err != nil {
					t.Fatal(err)
				}
				return a
			}
			foreignType, err := anypb.New(&discoverypb.Resource{Name: "not-the-kind"})
			if err != nil {
				t.Fatal(err)
			}
			cases := map[string][]*anypb.Any{
				"newest of two":          {pack(coding, 0, 2), pack(coding, 1, 4)},
				"first config":           {pack(coding, 0, 0)},
				"another run's mark":     {pack(other, 0, 3)},
				"another type":           {foreignType, pack(coding, 2, 1)},
				"another type, alone":    {foreignType},
				"nothing":                nil,
				"mark at the last seq":   {pack(coding, 0, 5)},
				"ours and another run's": {pack(coding, 0, 1), pack(other, 1, 1)},
			}
			for cname, anys := range cases {
				delta := &discoverypb.DeltaDiscoveryResponse{SystemVersionInfo: "v7", Nonce: "n-" + cname, TypeUrl: kd.typeURL,
					RemovedResources: []string{"gone"}}
				for i, a := range anys {
					delta.Resources = append(delta.Resources, &discoverypb.Resource{Name: "r" + string(rune('a'+i)), Version: "1", Resource: a})
				}
				sotw := &discoverypb.DiscoveryResponse{VersionInfo: "v7", Nonce: "n-" + cname, TypeUrl: kd.typeURL, Resources: anys}
				wantNewest, wantForeign := x.scan(anys)
				for _, split := range []bool{false, true} {
					var gotDelta discoverypb.DeltaDiscoveryResponse
					if err := codec.Unmarshal(buffers(t, delta, split), &gotDelta); err != nil {
						t.Fatalf("%s: delta: %v", cname, err)
					}
					var res []*anypb.Any
					for _, r := range gotDelta.GetResources() {
						res = append(res, r.GetResource())
					}
					if n, f := x.scan(res); n != wantNewest || f != wantForeign || gotDelta.GetNonce() != delta.Nonce ||
						gotDelta.GetSystemVersionInfo() != "v7" {
						t.Errorf("%s (split %v): delta gives newest %d foreign %v nonce %q version %q, a full decode %d %v %q %q",
							cname, split, n, f, gotDelta.GetNonce(), gotDelta.GetSystemVersionInfo(), wantNewest, wantForeign, delta.Nonce, "v7")
					}
					var gotSotW discoverypb.DiscoveryResponse
					if err := codec.Unmarshal(buffers(t, sotw, split), &gotSotW); err != nil {
						t.Fatalf("%s: sotw: %v", cname, err)
					}
					if n, f := x.scan(gotSotW.GetResources()); n != wantNewest || f != wantForeign || gotSotW.GetNonce() != sotw.Nonce ||
						gotSotW.GetVersionInfo() != "v7" {
						t.Errorf("%s (split %v): sotw gives newest %d foreign %v nonce %q version %q, a full decode %d %v %q %q",
							cname, split, n, f, gotSotW.GetNonce(), gotSotW.GetVersionInfo(), wantNewest, wantForeign, sotw.Nonce, "v7")
					}
				}
			}
		})
	}
}

// TestMarkCodecRefusesGarbage: a response that is not a message is an
// error, as it is for the proto codec, and a request goes through the
// proto codec unchanged.
func TestMarkCodecRefusesGarbage(t *testing.T) {
	codec := newMarkCodec(newSeqCoding(kinds["eds"], 1))
	garbage := mem.BufferSlice{mem.SliceBuffer([]byte{0x12, 0xff, 0x01})} // field 2, a length past the end
	if err := codec.Unmarshal(garbage, &discoverypb.DeltaDiscoveryResponse{}); err == nil {
		t.Error("delta: a truncated message decoded")
	}
	if err := codec.Unmarshal(garbage, &discoverypb.DiscoveryResponse{}); err == nil {
		t.Error("sotw: a truncated message decoded")
	}
	req := &discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: []string{"cla-0"}}
	data, err := codec.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	var back discoverypb.DeltaDiscoveryRequest
	if err := codec.Unmarshal(data, &back); err != nil || !proto.Equal(req, &back) {
		t.Errorf("a request through the codec: %v, %v", &back, err)
	}
	if codec.Name() != "proto" {
		t.Errorf("codec name %q: servers expect the proto content-subtype", codec.Name())
	}
}

// buffers is m's encoding, in one buffer or cut in three.
func buffers(t *testing.T, m proto.Message, split bool) mem.BufferSlice {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if !split || len(b) < 3 {
		return mem.BufferSlice{mem.SliceBuffer(b)}
	}
	third := len(b) / 3
	return mem.BufferSlice{mem.SliceBuffer(b[:third]), mem.SliceBuffer(b[third : 2*third]), mem.SliceBuffer(b[2*third:])}
}
