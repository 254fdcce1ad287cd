package upstream

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	clusterpb "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/metrics"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// preEncoded is a control plane that sends one response it holds already
// encoded (through the pass-through codec), so that the process's memory
// beyond it is the relay's receiving side.
type preEncoded struct {
	discoverypb.UnimplementedAggregatedDiscoveryServiceServer
	msg *xds.Message
}

func (p *preEncoded) DeltaAggregatedResources(st grpc.BidiStreamingServer[discoverypb.DeltaDiscoveryRequest, discoverypb.DeltaDiscoveryResponse]) error {
	if _, err := st.Recv(); err != nil {
		return nil
	}
	if err := st.SendMsg(p.msg); err != nil {
		return nil
	}
	for {
		if _, err := st.Recv(); err != nil {
			return nil
		}
	}
}

// BenchmarkLargeResponseRSS is the peak resident memory the relay's
// upstream side adds to receive and apply one 100 MiB response (1,000
// clusters of 100 KiB), as a multiple of the response's size. It reads the
// process's peak RSS (Linux: /proc/self/status VmHWM, reset through
// /proc/self/clear_refs).
//
//	go test -run '^$' -bench LargeResponseRSS -benchtime 1x ./upstream
func BenchmarkLargeResponseRSS(b *testing.B) {
	const n, size = 1000, 100 << 10
	resp := &discoverypb.DeltaDiscoveryResponse{TypeUrl: resourcev3.ClusterType, Nonce: "1"}
	var names []string
	for i := range n {
		name := "cluster-" + strconv.Itoa(i)
		names = append(names, name)
		a, _ := anypb.New(&clusterpb.Cluster{Name: name, AltStatName: strings.Repeat("x", size)})
		resp.Resources = append(resp.Resources, &discoverypb.Resource{Name: name, Version: "1", Resource: a})
	}
	body, err := proto.Marshal(resp)
	if err != nil {
		b.Fatal(err)
	}
	resp = nil
	srv := grpc.NewServer(grpc.ForceServerCodecV2(xds.Codec{}))
	discoverypb.RegisterAggregatedDiscoveryServiceServer(srv, &preEncoded{msg: &xds.Message{Parts: [][]byte{body}}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Stop()
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(256 << 20))}
	conn, err := grpc.NewClient(ln.Addr().String(), opts...)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	for range b.N {
		c := cache.New(cache.Options{Retention: time.Minute})
		c.Watch(cache.NewWatch(), resourcev3.ClusterType, names...)
		cl, err := New(Options{Conn: conn, Node: &corepb.Node{Id: "n"}, Cache: c, Metrics: NewMetrics(&metrics.Registry{})})
		if err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		debug.FreeOSMemory()
		base, err := resetPeakRSS()
		if err != nil {
			b.Skip("peak RSS not readable here:", err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); cl.Run(ctx) }()
		for c.Len() < n {
			time.Sleep(time.Millisecond)
		}
		peak, _ := readStatus("VmHWM")
		cancel()
		<-done
		b.ReportMetric(float64(peak-base)/float64(len(body)), "peakRSS/response")
		b.ReportMetric(float64(peak-base)/(1<<20), "peakRSS-MiB")
	}
}

// resetPeakRSS resets the process's peak RSS and returns its RSS now.
func resetPeakRSS() (int64, error) {
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		return 0, err
	}
	return readStatus("VmRSS")
}

func readStatus(key string) (int64, error) {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for line := range bytes.Lines(data) {
		if rest, ok := bytes.CutPrefix(line, []byte(key+":")); ok {
			var kb int64
			_, err := fmt.Sscan(string(rest), &kb)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no %s in /proc/self/status", key)
}
