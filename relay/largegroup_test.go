package relay

import (
	"fmt"
	"testing"
	"time"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// A group subscribed to 100,000 names comes back after a control-plane
// restart: its resume (a version for every cached name, about 9 MB) is split
// into requests under the control plane's default 4 MiB receive limit, and
// the change made during the outage reaches the client.
func TestLargeGroupResumesAfterControlPlaneRestart(t *testing.T) {
	const n = 100000
	cp := testcp.Start(t) // go-control-plane at gRPC's default receive limit
	names := make([]string, n)
	snapshot := func(changed string) []types.Resource {
		rs := make([]types.Resource, n)
		for i := range names {
			names[i] = fmt.Sprintf("cla-%06d", i)
			rs[i] = testcp.Endpoints(names[i])
		}
		if changed != "" {
			rs[7] = testcp.Endpoints(names[7], changed)
		}
		return rs
	}
	cp.Set(t, "big", "1", snapshot("")...)
	r := startRelay(t, cp.Addr, func(c *Config) {
		c.Cache.MaxResources = 0
		c.Upstream.ReconnectBaseDelay, c.Upstream.ReconnectMaxDelay = 50*time.Millisecond, 200*time.Millisecond
	})
	// The first response holds every resource: like Envoy, the client takes
	// messages larger than gRPC's default 4 MiB.
	big := grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(256 << 20))
	cc, err := grpc.NewClient(r.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()), big)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	s := newStream(t, discoverypb.NewAggregatedDiscoveryServiceClient(cc).DeltaAggregatedResources)
	s.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "big"), TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: names})
	for got := 0; got < n; {
		got += len(s.recvWithin(5 * time.Minute).GetResources()) // a large load, slow under -race
	}
	streams := cp.DeltaStreams.Load()

	cp.Stop()
	cp.Set(t, "big", "2", snapshot("127.0.0.1:7")...)
	cp.Restart()
	resp := s.recvWithin(5 * time.Minute)
	if got := deltaNames(resp); len(got) != 1 || got[0] != names[7] {
		t.Fatalf("after the restart: %d resources (%.5v), want only %s", len(got), got, names[7])
	}
	if cp.DeltaStreams.Load() != streams+1 {
		t.Errorf("%d upstream streams after the restart, want one more than %d", cp.DeltaStreams.Load(), streams)
	}
}
