package xds

import (
	"math/rand/v2"
	"testing"

	listenerpb "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routepb "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmpb "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// validationCorpus is resources of several shapes: nested messages,
// repeated and packed fields, maps, strings, nested Anys.
func validationCorpus(t *testing.T) []*anypb.Any {
	t.Helper()
	hcm, err := anypb.New(&hcmpb.HttpConnectionManager{
		StatPrefix: "ingress",
		RouteSpecifier: &hcmpb.HttpConnectionManager_RouteConfig{RouteConfig: &routepb.RouteConfiguration{
			Name: "local", VirtualHosts: []*routepb.VirtualHost{{Name: "vh", Domains: []string{"*", "example.com"}}},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	msgs := []proto.Message{
		benchCLA("cla-0", 20),
		benchCluster("cluster-0"),
		&listenerpb.Listener{Name: "listener-0", FilterChains: []*listenerpb.FilterChain{{
			Filters: []*listenerpb.Filter{{Name: "hcm", ConfigType: &listenerpb.Filter_TypedConfig{TypedConfig: hcm}}},
		}}},
		&routepb.RouteConfiguration{Name: "route-0", RequestHeadersToRemove: []string{"x-a", "x-b"},
			VirtualHosts: []*routepb.VirtualHost{{Name: "vh", Domains: []string{"*"},
				TypedPerFilterConfig: map[string]*anypb.Any{"f": hcm}}}},
	}
	var out []*anypb.Any
	for _, m := range msgs {
		a, err := anypb.New(m)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, a)
	}
	return out
}

// validate accepts and rejects exactly what proto.Unmarshal does, on real
// resources and on many corruptions of them (bytes flipped, cut, inserted).
func TestValidateAgreesWithUnmarshal(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	accepted, rejected := 0, 0
	for _, a := range validationCorpus(t) {
		check := func(what string, value []byte) {
			t.Helper()
			mutated := &anypb.Any{TypeUrl: a.GetTypeUrl(), Value: value}
			_, uerr := mutated.UnmarshalNew()
			verr := validate(mutated)
			if (uerr == nil) != (verr == nil) {
				t.Fatalf("%s %s (%x): proto.Unmarshal: %v; validate: %v", a.GetTypeUrl(), what, value, uerr, verr)
			}
			if uerr == nil {
				accepted++
			} else {
				rejected++
			}
		}
		check("as sent", a.GetValue())
		for range 3000 {
			v := append([]byte(nil), a.GetValue()...)
			switch rng.IntN(4) {
			case 0:
				v[rng.IntN(len(v))] = byte(rng.UintN(256))
			case 1:
				v = v[:rng.IntN(len(v))]
			case 2:
				i := rng.IntN(len(v) + 1)
				v = append(v[:i], append([]byte{byte(rng.UintN(256))}, v[i:]...)...)
			case 3:
				v[rng.IntN(len(v))] ^= 0x80 // a high bit: varints, lengths, UTF-8
			}
			check("mutated", v)
		}
	}
	if accepted == 0 || rejected == 0 {
		t.Errorf("accepted %d, rejected %d: the corruptions should give both", accepted, rejected)
	}
	t.Logf("accepted %d, rejected %d", accepted, rejected)
}

func TestValidateRejectsUnknownType(t *testing.T) {
	if err := validate(&anypb.Any{TypeUrl: "type.googleapis.com/no.such.Type"}); err == nil {
		t.Error("an unknown type was accepted")
	}
}
