package relay

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// Clients that stop reading, more of them than the send pool has workers,
// do not hold back the others: each blocked send is counted out of the pool
// after a moment and another worker takes its place. The send timeout is a
// minute, far past the wait of the reading client's recv: without the
// replacement workers its updates would wait for it.
func TestStuckClientsDoNotHoldTheSendPool(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "0", bigClusters(8, 0)...)
	r := startRelay(t, cp.Addr, func(c *Config) { c.Downstream.SendTimeout = time.Minute })

	stuck := 3*runtime.GOMAXPROCS(0) + 2
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := range stuck {
		cc, err := grpc.NewClient(r.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		st, err := discoverypb.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(&discoverypb.DiscoveryRequest{Node: node(fmt.Sprint("stuck-", i), "c1"), TypeUrl: resourcev3.ClusterType}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "every stuck stream to be open", func() bool {
		return strings.Contains(getMetrics(t, r), fmt.Sprintf(`xdsrelay_downstream_streams{variant="sotw-ads"} %d`, stuck))
	})

	readsEveryUpdate(t, cp, openSotW(t, r.Addr()), 3)
	if strings.Contains(getMetrics(t, r), "xdsrelay_downstream_stuck_total 1") {
		t.Fatal("a stuck client was disconnected before downstream.send_timeout")
	}
}

// A stream whose client stops reading it holds up neither the other
// streams of its connection: the connection's other streams are served by
// another worker while the stuck send waits for downstream.send_timeout.
// The stuck stream subscribes first, so that a change queues it first.
func TestStuckStreamDoesNotHoldItsConnection(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "0", bigClusters(8, 0)...)
	r := startRelay(t, cp.Addr, func(c *Config) { c.Downstream.SendTimeout = time.Minute })
	cc, err := grpc.NewClient(r.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(16<<20))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ads := discoverypb.NewAggregatedDiscoveryServiceClient(cc)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stuck, err := ads.StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stuck.Send(&discoverypb.DiscoveryRequest{Node: node("stuck", "c1"), TypeUrl: resourcev3.ClusterType}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the stuck stream to be open", func() bool {
		return strings.Contains(getMetrics(t, r), `xdsrelay_downstream_streams{variant="sotw-ads"} 1`)
	})
	readsEveryUpdate(t, cp, newStream(t, ads.StreamAggregatedResources), 3)
}

// An idle stream holds one goroutine of the relay's own, its gRPC handler
// reading the next request: streams that share a connection cost one
// goroutine each, plus gRPC's three for the connection.
func TestIdleStreamHoldsOneGoroutine(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("x"))
	r := startRelay(t, cp.Addr)
	cc := dial(t, r.Addr())
	const n = 20
	for i := range n {
		st := newStream(t, discoverypb.NewAggregatedDiscoveryServiceClient(cc).DeltaAggregatedResources)
		st.send(&discoverypb.DeltaDiscoveryRequest{Node: node(fmt.Sprint("n", i), "c1"), TypeUrl: resourcev3.ClusterType})
		resp := st.recv()
		st.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResponseNonce: resp.GetNonce()})
	}
	// Every stream has had its response and sent its ACK; the send
	// workers end once nothing is queued.
	eventually(t, "one relay goroutine per stream", func() bool {
		return relayGoroutines(t) == n
	})
}

// relayGoroutines counts the goroutines that serve streams: stream
// handlers, send workers, first-request readers.
func relayGoroutines(t *testing.T) int {
	t.Helper()
	var b bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&b, 1); err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, rec := range strings.Split(b.String(), "\n\n") {
		if !strings.Contains(rec, "xdsrelay/downstream.serve[") && !strings.Contains(rec, "xdsrelay/downstream.(*sendPool)") &&
			!strings.Contains(rec, "xdsrelay/downstream.firstRequest") {
			continue
		}
		var count int
		if _, err := fmt.Sscanf(rec, "%d @", &count); err != nil {
			continue
		}
		total += count
	}
	return total
}
