package xds

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	clusterpb "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerpb "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	hcmpb "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// An Any of a type the binary does not link, at any depth (here inside a
// linked Any), is printed raw: its type URL and its bytes in base64; the
// rest of the message as protojson; the message itself unchanged.
func TestMarshalJSONPrintsUnknownAnysRaw(t *testing.T) {
	unknown := &anypb.Any{TypeUrl: "type.googleapis.com/example.v3.Unknown", Value: []byte{1, 2, 3}}
	hcm, err := anypb.New(&hcmpb.HttpConnectionManager{StatPrefix: "edge", HttpFilters: []*hcmpb.HttpFilter{
		{Name: "example", ConfigType: &hcmpb.HttpFilter_TypedConfig{TypedConfig: unknown}}}})
	if err != nil {
		t.Fatal(err)
	}
	l := &listenerpb.Listener{Name: "edge", FilterChains: []*listenerpb.FilterChain{{Filters: []*listenerpb.Filter{
		{Name: "hcm", ConfigType: &listenerpb.Filter_TypedConfig{TypedConfig: hcm}}}}}}
	a, err := anypb.New(l)
	if err != nil {
		t.Fatal(err)
	}
	before := proto.Clone(a)
	b, err := MarshalJSON(a)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"name":"edge"`, `"statPrefix":"edge"`, `"typedConfig":{"@type":"type.googleapis.com/example.v3.Unknown","value":"AQID"}`} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("%s lacks %s", buf.String(), want)
		}
	}
	if !proto.Equal(a, before) {
		t.Error("MarshalJSON changed the message")
	}
}

// An unlinked Any as a map value is printed raw too; a linked Any whose
// bytes do not decode is an error, not a message printed in part.
func TestMarshalJSONMapsAndUndecodableAnys(t *testing.T) {
	unknown := &anypb.Any{TypeUrl: "type.googleapis.com/example.v3.Options", Value: []byte{1, 2, 3}}
	c := &clusterpb.Cluster{Name: "app", TypedExtensionProtocolOptions: map[string]*anypb.Any{"example.options": unknown}}
	b, err := MarshalJSON(c)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		t.Fatal(err)
	}
	if want := `"example.options":{"@type":"type.googleapis.com/example.v3.Options","value":"AQID"}`; !strings.Contains(buf.String(), want) {
		t.Errorf("%s lacks %s", buf.String(), want)
	}

	broken := &anypb.Any{TypeUrl: "type.googleapis.com/envoy.config.cluster.v3.Cluster", Value: []byte{0xff}}
	if b, err := MarshalJSON(&clusterpb.Cluster{Name: "app", TypedExtensionProtocolOptions: map[string]*anypb.Any{"x": broken}}); err == nil {
		t.Errorf("an Any that does not decode: no error, %s", b)
	}
}
