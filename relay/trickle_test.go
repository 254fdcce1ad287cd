package relay

import (
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	clusterpb "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlspb "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/xdsrelay/xdsrelay/internal/faultproxy"
	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// largeCluster is Cluster "large", made about size bytes by its metadata.
func largeCluster(size int) *clusterpb.Cluster {
	blob, _ := structpb.NewStruct(map[string]any{"blob": strings.Repeat("x", size)})
	large := testcp.Cluster("large")
	large.Metadata = &corepb.Metadata{FilterMetadata: map[string]*structpb.Struct{"test": blob}}
	return large
}

// A large response trickling over a slow link to the control plane holds
// up no other group and no other upstream: the other group's changes
// arrive within seconds while the large one would take minutes, its
// clients are served from the cache meanwhile, and the same group's
// names of another upstream arrive at once.
func TestTricklingResponseHoldsUpNoOtherGroup(t *testing.T) {
	t.Parallel()
	const (
		rate = 64 << 10 // bytes a second, the link's
		big  = 50 << 20 // group big's response: 13 minutes at the link's rate
	)
	cp := testcp.Start(t)
	proxy := startProxy(t, cp.Addr)
	cp.Set(t, "big", "1", largeCluster(big))
	cp.Set(t, "small", "1", testcp.Cluster("s1"))
	secrets := testcp.Start(t)
	secrets.Set(t, "big", "1", &tlspb.Secret{Name: "key"})
	r := startRelay(t, proxy.Addr, withUpstream("secrets", secrets.Addr, []string{"secrets"}, nil))

	small := openDelta(t, r.Addr())
	small.send(&discoverypb.DeltaDiscoveryRequest{Node: node("small-1", "small"), TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"*"}})
	deltaUntil(t, small, "", wait, func(got, _ []string, _ map[string]codes.Code) bool { return slices.Contains(got, "s1") })

	proxy.Set(faultproxy.Trickle, rate)
	bigClient := openDelta(t, r.Addr())
	bigClient.send(&discoverypb.DeltaDiscoveryRequest{Node: node("big-1", "big"), TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"*"}})
	time.Sleep(5 * time.Second) // the large response is on its way

	// The other group's change arrives while the large response trickles.
	start := time.Now()
	cp.Set(t, "small", "2", testcp.Cluster("s1"), testcp.Cluster("s2"))
	deltaUntil(t, small, "", 30*time.Second, func(got, _ []string, _ map[string]codes.Code) bool { return slices.Contains(got, "s2") })
	took := time.Since(start)
	t.Logf("the other group's change arrived after %v over a %d KiB/s link carrying a %d MiB response", took, rate>>10, big>>20)
	if took > 10*time.Second {
		t.Errorf("the other group's change took %v", took)
	}
	// A new client of the other group is served from the cache at once.
	late := openDelta(t, r.Addr())
	late.send(&discoverypb.DeltaDiscoveryRequest{Node: node("small-2", "small"), TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"*"}})
	deltaUntil(t, late, "", 5*time.Second, func(got, _ []string, _ map[string]codes.Code) bool {
		return slices.Contains(got, "s1") && slices.Contains(got, "s2")
	})
	// The big group's names of another upstream arrive at once.
	sec := openDelta(t, r.Addr())
	sec.send(&discoverypb.DeltaDiscoveryRequest{Node: node("big-2", "big"), TypeUrl: resourcev3.SecretType, ResourceNamesSubscribe: []string{"key"}})
	deltaUntil(t, sec, "", 5*time.Second, func(got, _ []string, _ map[string]codes.Code) bool { return slices.Contains(got, "key") })
	select {
	case <-bigClient.resps:
		t.Fatal("the large response arrived: the link did not trickle")
	default:
	}
}

// A response that stops arriving half-way (the link goes silent while it
// trickles) is a stream making no progress: the keepalive bound
// (keepalive.time + keepalive.timeout) ends its connection, the stream is
// opened again, and once the link carries bytes again the response
// arrives whole on the new stream; the client never hears of a removal.
func TestStalledResponseIsRetried(t *testing.T) {
	t.Parallel()
	const (
		rate = 64 << 10 // bytes a second
		size = 3 << 20  // 48 s at the link's rate (under a test client's 4 MiB)
	)
	cp := testcp.Start(t)
	proxy := startProxy(t, cp.Addr)
	cp.Set(t, "g", "1", largeCluster(size))
	r := startRelay(t, proxy.Addr, fastReconnect, func(c *Config) {
		c.Upstream.KeepaliveTime, c.Upstream.KeepaliveTimeout = 10*time.Second, 2*time.Second
		c.Upstream.ConnectTimeout = 2 * time.Second
	})

	proxy.Set(faultproxy.Trickle, rate)
	client := openDelta(t, r.Addr())
	client.send(&discoverypb.DeltaDiscoveryRequest{Node: node("g-1", "g"), TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"*"}})
	time.Sleep(3 * time.Second) // the response is on its way
	proxy.Set(faultproxy.Silent, 0)
	stalled := time.Now()
	reconnected := regexp.MustCompile(`(?m)^xdsrelay_upstream_reconnects_total\{group="[^"]*"\} [1-9]`)
	eventuallyWithin(t, faultWait, "the stalled stream to be ended and opened again", func() bool {
		return reconnected.MatchString(getMetrics(t, r))
	})
	t.Logf("the stalled stream was ended %v after the link went silent", time.Since(stalled).Round(100*time.Millisecond))
	select {
	case resp := <-client.resps:
		t.Fatalf("a response before the link carried bytes again: %v", deltaNames(resp))
	default:
	}
	proxy.Set(faultproxy.Pass, 0)
	deltaUntil(t, client, "large", faultWait, func(got, _ []string, _ map[string]codes.Code) bool { return slices.Contains(got, "large") })
}
