package relay

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

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
	cp := testcp.Start(b)
	for range b.N {
		b.StopTimer()
		cfg := Default()
		cfg.Upstream.Address, cfg.Downstream.Address, cfg.Admin.Address = cp.Addr, "127.0.0.1:0", ""
		cfg.Cache.MaxResources = 0
		r, err := New(cfg, testLogger())
		if err != nil {
			b.Fatal(err)
		}
		if err := r.Start(); err != nil {
			b.Fatal(err)
		}
		before, seen := heap(), len(cp.Requests())
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
			got = 0
			for _, req := range cp.Requests()[seen:] {
				got += len(req.GetResourceNamesSubscribe())
			}
			runtime.Gosched()
		}
		b.StopTimer()
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
