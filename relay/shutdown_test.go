package relay

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	"github.com/xdsrelay/xdsrelay/downstream"
	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// Shutdown stops accepting, sends GOAWAY on every connection while the
// streams still run, then asks them to end with UNAVAILABLE (so clients
// reconnect elsewhere), and closes the upstream stream.
func TestShutdownDrains(t *testing.T) {
	// The production grace (Config.hooks left zero), for room to see the
	// GOAWAY before the streams end.
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("x"))
	cfg := Default()
	cfg.Upstream.Address = cp.Addr
	cfg.Downstream.Address = "127.0.0.1:0"
	cfg.Admin.Address = ""
	r, err := New(cfg, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	cc := dial(t, r.Addr())
	st, err := discoverypb.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discoverypb.DiscoveryRequest{Node: node("n", "c1"), TypeUrl: resourcev3.ClusterType}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	ended := make(chan error, 1)
	go func() {
		_, err := st.Recv()
		ended <- err
	}()
	shut := make(chan error, 1)
	go func() { shut <- r.Shutdown(ctx) }()
	// GOAWAY: the client's connection leaves READY while the stream runs.
	gctx, gcancel := context.WithTimeout(ctx, drainGrace/2)
	defer gcancel()
	cc.WaitForStateChange(gctx, connectivity.Ready)
	if s := cc.GetState(); s == connectivity.Ready {
		t.Fatalf("no GOAWAY within %v of the shutdown: the connection is %v", drainGrace/2, s)
	}
	select {
	case err := <-ended:
		t.Fatalf("the stream ended (%v) with the GOAWAY, not after a drain", err)
	default:
	}
	if err := <-shut; err != nil {
		t.Fatal(err)
	}
	err = <-ended
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("stream ended with %v, want UNAVAILABLE", err)
	}
	if _, _, err := r.Join(node("late", "c1"), downstream.Caller{Variant: "delta-ads"}); err == nil {
		t.Fatal("a group was joined after shutdown")
	}
}

// Shutdown's wait for the relay's goroutines is bounded: a goroutine that
// never ends is abandoned at the deadline, with an error, and the wait
// leaves no goroutine of its own behind (as a wait on a WaitGroup would,
// in Wait for as long as the abandoned one runs). Once the last one ends,
// a wait returns at once.
func TestGoroutinesWaitIsBoundedAndLeavesNothing(t *testing.T) {
	var g goroutines
	g.add()
	before := goleak.IgnoreCurrent()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := g.wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait on a goroutine that never ends: %v", err)
	}
	if err := goleak.Find(before); err != nil {
		t.Fatalf("the bounded wait left a goroutine behind: %v", err)
	}
	ended := make(chan error, 1)
	go func() { ended <- g.wait(context.Background()) }()
	g.done()
	select {
	case err := <-ended:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(wait):
		t.Fatal("the wait did not see the last goroutine end")
	}
}

// A stream that has not sent its first request when shutdown begins is
// ended by the relay with its own message (an established stream's
// connection is closed instead: see TestShutdownDrains).
func TestShutdownEndsPendingStreamWithItsMessage(t *testing.T) {
	cp := testcp.Start(t)
	cfg := Default()
	cfg.Upstream.Address = cp.Addr
	cfg.Downstream.Address = "127.0.0.1:0"
	cfg.Admin.Address = "127.0.0.1:0"
	r, err := New(cfg, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	st := rawDelta(t, r.Addr())
	eventually(t, "the stream to be pending", func() bool {
		return strings.Contains(getMetrics(t, r), "xdsrelay_downstream_pending_streams 1\n")
	})
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := r.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := drain(st.Recv); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "shutting down, reconnect") {
		t.Fatalf("the pending stream ended with %v, want UNAVAILABLE saying the relay is shutting down", err)
	}
}

// New undoes what its earlier steps opened when a later one fails: the
// control plane's connections (upstream.address and .addresses) leave no
// goroutine behind.
func TestNewFailureLeavesNothingRunning(t *testing.T) {
	before := goleak.IgnoreCurrent()
	cfg := Default()
	cfg.Upstream.Address, cfg.Upstream.Addresses = "127.0.0.1:1", []string{"127.0.0.1:2"}
	cfg.Downstream.Address = "127.0.0.1:0"
	missing := filepath.Join(t.TempDir(), "missing.pem")
	cfg.Downstream.TLS.CertFile, cfg.Downstream.TLS.KeyFile = missing, missing
	if _, err := New(cfg, testLogger()); err == nil || !strings.Contains(err.Error(), "downstream.tls") {
		t.Fatalf("New with a missing certificate: %v, want an error naming downstream.tls", err)
	}
	goleak.VerifyNone(t, before)
}
