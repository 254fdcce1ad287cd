package upstream

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/metrics"
	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// flood is a control plane that sends responses back to back, without
// waiting for ACKs, for as long as a stream lasts: the relay's stream always
// has a response in hand when it is stopped.
type flood struct {
	discoverypb.UnimplementedAggregatedDiscoveryServiceServer
	names []string
}

func (f *flood) DeltaAggregatedResources(st grpc.BidiStreamingServer[discoverypb.DeltaDiscoveryRequest, discoverypb.DeltaDiscoveryResponse]) error {
	go func() { // drain the relay's requests and ACKs
		for {
			if _, err := st.Recv(); err != nil {
				return
			}
		}
	}()
	for v := 0; ; v++ {
		r := &discoverypb.DeltaDiscoveryResponse{TypeUrl: resourcev3.EndpointType, Nonce: fmt.Sprint(v)}
		for i, n := range f.names {
			a, err := anypb.New(testcp.Endpoints(n, fmt.Sprintf("127.0.0.1:%d", 1000+(v+i)%1000)))
			if err != nil {
				return err
			}
			r.Resources = append(r.Resources, &discoverypb.Resource{Name: n, Version: fmt.Sprint(v), Resource: a})
		}
		if err := st.Send(r); err != nil {
			return nil
		}
	}
}

// Stopping a group while its stream receives returns at once, whatever the
// moment: hundreds of stops at random points of a stream flooded with
// responses, each bounded, none leaking a goroutine (goleak in TestMain).
func TestStopDuringReceive(t *testing.T) {
	f := &flood{}
	for i := range 20 {
		f.names = append(f.names, fmt.Sprint("cla-", i))
	}
	srv := grpc.NewServer()
	discoverypb.RegisterAggregatedDiscoveryServiceServer(srv, f)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(ln)
	}()
	defer func() { srv.Stop(); <-served }()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	m := NewMetrics(&metrics.Registry{})
	runs := 300
	if testing.Short() {
		runs = 50
	}
	for i := range runs {
		c := cache.New(cache.Options{Retention: time.Minute})
		c.Watch(cache.NewWatch(), resourcev3.EndpointType, f.names...)
		cl, err := New(Options{Conn: conn, Node: &corepb.Node{Id: "n"}, Cache: c, Metrics: m})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			cl.Run(ctx)
		}()
		time.Sleep(time.Duration(rand.IntN(5000)) * time.Microsecond)
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("stop %d: Run did not return after its context ended", i)
		}
	}
}

// oneResponse is a stream whose RecvMsg always has a response ready.
type oneResponse struct {
	grpc.BidiStreamingClient[discoverypb.DeltaDiscoveryRequest, discoverypb.DeltaDiscoveryResponse]
}

func (oneResponse) RecvMsg(any) error { return nil }

// The receiver reports why it ended on every path, also when the context
// ends while it holds a response nobody takes: a wait on its error channel
// is always answered, once with the error and then as closed.
func TestReceiveReportsContextEnd(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	resps, errc := receive(ctx, oneResponse{})
	cancel() // nobody reads resps: the receiver is blocked handing one over
	for _, want := range []bool{true, false} {
		select {
		case err, ok := <-errc:
			if ok != want || (ok && err != context.Canceled) {
				t.Fatalf("errc gave %v, %v", err, ok)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("no report after the context ended")
		}
	}
	for range resps { // closed once the receiver ended (it may still hold one)
	}
}
