package downstream

import (
	"slices"
	"testing"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	matcherpb "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

func TestNodeFilter(t *testing.T) {
	id := func(m *matcherpb.StringMatcher) *matcherpb.NodeMatcher { return &matcherpb.NodeMatcher{NodeId: m} }
	exact := func(s string) *matcherpb.StringMatcher {
		return &matcherpb.StringMatcher{MatchPattern: &matcherpb.StringMatcher_Exact{Exact: s}}
	}
	suffix := &matcherpb.StringMatcher{MatchPattern: &matcherpb.StringMatcher_Suffix{Suffix: "-B"}, IgnoreCase: true}
	contains := &matcherpb.StringMatcher{MatchPattern: &matcherpb.StringMatcher_Contains{Contains: "ide"}}
	prefixCase := &matcherpb.StringMatcher{MatchPattern: &matcherpb.StringMatcher_Prefix{Prefix: "Side"}}
	nodes := []string{"sidecar-a", "sidecar-b", "gateway-b", "Sidecar-c"}
	cases := []struct {
		name     string
		matchers []*matcherpb.NodeMatcher
		want     []string
		wantErr  bool
	}{
		{name: "no matchers keeps every node", want: nodes},
		{name: "exact", matchers: []*matcherpb.NodeMatcher{id(exact("sidecar-b"))}, want: []string{"sidecar-b"}},
		{name: "suffix, ignoring case", matchers: []*matcherpb.NodeMatcher{id(suffix)}, want: []string{"sidecar-b", "gateway-b"}},
		{name: "contains", matchers: []*matcherpb.NodeMatcher{id(contains)}, want: []string{"sidecar-a", "sidecar-b", "Sidecar-c"}},
		{name: "prefix, minding case", matchers: []*matcherpb.NodeMatcher{id(prefixCase)}, want: []string{"Sidecar-c"}},
		{name: "any of several", matchers: []*matcherpb.NodeMatcher{id(exact("gateway-b")), id(exact("sidecar-a"))},
			want: []string{"sidecar-a", "gateway-b"}},
		{name: "no node_id", matchers: []*matcherpb.NodeMatcher{{}}, wantErr: true},
		{name: "metadata", matchers: []*matcherpb.NodeMatcher{{NodeId: exact("x"),
			NodeMetadatas: []*matcherpb.StructMatcher{{Value: &matcherpb.ValueMatcher{MatchPattern: &matcherpb.ValueMatcher_NullMatch_{}}}}}},
			wantErr: true},
		{name: "regex", matchers: []*matcherpb.NodeMatcher{id(&matcherpb.StringMatcher{
			MatchPattern: &matcherpb.StringMatcher_SafeRegex{SafeRegex: &matcherpb.RegexMatcher{Regex: ".*"}}})}, wantErr: true},
	}
	for _, tc := range cases {
		keep, err := nodeFilter(tc.matchers)
		if tc.wantErr {
			if status.Code(err) != codes.InvalidArgument {
				t.Errorf("%s: %v, want INVALID_ARGUMENT", tc.name, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		var got []string
		for _, n := range nodes {
			if keep == nil || keep(&corepb.Node{Id: n, Metadata: &structpb.Struct{}}) {
				got = append(got, n)
			}
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: kept %v, want %v", tc.name, got, tc.want)
		}
	}
}
