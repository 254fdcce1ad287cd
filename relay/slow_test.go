package relay

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// bigClusters are n clusters of about 64 KiB each, at a version.
func bigClusters(n, version int) []types.Resource {
	pad := strings.Repeat("x", 64<<10)
	var out []types.Resource
	for i := range n {
		c := testcp.Cluster(fmt.Sprint("big-", i))
		md, _ := structpb.NewStruct(map[string]any{"pad": pad, "v": version})
		c.Metadata = &corepb.Metadata{FilterMetadata: map[string]*structpb.Struct{"test": md}}
		out = append(out, c)
	}
	return out
}

// readsEveryUpdate subscribes good, a SotW ADS stream of group c1, to the
// clusters, then has the control plane publish n new versions of
// bigClusters and checks that good gets each, ACKing as it goes.
func readsEveryUpdate(t *testing.T, cp *testcp.ControlPlane, good *sotwStream, n int) {
	t.Helper()
	good.send(&discoverypb.DiscoveryRequest{Node: node("good", "c1"), TypeUrl: resourcev3.ClusterType})
	resp := good.recv()
	for v := 1; v <= n; v++ {
		good.send(&discoverypb.DiscoveryRequest{TypeUrl: resourcev3.ClusterType, VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()})
		cp.Set(t, "c1", fmt.Sprint(v), bigClusters(8, v)...)
		resp = good.recv()
		if got := len(resp.GetResources()); got != 8 {
			t.Fatalf("update %d: the reading client got %d clusters", v, got)
		}
	}
}

// A client that stops reading hurts only itself: the others keep getting
// every update, and once a send to it has been blocked for
// downstream.send_timeout its stream is closed.
func TestStuckClientIsDisconnected(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "0", bigClusters(8, 0)...)
	r := startRelay(t, cp.Addr, func(c *Config) { c.Downstream.SendTimeout = 300 * time.Millisecond })

	// The stuck client: a small fixed window, and it never reads.
	cc, err := grpc.NewClient(r.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stuck, err := discoverypb.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stuck.Send(&discoverypb.DiscoveryRequest{Node: node("stuck", "c1"), TypeUrl: resourcev3.ClusterType}); err != nil {
		t.Fatal(err)
	}

	readsEveryUpdate(t, cp, openSotW(t, r.Addr()), 5)
	eventually(t, "the stuck client to be disconnected", func() bool {
		return strings.Contains(getMetrics(t, r), "xdsrelay_downstream_stuck_total 1")
	})
	// Its connection is closed: once it reads what was buffered, its
	// stream ends, UNAVAILABLE.
	for {
		if _, err := stuck.Recv(); err != nil {
			if status.Code(err) != codes.Unavailable {
				t.Errorf("the stuck stream ended with %v, want UNAVAILABLE", err)
			}
			break
		}
	}
	eventually(t, "the stuck stream to be gone from the gauge", func() bool {
		return strings.Contains(getMetrics(t, r), `xdsrelay_downstream_streams{variant="sotw-ads"} 1`)
	})
}
