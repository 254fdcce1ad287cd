package downstream

import (
	"testing"
	"time"

	clusterpb "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// statusOf is what the server's one stream records of name of typeURL.
func statusOf(t *testing.T, s *Server, typeURL, name string) (ResourceStatus, bool) {
	t.Helper()
	for _, c := range s.Clients(nil) {
		for _, ts := range c.Types {
			if ts.TypeURL != typeURL {
				continue
			}
			for _, r := range ts.Resources {
				if r.Name == name {
					return r, true
				}
			}
		}
	}
	return ResourceStatus{}, false
}

// A flush that moves no version moves no record (flushcore.go): a
// heartbeat refreshes the TTL of what the client has ("TTL"), so the
// status of the resource stays what the client's last answer made it, on
// SotW, where a Cluster's heartbeat goes out as the type's complete state,
// as on delta.
func TestHeartbeatMovesNoRecord(t *testing.T) {
	const cds = resourcev3.ClusterType
	ttl := durationpb.New(time.Hour)
	a, err := anypb.New(&clusterpb.Cluster{Name: "a"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := xds.Encode("a", "1", a, ttl, nil)
	if err != nil {
		t.Fatal(err)
	}
	hb, err := xds.EncodeHeartbeat("a", "1", ttl)
	if err != nil {
		t.Fatal(err)
	}
	node := &corepb.Node{Id: "n1", Cluster: "c1", ClientFeatures: []string{featureResourceTTL, featureResourceInSotW}}
	for _, variant := range []string{"sotw", "delta"} {
		t.Run(variant, func(t *testing.T) {
			c := cache.New(cache.Options{})
			s, cc := serveOn(t, Options{Groups: oneGroup{c}})
			ads := discoverypb.NewAggregatedDiscoveryServiceClient(cc)
			// beat reads a response; it reports whether that response is the
			// heartbeat, not the resource.
			var recv func() (beat bool)
			if variant == "sotw" {
				st := openStream(t, ads.StreamAggregatedResources)
				st.send(&discoverypb.DiscoveryRequest{Node: node, TypeUrl: cds, ResourceNames: []string{"a"}})
				watched(t, c, cds, "a")
				recv = func() bool {
					resp := st.recv()
					w := &discoverypb.Resource{}
					if len(resp.GetResources()) != 1 || resp.GetResources()[0].UnmarshalTo(w) != nil {
						t.Fatalf("response: %v, want a in a Resource", resp)
					}
					st.send(&discoverypb.DiscoveryRequest{TypeUrl: cds, ResourceNames: []string{"a"},
						VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()})
					return w.GetResource() == nil
				}
			} else {
				st := openStream(t, ads.DeltaAggregatedResources)
				st.send(&discoverypb.DeltaDiscoveryRequest{Node: node, TypeUrl: cds, ResourceNamesSubscribe: []string{"a"}})
				watched(t, c, cds, "a")
				recv = func() bool {
					resp := st.recv()
					if len(resp.GetResources()) != 1 {
						t.Fatalf("response: %v, want a", resp)
					}
					st.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: cds, ResponseNonce: resp.GetNonce()})
					return resp.GetResources()[0].GetResource() == nil
				}
			}
			start := time.Now()
			c.Apply(cds, cache.Change{Upserts: []*cache.Resource{res}, Synced: true})
			if recv() {
				t.Fatal("the first response is a heartbeat")
			}
			var acked ResourceStatus
			eventually(t, "a to be ACKed", func() bool {
				r, ok := statusOf(t, s, cds, "a")
				acked = r
				return ok && r.State == Acked
			})
			if acked.Sent.Before(start) || acked.Version != "1" {
				t.Fatalf("a as sent: %+v, want version 1 sent after %v", acked, start)
			}
			c.Apply(cds, cache.Change{Heartbeats: []*cache.Heartbeat{hb}})
			// The status is recorded before the response goes out.
			if !recv() {
				t.Fatal("the heartbeat went out as the resource")
			}
			if r, _ := statusOf(t, s, cds, "a"); r != acked {
				t.Fatalf("after a heartbeat: %+v, want it as the ACK left it: %+v", r, acked)
			}
		})
	}
}
