package upstream

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	clusterpb "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/metrics"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// sotwEcho is a SotW-only control plane that answers every request with
// the next of its pre-encoded responses, in turn: each the whole state of
// a type, one resource changed from the one before.
type sotwEcho struct {
	discoverypb.UnimplementedAggregatedDiscoveryServiceServer
	msgs []*xds.Message
}

func (e *sotwEcho) DeltaAggregatedResources(grpc.BidiStreamingServer[discoverypb.DeltaDiscoveryRequest, discoverypb.DeltaDiscoveryResponse]) error {
	return status.Error(codes.Unimplemented, "delta is not implemented")
}

func (e *sotwEcho) StreamAggregatedResources(st grpc.BidiStreamingServer[discoverypb.DiscoveryRequest, discoverypb.DiscoveryResponse]) error {
	for i := 0; ; i++ {
		if _, err := st.Recv(); err != nil {
			return nil
		}
		if err := st.SendMsg(e.msgs[i%len(e.msgs)]); err != nil {
			return nil
		}
	}
}

// sotwState is a SotW CDS response of n clusters; cluster-0's connect
// timeout is seconds, so that two states differ in one cluster.
func sotwState(b *testing.B, n int, nonce string, seconds int64) *xds.Message {
	resp := &discoverypb.DiscoveryResponse{TypeUrl: resourcev3.ClusterType, VersionInfo: nonce, Nonce: nonce}
	for i := range n {
		c := &clusterpb.Cluster{Name: "cluster-" + strconv.Itoa(i), ConnectTimeout: durationpb.New(time.Second)}
		if i == 0 {
			c.ConnectTimeout = durationpb.New(time.Duration(seconds) * time.Second)
		}
		a, _ := anypb.New(c)
		resp.Resources = append(resp.Resources, a)
	}
	body, err := proto.Marshal(resp)
	if err != nil {
		b.Fatal(err)
	}
	return &xds.Message{Parts: [][]byte{body}}
}

// BenchmarkSotWResponse10k is the relay's work for one state-of-the-world
// response of a type of 10,000 Clusters of which one changed: decoding,
// hashing each resource's bytes for its version, finding what changed,
// applying the one change and ACKing with the whole list. What reaches
// clients is the one change (type-versions/op: 1).
//
//	go test -run '^$' -bench SotWResponse10k -benchtime 200x ./upstream
func BenchmarkSotWResponse10k(b *testing.B) {
	const n = 10000
	srv := grpc.NewServer(grpc.ForceServerCodecV2(xds.Codec{}))
	discoverypb.RegisterAggregatedDiscoveryServiceServer(srv, &sotwEcho{msgs: []*xds.Message{
		sotwState(b, n, "1", 1), sotwState(b, n, "2", 2)}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Stop()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	reg := &metrics.Registry{}
	m := NewMetrics(reg)
	c := cache.New(cache.Options{Retention: time.Minute})
	w := cache.NewWatch()
	c.WatchWildcard(w, resourcev3.ClusterType)
	cl, err := New(Options{Conn: conn, Node: &corepb.Node{Id: "n"}, Cache: c, Metrics: m, Protocol: ProtocolSotW})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); cl.Run(ctx) }()
	defer func() { cancel(); <-done }()
	responses := m.Responses.With("Cluster")
	for c.Len() < n {
		time.Sleep(time.Millisecond)
	}
	start, version := responses.Get(), c.Version(resourcev3.ClusterType)
	b.ResetTimer()
	for responses.Get()-start < int64(b.N) {
		time.Sleep(50 * time.Microsecond)
	}
	b.StopTimer()
	// Each response changed one Cluster: one new version of the type, not
	// 10,000 (the same bytes are the same version).
	b.ReportMetric(float64(c.Version(resourcev3.ClusterType)-version)/float64(b.N), "type-versions/op")
}
