package xds

import (
	"bytes"
	"testing"

	clusterpb "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/anypb"
)

// A resource without TTL is held once: its delta encoding is what
// proto.Marshal gives, and its SotW Any field is a slice of the same bytes.
func TestEncodeSharesTheAny(t *testing.T) {
	for _, tc := range []struct {
		name, version string
		aliases       []string
	}{
		{"c", "1", nil},
		{"cluster-with-a-longer-name", "v2", []string{"a", "", "b"}},
	} {
		a, _ := anypb.New(&clusterpb.Cluster{Name: tc.name, AltStatName: string(make([]byte, 300))})
		r, err := Encode(tc.name, tc.version, a, nil, tc.aliases)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := marshal.Marshal(&discoverypb.Resource{Name: tc.name, Version: r.Version, Resource: a, Aliases: tc.aliases})
		want = protowire.AppendBytes(protowire.AppendTag(nil, deltaResources, protowire.BytesType), want)
		anyBytes, _ := marshal.Marshal(a)
		wantAny := protowire.AppendBytes(protowire.AppendTag(nil, sotwResources, protowire.BytesType), anyBytes)
		if !bytes.Equal(r.Wire, want) || !bytes.Equal(r.Any, wantAny) {
			t.Errorf("%s: encodings differ from proto.Marshal's", tc.name)
		}
		if i := bytes.Index(r.Wire, r.Any); i < 0 || &r.Wire[i] != &r.Any[0] {
			t.Errorf("%s: the Any is not a slice of the delta encoding", tc.name)
		}
		if cap(r.Any) != len(r.Any) {
			t.Errorf("%s: the shared Any may be appended to", tc.name)
		}
	}
}
