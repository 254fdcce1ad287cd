package relay

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// A real gRPC client makes RPCs without a break while the control plane
// moves its route to a cluster it sends only later: the relay keeps the
// old route until the new cluster and its endpoints are cached, so no RPC
// waits for a cluster past its deadline (shorter than the control plane's
// gap). grpc-go (1.85) itself swaps a route only once its clusters
// resolve, so this holds the relay's waits to a real client rather than
// showing what they add; that is TestRouteWaitsForItsCluster's part.
//
// One failure is not the relay's: when a route's new cluster and
// endpoints are all at hand at once, grpc-go may pick the new cluster
// before its cluster manager has it ("unknown cluster selected for RPC").
// It happens as well with the relay's waits off when the control plane
// sends the route, cluster and endpoints together; it is counted apart.
func TestGRPCClientRouteChangeWithoutFailures(t *testing.T) {
	cp := testcp.Start(t)
	b1, b2 := startBackend(t, "backend-1"), startBackend(t, "backend-2")
	cp.Set(t, "greeters", "1",
		testcp.Listener("greeter", "greeter-route"), testcp.Route("greeter-route", "one"),
		testcp.Cluster("one"), testcp.Endpoints("one", b1))
	r := startRelay(t, cp.Addr, func(c *Config) { c.Consistency.MaxWait = time.Minute })
	cc := grpcXDSClient(t, r.Addr(), "grpc-client-1", "greeters", "xds:///greeter")
	rpcReaches(t, cc, "backend-1", func() {})

	client := testgrpc.NewTestServiceClient(cc)
	var failed, torn, reached2 atomic.Int64
	var lastErr atomic.Value
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			resp, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{}, grpc.WaitForReady(false))
			cancel()
			switch {
			case err != nil && strings.Contains(err.Error(), "unknown cluster selected for RPC"):
				torn.Add(1)
			case err != nil:
				failed.Add(1)
				lastErr.Store(err.Error())
			case resp.GetHostname() == "backend-2":
				reached2.Add(1)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()

	// The route names "two" a second before the control plane has it.
	cp.Set(t, "greeters", "2",
		testcp.Listener("greeter", "greeter-route"), testcp.Route("greeter-route", "two"),
		testcp.Cluster("one"), testcp.Endpoints("one", b1))
	time.Sleep(time.Second)
	cp.Set(t, "greeters", "3",
		testcp.Listener("greeter", "greeter-route"), testcp.Route("greeter-route", "two"),
		testcp.Cluster("one"), testcp.Endpoints("one", b1),
		testcp.Cluster("two"), testcp.Endpoints("two", b2))
	eventually(t, "RPCs to reach backend-2", func() bool { return reached2.Load() > 0 })
	close(stop)
	<-done
	if n := failed.Load(); n > 0 {
		t.Errorf("%d RPCs failed through the route change; last: %v", n, lastErr.Load())
	}
	if n := torn.Load(); n > 0 {
		t.Logf("%d RPCs met grpc-go's cluster manager before it had the new cluster", n)
	}
}
