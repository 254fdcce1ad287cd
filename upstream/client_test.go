package upstream

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"go.opentelemetry.io/otel"
	otelcodes "go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	oteltrace "go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/lockorder/lockcheck"
	"github.com/xdsrelay/xdsrelay/internal/metrics"
	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

func TestMain(m *testing.M) {
	lockcheck.Main(m)
}

// scripted is a control plane for one unit test: it hands the stream to the
// test, which plays the server's side by hand.
type scripted struct {
	discoverypb.UnimplementedAggregatedDiscoveryServiceServer
	streams chan grpc.BidiStreamingServer[discoverypb.DeltaDiscoveryRequest, discoverypb.DeltaDiscoveryResponse]
}

func (s *scripted) DeltaAggregatedResources(st grpc.BidiStreamingServer[discoverypb.DeltaDiscoveryRequest, discoverypb.DeltaDiscoveryResponse]) error {
	s.streams <- st
	<-st.Context().Done()
	return nil
}

// startScripted serves a scripted control plane, with the services that
// register adds beside it, until the test ends and returns it with a
// connection to it.
func startScripted(t *testing.T, register ...func(*grpc.Server)) (*scripted, *grpc.ClientConn) {
	t.Helper()
	srv := &scripted{streams: make(chan grpc.BidiStreamingServer[discoverypb.DeltaDiscoveryRequest, discoverypb.DeltaDiscoveryResponse], 1)}
	g := grpc.NewServer()
	discoverypb.RegisterAggregatedDiscoveryServiceServer(g, srv)
	for _, r := range register {
		r(g)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { defer close(served); _ = g.Serve(ln) }()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(); g.Stop(); <-served })
	return srv, conn
}

// startClient runs a client with opts until the test ends, and waits (up
// to 10s) for it to stop then.
func startClient(t *testing.T, opts Options) *Client {
	t.Helper()
	cl, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); cl.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-ran:
		case <-time.After(10 * time.Second):
			t.Error("the client did not stop")
		}
	})
	return cl
}

// runClient starts a client with opts until the test ends, and returns the
// stream it opens on srv.
func runClient(t *testing.T, srv *scripted, opts Options) grpc.BidiStreamingServer[discoverypb.DeltaDiscoveryRequest, discoverypb.DeltaDiscoveryResponse] {
	t.Helper()
	startClient(t, opts)
	select {
	case st := <-srv.streams:
		return st
	case <-time.After(10 * time.Second):
		t.Fatal("the client opened no stream")
	}
	return nil
}

func recvReq(t *testing.T, st grpc.BidiStreamingServer[discoverypb.DeltaDiscoveryRequest, discoverypb.DeltaDiscoveryResponse]) *discoverypb.DeltaDiscoveryRequest {
	t.Helper()
	type result struct {
		r   *discoverypb.DeltaDiscoveryRequest
		err error
	}
	ch := make(chan result, 1)
	go func() { r, err := st.Recv(); ch <- result{r, err} }()
	select {
	case res := <-ch:
		if res.err != nil {
			t.Fatal(res.err)
		}
		return res.r
	case <-time.After(10 * time.Second):
		t.Fatal("no request in time")
	}
	return nil
}

// A resource the relay cannot decode is NACKed with an error_detail naming
// it; the others in the response are applied, and the last good version of
// the bad one stays served ("ACK/NACK and resource type instance version").
func TestNACKKeepsLastGood(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans)))
	defer otel.SetTracerProvider(noop.NewTracerProvider())
	srv, conn := startScripted(t)
	c := cache.New(cache.Options{Retention: time.Minute})
	w := cache.NewWatch()
	c.Watch(w, resourcev3.ClusterType, "good", "bad")
	st := runClient(t, srv, Options{Conn: conn, Node: &corepb.Node{Id: "n"}, Cache: c, Metrics: NewMetrics(&metrics.Registry{}),
		Backoff: backoff.Config{BaseDelay: 10 * time.Millisecond, Multiplier: 1.6, MaxDelay: 100 * time.Millisecond}})
	sub := recvReq(t, st)
	if sub.GetNode().GetId() != "n" || len(sub.GetResourceNamesSubscribe()) != 2 {
		t.Fatalf("first request: %v", sub)
	}
	good := func(name string) *discoverypb.Resource {
		a, _ := anypb.New(testcp.Cluster(name))
		return &discoverypb.Resource{Name: name, Version: "1", Resource: a}
	}
	garbage := &discoverypb.Resource{Name: "bad", Version: "2",
		Resource: &anypb.Any{TypeUrl: resourcev3.ClusterType, Value: []byte{0xff, 0xff, 0xff}}}

	// First both good, then a bad version of "bad" beside a new good one.
	if err := st.Send(&discoverypb.DeltaDiscoveryResponse{TypeUrl: resourcev3.ClusterType, Nonce: "1",
		Resources: []*discoverypb.Resource{good("good"), good("bad")}}); err != nil {
		t.Fatal(err)
	}
	if ack := recvReq(t, st); ack.GetResponseNonce() != "1" || ack.GetErrorDetail() != nil {
		t.Fatalf("want an ACK of nonce 1, got %v", ack)
	}
	newer := good("good")
	newer.Version = "2"
	if err := st.Send(&discoverypb.DeltaDiscoveryResponse{TypeUrl: resourcev3.ClusterType, Nonce: "2",
		Resources: []*discoverypb.Resource{newer, garbage}}); err != nil {
		t.Fatal(err)
	}
	nack := recvReq(t, st)
	if nack.GetResponseNonce() != "2" || nack.GetErrorDetail() == nil || !strings.Contains(nack.GetErrorDetail().GetMessage(), `"bad"`) {
		t.Fatalf("want a NACK of nonce 2 naming \"bad\", got %v", nack)
	}
	got := c.Get(resourcev3.ClusterType, []string{"good", "bad"})
	if got[0].Resource.Version != "2" {
		t.Errorf("good: version %s, want the applied 2", got[0].Resource.Version)
	}
	if got[1].Resource == nil || got[1].Resource.Version != "1" {
		t.Errorf("bad: %+v, want the last good version 1", got[1].Resource)
	}
	// Each upstream response is the root of its own trace, with the cache
	// update as its child; the NACKed one is marked. The NACK is sent
	// before its span ends.
	eventually(t, "both responses' spans to end", func() bool {
		n := 0
		for _, s := range spans.Ended() {
			if s.Name() == "upstream.receive" {
				n++
			}
		}
		return n == 2
	})
	var ok, nacked int
	applies := map[oteltrace.SpanID]int{}
	for _, s := range spans.Ended() {
		if s.Name() == "cache.apply" {
			applies[s.Parent().SpanID()]++
		}
	}
	for _, s := range spans.Ended() {
		if s.Name() != "upstream.receive" {
			continue
		}
		if s.Parent().IsValid() {
			t.Errorf("upstream.receive has parent %v, want a root", s.Parent())
		}
		if applies[s.SpanContext().SpanID()] != 1 {
			t.Errorf("upstream.receive %v: %d cache.apply children, want 1", s.SpanContext().SpanID(), applies[s.SpanContext().SpanID()])
		}
		if s.Status().Code == otelcodes.Error {
			nacked++
		} else {
			ok++
		}
	}
	if ok != 1 || nacked != 1 {
		t.Errorf("spans: %d ok and %d NACKed, want 1 and 1", ok, nacked)
	}
}

func TestBackoffGrowsAndIsCapped(t *testing.T) {
	cfg := backoff.Config{BaseDelay: time.Second, Multiplier: 2, Jitter: 0.2, MaxDelay: 30 * time.Second}
	if d := backoffDelay(cfg, 0); d != time.Second {
		t.Errorf("first retry: %s", d)
	}
	for retries, want := range map[int]time.Duration{1: 2 * time.Second, 3: 8 * time.Second, 10: 30 * time.Second} {
		d := backoffDelay(cfg, retries)
		if lo, hi := time.Duration(float64(want)*0.8), time.Duration(float64(want)*1.2); d < lo || d > hi {
			t.Errorf("retry %d: %s, want within 20%% of %s", retries, d, want)
		}
	}
}

// "Duplicate Resource Names": a response naming one resource twice is
// NACKed with a message naming it; neither instance is applied, the rest is.
func TestDuplicateNamesAreNACKed(t *testing.T) {
	srv, conn := startScripted(t)
	c := cache.New(cache.Options{Retention: time.Minute})
	c.Watch(cache.NewWatch(), resourcev3.ClusterType, "twice", "once")
	st := runClient(t, srv, Options{Conn: conn, Node: &corepb.Node{Id: "n"}, Cache: c, Metrics: NewMetrics(&metrics.Registry{})})
	recvReq(t, st)
	cluster := func(name, version string) *discoverypb.Resource {
		a, _ := anypb.New(testcp.Cluster(name))
		return &discoverypb.Resource{Name: name, Version: version, Resource: a}
	}
	if err := st.Send(&discoverypb.DeltaDiscoveryResponse{TypeUrl: resourcev3.ClusterType, Nonce: "1",
		Resources: []*discoverypb.Resource{cluster("twice", "1"), cluster("once", "1"), cluster("twice", "2")}}); err != nil {
		t.Fatal(err)
	}
	nack := recvReq(t, st)
	if nack.GetErrorDetail() == nil || !strings.Contains(nack.GetErrorDetail().GetMessage(), `"twice" appears more than once`) {
		t.Fatalf("want a NACK naming \"twice\", got %v", nack)
	}
	got := c.Get(resourcev3.ClusterType, []string{"twice", "once"})
	if got[0].Resource != nil || got[1].Resource == nil {
		t.Errorf("twice: %+v, once: %+v; want only once applied", got[0].Resource, got[1].Resource)
	}
}
