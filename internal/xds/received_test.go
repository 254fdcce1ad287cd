package xds

import (
	"bytes"
	"fmt"
	"slices"
	"testing"

	clusterpb "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
)

// receivedCases are DeltaDiscoveryResponses as a control plane may send
// them, well or badly formed.
func receivedCases(t testing.TB) map[string][]byte {
	cluster := func(name string) *anypb.Any {
		a, err := anypb.New(&clusterpb.Cluster{Name: name, AltStatName: "x"})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	resp := func(rs ...*discoverypb.Resource) []byte {
		b, err := proto.Marshal(&discoverypb.DeltaDiscoveryResponse{TypeUrl: resourcev3.ClusterType, Nonce: "n",
			SystemVersionInfo: "v", Resources: rs})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	res := func(r *discoverypb.Resource) []byte { b, _ := proto.Marshal(r); return b }
	raw := func(fields ...[]byte) []byte { return bytes.Join(fields, nil) }
	bytesField := func(num protowire.Number, v []byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(nil, num, protowire.BytesType), v)
	}
	// long is field num with its tag and length in varints a byte longer
	// than they need be.
	long := func(num protowire.Number, v []byte) []byte {
		padded := func(b []byte, x uint64) []byte {
			b = protowire.AppendVarint(b, x)
			b[len(b)-1] |= 0x80
			return append(b, 0)
		}
		return append(padded(padded(nil, protowire.EncodeTag(num, protowire.BytesType)), uint64(len(v))), v...)
	}
	unknown := func(m proto.Message, fields ...[]byte) proto.Message {
		m.ProtoReflect().SetUnknown(raw(fields...))
		return m
	}
	varint := protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 7)
	group := raw(protowire.AppendTag(nil, 98, protowire.StartGroupType), varint, protowire.AppendTag(nil, 98, protowire.EndGroupType))
	a := cluster("c")
	anyBytes, _ := proto.Marshal(a)
	canonical := &discoverypb.Resource{Name: "c", Version: "1", Resource: a}
	ttl := durationpb.New(30e9)
	meta := &corepb.Metadata{FilterMetadata: map[string]*structpb.Struct{"f": {Fields: map[string]*structpb.Value{"k": structpb.NewStringValue("v")}}}}
	bad := &anypb.Any{TypeUrl: resourcev3.ClusterType, Value: []byte{0x0a, 0x05, 'x'}}
	return map[string][]byte{
		"empty":           nil,
		"canonical":       resp(canonical, &discoverypb.Resource{Name: "d", Version: "2", Resource: cluster("d")}),
		"aliases":         resp(&discoverypb.Resource{Name: "c", Version: "1", Resource: a, Aliases: []string{"a1", "", "a2"}}),
		"ttl":             resp(&discoverypb.Resource{Name: "c", Version: "1", Resource: a, Ttl: ttl, Aliases: []string{"x"}}),
		"zero ttl":        resp(&discoverypb.Resource{Name: "c", Version: "1", Resource: a, Ttl: &durationpb.Duration{}}),
		"negative ttl":    resp(&discoverypb.Resource{Name: "c", Version: "1", Resource: a, Ttl: &durationpb.Duration{Seconds: -1, Nanos: -5}}),
		"no version":      resp(&discoverypb.Resource{Name: "c", Resource: a}),
		"no version, ttl": resp(&discoverypb.Resource{Name: "c", Resource: a, Ttl: ttl}),
		"heartbeat":       resp(&discoverypb.Resource{Name: "c", Version: "1", Ttl: ttl}),
		"heartbeat with aliases": resp(&discoverypb.Resource{Name: "c", Version: "1", Ttl: ttl, Aliases: []string{"a"}},
			&discoverypb.Resource{Name: "d"}),
		"cache_control": resp(&discoverypb.Resource{Name: "c", Version: "1", Resource: a,
			CacheControl: &discoverypb.Resource_CacheControl{DoNotCache: true}}),
		"metadata and resource_name": resp(&discoverypb.Resource{Name: "c", Version: "1", Resource: a, Metadata: meta,
			ResourceName: &discoverypb.ResourceName{Name: "c"}}),
		"unknown fields": resp(unknown(&discoverypb.Resource{Name: "c", Version: "1", Resource: a}, varint, group).(*discoverypb.Resource),
			&discoverypb.Resource{Name: "d", Version: "1", Resource: unknown(cluster("d"), varint).(*anypb.Any)},
			&discoverypb.Resource{Name: "e", Version: "1", Resource: a, Ttl: unknown(durationpb.New(1e9), varint).(*durationpb.Duration)},
			&discoverypb.Resource{Name: "f", Version: "1", Ttl: unknown(durationpb.New(1e9), varint).(*durationpb.Duration)}),
		"unknown response fields": raw(resp(canonical), varint, group, bytesField(97, []byte("?")),
			protowire.AppendVarint(protowire.AppendTag(nil, deltaResources, protowire.VarintType), 1)),
		"everything else": func() []byte {
			b, _ := proto.Marshal(&discoverypb.DeltaDiscoveryResponse{TypeUrl: resourcev3.ClusterType, Nonce: "n",
				SystemVersionInfo: "v", Resources: []*discoverypb.Resource{canonical}, RemovedResources: []string{"r1", "r2"},
				RemovedResourceNames: []*discoverypb.ResourceName{{Name: "r1"}}, ControlPlane: &corepb.ControlPlane{Identifier: "cp"},
				ResourceErrors: []*discoverypb.ResourceError{{ResourceName: &discoverypb.ResourceName{Name: "x"},
					ErrorDetail: &status.Status{Code: 5, Message: "not found"}}}})
			return b
		}(),
		"reordered fields": bytesField(deltaResources, raw(bytesField(resName, []byte("c")), bytesField(resResource, anyBytes),
			bytesField(resVersion, []byte("1")))),
		"any value first": bytesField(deltaResources, raw(bytesField(resVersion, []byte("1")),
			bytesField(resResource, raw(bytesField(anyValue, a.Value), bytesField(anyTypeURL, []byte(a.TypeUrl)))),
			bytesField(resName, []byte("c")))),
		"non-minimal lengths": raw(long(deltaResources, raw(long(resVersion, []byte("1")), bytesField(resResource, anyBytes),
			bytesField(resName, []byte("c"))))),
		"empty strings sent": bytesField(deltaResources, raw(bytesField(resVersion, nil), bytesField(resResource, anyBytes),
			bytesField(resName, []byte("c")))),
		"name twice": bytesField(deltaResources, raw(bytesField(resVersion, []byte("1")), bytesField(resResource, anyBytes),
			bytesField(resName, []byte("c")), bytesField(resName, []byte("c2")))),
		"any twice (merged)": bytesField(deltaResources, raw(bytesField(resVersion, []byte("1")),
			bytesField(resResource, bytesField(anyTypeURL, []byte(a.TypeUrl))), bytesField(resResource, bytesField(anyValue, a.Value)),
			bytesField(resName, []byte("c")))),
		"empty any":       resp(&discoverypb.Resource{Name: "c", Version: "1", Resource: &anypb.Any{}}),
		"undecodable":     resp(&discoverypb.Resource{Name: "c", Version: "1", Resource: bad}),
		"unknown type":    resp(&discoverypb.Resource{Name: "c", Version: "1", Resource: &anypb.Any{TypeUrl: "type.googleapis.com/no.Such"}}),
		"no name":         resp(&discoverypb.Resource{Version: "1", Resource: a}),
		"invalid UTF-8":   bytesField(deltaResources, raw(bytesField(resResource, anyBytes), bytesField(resName, []byte("c\xff")))),
		"truncated":       resp(canonical)[:20],
		"end group":       raw(resp(canonical), protowire.AppendTag(nil, 5, protowire.EndGroupType)),
		"field number 0":  raw(resp(canonical), []byte{0x02, 0x00}),
		"field too large": raw(resp(canonical), protowire.AppendVarint(protowire.AppendVarint(nil, uint64(protowire.MaxValidNumber+1)<<3), 1)),
		"field too large inside": bytesField(deltaResources, raw(bytesField(resName, []byte("c")),
			protowire.AppendVarint(protowire.AppendVarint(nil, uint64(protowire.MaxValidNumber+1)<<3), 1))),
		"bad any inside": bytesField(deltaResources, raw(bytesField(resVersion, []byte("1")),
			bytesField(resResource, raw(bytesField(anyTypeURL, []byte(a.TypeUrl)), []byte{0x12, 0x7f})))),
		"resource body": res(canonical),
	}
}

// chunked splits b into buffers of n bytes, as gRPC receives frames, with
// empty buffers between them.
func chunked(b []byte, n int) mem.BufferSlice {
	var s mem.BufferSlice
	for len(b) > 0 {
		k := min(n, len(b))
		s = append(s, mem.SliceBuffer(b[:k:k]), mem.SliceBuffer(nil))
		b = b[k:]
	}
	return s
}

// sameAsProto decodes data (b in buffers) with Codec into a Received and
// reports how it differs from proto.Unmarshal of b, encoded by Encode and
// EncodeHeartbeat: whether it is accepted, the fields the relay uses, and
// the bytes the cache stores, or the error, of each resource.
func sameAsProto(b []byte, data mem.BufferSlice) error {
	var got Received
	gerr := Codec{}.Unmarshal(data, &got)
	want := new(discoverypb.DeltaDiscoveryResponse)
	werr := proto.Unmarshal(b, want)
	if (gerr == nil) != (werr == nil) {
		return fmt.Errorf("accepted differently: %v; proto.Unmarshal: %v", gerr, werr)
	}
	if gerr != nil {
		return nil
	}
	if got.SystemVersionInfo != want.GetSystemVersionInfo() || got.TypeURL != want.GetTypeUrl() || got.Nonce != want.GetNonce() ||
		!slices.Equal(got.RemovedResources, want.GetRemovedResources()) || got.Size != len(b) {
		return fmt.Errorf("header %+v, proto %v", got, want)
	}
	if !slices.EqualFunc(got.ResourceErrors, want.GetResourceErrors(), func(a, b *discoverypb.ResourceError) bool { return proto.Equal(a, b) }) {
		return fmt.Errorf("resource errors %v, proto %v", got.ResourceErrors, want.GetResourceErrors())
	}
	if len(got.Resources) != len(want.GetResources()) {
		return fmt.Errorf("%d resources, proto %d", len(got.Resources), len(want.GetResources()))
	}
	for i, w := range want.GetResources() {
		if err := sameResource(&got.Resources[i], w); err != nil {
			return fmt.Errorf("resource %d: %w", i, err)
		}
	}
	return nil
}

func sameResource(g *ReceivedResource, w *discoverypb.Resource) error {
	if g.Name != w.GetName() || g.Version != w.GetVersion() || g.TypeURL != w.GetResource().GetTypeUrl() ||
		g.Heartbeat != (w.GetResource() == nil) {
		return fmt.Errorf("read %q %q %q heartbeat %v, proto %v", g.Name, g.Version, g.TypeURL, g.Heartbeat, w)
	}
	if g.Heartbeat {
		gh, gerr := g.EncodeHeartbeat()
		wh, werr := EncodeHeartbeat(w.GetName(), w.GetVersion(), w.GetTtl())
		if err := sameError(gerr, werr); err != nil || gerr != nil {
			return err
		}
		if gh.Name != wh.Name || gh.Version != wh.Version || gh.TTL != wh.TTL || !bytes.Equal(gh.Wire, wh.Wire) || !bytes.Equal(gh.SotW, wh.SotW) {
			return fmt.Errorf("heartbeat %+v, Encode %+v", gh, wh)
		}
		return nil
	}
	gr, gerr := g.Encode()
	wr, werr := Encode(w.GetName(), w.GetVersion(), w.GetResource(), w.GetTtl(), w.GetAliases())
	if err := sameError(gerr, werr); err != nil || gerr != nil {
		return err
	}
	return sameEncoding(gr, wr)
}

func sameError(got, want error) error {
	if (got == nil) != (want == nil) || got != nil && got.Error() != want.Error() {
		return fmt.Errorf("error %v, Encode's %v", got, want)
	}
	return nil
}

// sameEncoding compares every field of two Resources, byte for byte.
func sameEncoding(got, want *Resource) error {
	if got.Name != want.Name || got.Version != want.Version || got.TTL != want.TTL || !slices.Equal(got.Aliases, want.Aliases) {
		return fmt.Errorf("%q %q %v %q, Encode %q %q %v %q", got.Name, got.Version, got.TTL, got.Aliases,
			want.Name, want.Version, want.TTL, want.Aliases)
	}
	for _, f := range []struct {
		name      string
		got, want []byte
	}{
		{"Wire", got.Wire, want.Wire}, {"Any", got.Any, want.Any},
		{"WireNoTTL", got.WireNoTTL, want.WireNoTTL}, {"SotWWrapped", got.SotWWrapped, want.SotWWrapped},
	} {
		if !bytes.Equal(f.got, f.want) || (f.got == nil) != (f.want == nil) {
			return fmt.Errorf("%s %x, Encode %x", f.name, f.got, f.want)
		}
	}
	return nil
}

// What the relay reads and stores of a received response is what it did
// when gRPC decoded it with proto.Unmarshal and the relay encoded each
// resource with Encode, byte for byte, errors included: in one buffer or
// spread over many, for well-formed responses (TTLs, aliases, heartbeats,
// cache_control, metadata, unknown fields, resource_errors…) and malformed
// ones.
func TestReceivedIsWhatEncodeGives(t *testing.T) {
	for name, b := range receivedCases(t) {
		for _, n := range []int{1, 3, 16, max(len(b), 1)} {
			if err := sameAsProto(b, chunked(b, n)); err != nil {
				t.Errorf("%s, buffers of %d: %v", name, n, err)
			}
		}
	}
}

// A resource received as Encode would write it is stored as received: its
// delta encoding is its own copy out of the frames, its SotW Any a slice
// of it.
func TestReceivedResourceIsNotCopied(t *testing.T) {
	a, _ := anypb.New(&clusterpb.Cluster{Name: "c", AltStatName: string(make([]byte, 1000))})
	b, _ := proto.Marshal(&discoverypb.DeltaDiscoveryResponse{TypeUrl: resourcev3.ClusterType,
		Resources: []*discoverypb.Resource{{Name: "c", Version: "1", Resource: a, Aliases: []string{"x"}}}})
	var r Received
	if err := (Codec{}).Unmarshal(chunked(b, 100), &r); err != nil {
		t.Fatal(err)
	}
	field := r.Resources[0].field
	enc, err := r.Resources[0].Encode()
	if err != nil {
		t.Fatal(err)
	}
	if &enc.Wire[0] != &field[0] || len(enc.Wire) != len(field) {
		t.Error("the delta encoding is a copy of the received bytes")
	}
	if i := bytes.Index(enc.Wire, enc.Any); i < 0 || &enc.Wire[i] != &enc.Any[0] {
		t.Error("the Any is not a slice of the delta encoding")
	}
	if cap(enc.Any) != len(enc.Any) {
		t.Error("the shared Any may be appended to")
	}
}
