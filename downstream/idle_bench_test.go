package downstream

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/metrics"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// idleHeap is where BenchmarkIdleStreams writes the heap profile of each
// server once its streams are idle: idleHeap.relay and idleHeap.floor.
var idleHeap = flag.String("idleheap", "", "BenchmarkIdleStreams writes a heap profile of each setup's idle streams to `file`.<setup>")

// BenchmarkIdleStreams is what an idle stream holds: n delta ADS streams
// of one EDS name, 100 to a connection over loopback, each sent its first
// response and ACKing it, then idle; on the relay's downstream server
// (relay) and on a bare gRPC server with the same transport options that
// writes each stream the same pre-encoded response and then only drains it
// (floor, as xdsload's gRPC floor). It reports the live heap and the
// goroutine stacks per stream, clients included (the same in both setups):
// relay less floor is what the relay holds for an idle stream. Run it with
//
//	go test -run '^$' -bench IdleStreams -benchtime 1x ./downstream
//
// and with -idleheap FILE -memprofilerate 64 for a heap profile of each.
func BenchmarkIdleStreams(b *testing.B) {
	for _, n := range []int{2000} {
		for _, setup := range []string{"floor", "relay"} {
			b.Run(fmt.Sprintf("%s/streams=%d", setup, n), func(b *testing.B) {
				for range b.N {
					idleStreams(b, setup, n)
				}
			})
		}
	}
}

// idleServerOptions are the relay's transport options that shape what an
// idle stream costs (relay.serverOptions), for both setups.
func idleServerOptions() []grpc.ServerOption {
	return append(ServerOptions(),
		grpc.SharedWriteBuffer(true),
		grpc.ReadBufferSize(8<<10),
		grpc.WriteBufferSize(32<<10),
		grpc.StaticStreamWindowSize(64<<10),
		grpc.StaticConnWindowSize(64<<10),
		grpc.MaxConcurrentStreams(math.MaxUint32),
	)
}

func idleStreams(b *testing.B, setup string, n int) {
	const typeURL = resourcev3.EndpointType
	cla := encoded(b, typeURL, "cla-0", "v0", 1<<10)
	c := cache.New(cache.Options{})
	w := cache.NewWatch()
	c.Watch(w, typeURL, "cla-0")
	c.Apply(typeURL, cache.Change{Upserts: []*cache.Resource{cla}, Synced: true})
	c.Release(w)
	g := grpc.NewServer(idleServerOptions()...)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	var floor *idleFloor
	var srv *Server
	if setup == "relay" {
		srv, err = New(Options{Groups: oneGroup{c}, Metrics: &metrics.Registry{}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			b.Fatal(err)
		}
		srv.Register(g)
		go g.Serve(srv.Listen(ln))
	} else {
		floor = &idleFloor{fields: [][]byte{cla.Wire}}
		g.RegisterService(floor.service(), floor)
		go g.Serve(ln)
	}
	defer g.Stop()

	before := idleMem()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var conns []*grpc.ClientConn
	defer func() {
		for _, cc := range conns {
			cc.Close()
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		if i%100 == 0 {
			cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				b.Fatal(err)
			}
			conns = append(conns, cc)
		}
		ads := discoverypb.NewAggregatedDiscoveryServiceClient(conns[len(conns)-1])
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- idleClient(ctx, ads, i)
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
	// Every ACK handled: the floor counted it, the relay's counters show it.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		if setup == "floor" && floor.acks.Load() == int64(n) || setup == "relay" && acceptedOf(c, typeURL, "cla-0") == n {
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("the ACKs were not all handled within a minute")
		}
	}
	after := idleMem()
	b.ReportMetric(float64(after.heap-before.heap)/float64(n), "heap-B/stream")
	b.ReportMetric(float64(after.stack-before.stack)/float64(n), "stack-B/stream")
	b.ReportMetric(float64(after.goroutines-before.goroutines)/float64(n), "goroutines/stream")
	if *idleHeap != "" {
		f, err := os.Create(*idleHeap + "." + setup)
		if err != nil {
			b.Fatal(err)
		}
		if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
			b.Fatal(err)
		}
		f.Close()
	}
	cancel()
	wg.Wait()
	for _, cc := range conns {
		cc.Close()
	}
	conns = nil
	g.Stop()
	if srv != nil {
		srv.Drain()
	}
}

// idleClient opens a delta ADS stream of cla-0, reads its first response,
// ACKs it and stays until ctx ends.
func idleClient(ctx context.Context, ads discoverypb.AggregatedDiscoveryServiceClient, i int) error {
	st, err := ads.DeltaAggregatedResources(ctx)
	if err != nil {
		return err
	}
	node := &corepb.Node{Id: "idle-" + strconv.Itoa(i), Cluster: "idle"}
	if err := st.Send(&discoverypb.DeltaDiscoveryRequest{Node: node, TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: []string{"cla-0"}}); err != nil {
		return err
	}
	resp, err := st.Recv()
	if err != nil {
		return err
	}
	if len(resp.GetResources()) != 1 {
		return fmt.Errorf("stream %d: first response holds %d resources", i, len(resp.GetResources()))
	}
	if err := st.Send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResponseNonce: resp.GetNonce()}); err != nil {
		return err
	}
	go func() {
		for {
			if _, err := st.Recv(); err != nil {
				return
			}
		}
	}()
	return nil
}

// idleFloor is a bare gRPC server of delta ADS: it sends each stream fields
// after its first request and counts its ACKs, keeping nothing.
type idleFloor struct {
	fields [][]byte
	acks   atomic.Int64
}

func (f *idleFloor) service() *grpc.ServiceDesc {
	d := discoverypb.AggregatedDiscoveryService_ServiceDesc
	out := &grpc.ServiceDesc{ServiceName: d.ServiceName, HandlerType: (*any)(nil), Metadata: d.Metadata}
	for _, sd := range d.Streams {
		if sd.StreamName == "DeltaAggregatedResources" {
			sd.Handler = func(_ any, ss grpc.ServerStream) error { return f.serve(ss) }
			out.Streams = append(out.Streams, sd)
		}
	}
	return out
}

func (f *idleFloor) serve(ss grpc.ServerStream) error {
	req := &discoverypb.DeltaDiscoveryRequest{}
	if err := ss.RecvMsg(req); err != nil {
		return nil
	}
	if err := ss.SendMsg(xds.DeltaFields(1, resourcev3.EndpointType, "1", f.fields, nil)); err != nil {
		return err
	}
	for {
		if err := ss.RecvMsg(req); err != nil {
			return nil
		}
		f.acks.Add(1)
	}
}

type idleFigures struct{ heap, stack, goroutines uint64 }

// idleMem is the live heap and the goroutines' stacks, after a collection.
func idleMem() idleFigures {
	for range 6 {
		runtime.GC()
	}
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return idleFigures{heap: m.HeapAlloc, stack: m.StackInuse, goroutines: uint64(runtime.NumGoroutine())}
}
