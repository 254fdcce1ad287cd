package relay

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// silent is a control plane that never answers: it counts the names
// subscribed and keeps nothing, so that what is measured is the relay's.
type silent struct {
	discoverypb.UnimplementedAggregatedDiscoveryServiceServer
	subscribed atomic.Int64
}

func (s *silent) DeltaAggregatedResources(st grpc.BidiStreamingServer[discoverypb.DeltaDiscoveryRequest, discoverypb.DeltaDiscoveryResponse]) error {
	for {
		r, err := st.Recv()
		if err != nil {
			return nil
		}
		s.subscribed.Add(int64(len(r.GetResourceNamesSubscribe())))
	}
}

// BenchmarkMemoryPerName is what one incremental client subscribing names
// that upstream never answers costs the relay, in heap bytes per name
// (downstream stream state, cache entries, upstream subscription, timers):
// one 3.5 MB request of 250,000 names, as in a hostile client's.
//
//	go test -run '^$' -bench MemoryPerName -benchtime 1x ./relay
func BenchmarkMemoryPerName(b *testing.B) {
	const n = 250000
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("name-%07d", i)
	}
	cp := &silent{}
	g := grpc.NewServer()
	discoverypb.RegisterAggregatedDiscoveryServiceServer(g, cp)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go g.Serve(ln)
	defer g.Stop()
	for range b.N {
		b.StopTimer()
		cfg := Default()
		cfg.Upstream.Address, cfg.Downstream.Address, cfg.Admin.Address = ln.Addr().String(), "127.0.0.1:0", ""
		cfg.Cache.MaxResources, cfg.Limits.MaxNamesPerStream = 0, 0
		r, err := New(cfg, testLogger())
		if err != nil {
			b.Fatal(err)
		}
		if err := r.Start(); err != nil {
			b.Fatal(err)
		}
		cp.subscribed.Store(0)
		before := heap()
		b.StartTimer()
		cc, err := grpc.NewClient(r.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		st, err := discoverypb.NewAggregatedDiscoveryServiceClient(cc).DeltaAggregatedResources(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := st.Send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "c1"), TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: names}); err != nil {
			b.Fatal(err)
		}
		for got, deadline := 0, time.Now().Add(time.Minute); got < n; {
			if time.Now().After(deadline) {
				b.Fatalf("the upstream subscribed %d of %d names", got, n)
			}
			got = int(cp.subscribed.Load())
			time.Sleep(time.Millisecond)
		}
		b.StopTimer()
		// Let the stream's flush of the request finish: what is measured is
		// what the names hold, not a flush in flight.
		time.Sleep(500 * time.Millisecond)
		b.ReportMetric(float64(heap()-before)/n, "B/name")
		cancel()
		cc.Close()
		sctx, scancel := context.WithTimeout(context.Background(), wait)
		if err := r.Shutdown(sctx); err != nil {
			b.Error(err)
		}
		scancel()
	}
}

func heap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
