package relay

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/xds"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// backend is a real gRPC server that answers with its own name.
type backend struct {
	testgrpc.UnimplementedTestServiceServer
	name string
}

func (b *backend) UnaryCall(context.Context, *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	return &testgrpc.SimpleResponse{Hostname: b.name}, nil
}

func startBackend(t testing.TB, name string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	testgrpc.RegisterTestServiceServer(s, &backend{name: name})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.Serve(ln)
	}()
	t.Cleanup(func() {
		s.Stop()
		<-done
	})
	return ln.Addr().String()
}

// A gRPC client that resolves xds:///greeter through the relay gets its
// listener, route, cluster and endpoints, makes real RPCs to a real backend,
// and follows an upstream EDS change to another backend.
func TestGRPCClientThroughRelay(t *testing.T) {
	forEachDialect(t, testGRPCClientThroughRelay)
}

func testGRPCClientThroughRelay(t *testing.T, d testcp.Dialect) {
	cp := testcp.StartDialect(t, d)
	b1, b2 := startBackend(t, "backend-1"), startBackend(t, "backend-2")
	cp.Set(t, "greeters", "1",
		testcp.Listener("greeter", "greeter-route"), testcp.Route("greeter-route", "greeter-cluster"),
		testcp.Cluster("greeter-cluster"), testcp.Endpoints("greeter-cluster", b1))
	r := startRelay(t, cp.Addr)

	cc := grpcXDSClient(t, r.Addr(), "grpc-client-1", "greeters", "xds:///greeter")
	callUntil := func(want string) { rpcReaches(t, cc, want, func() {}) }
	callUntil("backend-1")

	cp.Set(t, "greeters", "2",
		testcp.Listener("greeter", "greeter-route"), testcp.Route("greeter-route", "greeter-cluster"),
		testcp.Cluster("greeter-cluster"), testcp.Endpoints("greeter-cluster", b2))
	callUntil("backend-2")

	// One stream for the group: ADS, delta or SotW; or one per type.
	want, streams := int64(1), &cp.DeltaStreams
	switch d {
	case testcp.DialectSotW:
		streams = &cp.SotWStreams
	case testcp.DialectPerType:
		want, streams = 4, &cp.SotWStreams // LDS, RDS, CDS, EDS
	}
	if n := streams.Load(); n != want {
		t.Fatalf("control plane saw %d streams, want %d", n, want)
	}
}

// grpcXDSClient is a real gRPC client of target whose xDS bootstrap names
// the relay at addr and the node id in cluster; closed when the test ends.
func grpcXDSClient(t testing.TB, addr, id, cluster, target string) *grpc.ClientConn {
	t.Helper()
	return grpcClientWith(t, fmt.Sprintf(`{
		"xds_servers": [{"server_uri": %q, "channel_creds": [{"type": "insecure"}], "server_features": ["xds_v3"]}],
		"node": {"id": %q, "cluster": %q}
	}`, addr, id, cluster), target)
}

// grpcClientWith is a real gRPC client of target with the xDS bootstrap;
// closed when the test ends.
func grpcClientWith(t testing.TB, bootstrap, target string) *grpc.ClientConn {
	t.Helper()
	resolver, err := xds.NewXDSResolverWithConfigForTesting([]byte(bootstrap))
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient(target, grpc.WithResolvers(resolver), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// rpcReaches makes RPCs on cc until one is answered by the backend named
// want, failing the test after wait.
func rpcReaches(t *testing.T, cc *grpc.ClientConn, want string, onFail func()) {
	t.Helper()
	if last, lastErr, ok := reachWithin(testgrpc.NewTestServiceClient(cc), want, 10*time.Millisecond); !ok {
		onFail()
		t.Fatalf("RPCs to %s never reached %s (last reached %q, error %v)", cc.Target(), want, last, lastErr)
	}
}

// reachWithin makes RPCs, poll apart, until one is answered by the backend
// named want or wait has passed; errors (a route whose cluster grpc-go
// does not have yet) are retried. Not ok, last and lastErr are what the
// last RPC got.
func reachWithin(client testgrpc.TestServiceClient, want string, poll time.Duration) (last string, lastErr error, ok bool) {
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{}, grpc.WaitForReady(true))
		cancel()
		if err == nil && resp.GetHostname() == want {
			return "", nil, true
		}
		last, lastErr = resp.GetHostname(), err
		time.Sleep(poll)
	}
	return last, lastErr, false
}
