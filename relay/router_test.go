package relay

import (
	"slices"
	"testing"
	"time"

	tlspb "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/xdsrelay/xdsrelay/internal/faultproxy"
	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// groupUpstreams lists the upstreams group key has a stream to, from
// /debug/groups.
func groupUpstreams(t *testing.T, r *Relay, key string) []string {
	t.Helper()
	var groups []debugGroup
	getJSON(t, r, "/debug/groups", &groups)
	var out []string
	for _, g := range groups {
		if g.Key != key {
			continue
		}
		for _, u := range g.Upstreams {
			out = append(out, u.Name)
		}
	}
	return out
}

// A group opens its stream to an upstream when the first name routed there
// is subscribed, and closes it once nothing routed there is wanted, after
// cache.retention; the other upstream's stream is untouched.
func TestUpstreamStreamOpensAndClosesWithInterest(t *testing.T) {
	def, secrets := testcp.Start(t), testcp.Start(t)
	def.Set(t, "c1", "1", testcp.Cluster("a"))
	secrets.Set(t, "c1", "1", &tlspb.Secret{Name: "cert"})
	r := startRelay(t, def.Addr, withUpstream("secrets", secrets.Addr, []string{resourcev3.SecretType}, nil),
		func(c *Config) { c.Cache.Retention = 200 * time.Millisecond })

	s := openDelta(t, r.Addr())
	s.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "c1"), TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"a"}})
	s.recv()
	if got := groupUpstreams(t, r, keyOf("c1")); !slices.Equal(got, []string{"default"}) || secrets.DeltaStreams.Load() != 0 {
		t.Fatalf("before a secret is asked for: upstreams %v, secrets streams %d", got, secrets.DeltaStreams.Load())
	}
	s.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.SecretType, ResourceNamesSubscribe: []string{"cert"}})
	if resp := s.recv(); deltaNames(resp)[0] != "cert" {
		t.Fatalf("secret: %v", deltaNames(resp))
	}
	if got := groupUpstreams(t, r, keyOf("c1")); !slices.Equal(got, []string{"default", "secrets"}) {
		t.Fatalf("with a secret: upstreams %v", got)
	}
	s.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.SecretType, ResourceNamesUnsubscribe: []string{"cert"}})
	eventually(t, "the stream to the secrets control plane to close", func() bool {
		return slices.Equal(groupUpstreams(t, r, keyOf("c1")), []string{"default"})
	})
	if n := secrets.DeltaStreams.Load(); n != 1 {
		t.Errorf("secrets control plane saw %d streams, want 1", n)
	}
	if n := def.DeltaStreams.Load(); n != 1 {
		t.Errorf("default control plane saw %d streams, want 1 (untouched)", n)
	}
}

// A member feed is stopped by cancelling its context and waiting for it,
// with no bound of its own (docs/architecture.md, "Every wait has a
// bound"): cancellation is enough, also when its upstream has gone silent
// with the stream open, a half-open connection that answers nothing.
func TestStreamToASilentUpstreamClosesWithInterest(t *testing.T) {
	def, secrets := testcp.Start(t), testcp.Start(t)
	secrets.Set(t, "c1", "1", &tlspb.Secret{Name: "cert"})
	proxy := startProxy(t, secrets.Addr)
	r := startRelay(t, def.Addr, withUpstream("secrets", proxy.Addr, []string{resourcev3.SecretType}, nil),
		func(c *Config) { c.Cache.Retention = 200 * time.Millisecond })
	s := openDelta(t, r.Addr())
	s.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "c1"), TypeUrl: resourcev3.SecretType, ResourceNamesSubscribe: []string{"cert"}})
	if resp := s.recv(); deltaNames(resp)[0] != "cert" {
		t.Fatalf("secret: %v", deltaNames(resp))
	}
	proxy.Set(faultproxy.Silent, 0)
	s.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.SecretType, ResourceNamesUnsubscribe: []string{"cert"}})
	eventually(t, "the stream to the silent secrets control plane to close", func() bool {
		return !slices.Contains(groupUpstreams(t, r, keyOf("c1")), "secrets")
	})
}
