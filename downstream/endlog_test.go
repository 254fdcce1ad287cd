package downstream

import (
	"context"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/metrics"
	"github.com/xdsrelay/xdsrelay/internal/testlog"
)

// logBuffer collects JSON log lines.
type logBuffer = testlog.Buffer

type oneGroup struct{ c *cache.Cache }

func (g oneGroup) Join(*corepb.Node, Caller) (*cache.Cache, func(), error) {
	return g.c, func() {}, nil
}

// startServer serves a Server on 127.0.0.1:0 until the test ends.
func startServer(t *testing.T, log *logBuffer) (*Server, *grpc.ClientConn) {
	t.Helper()
	return serveOn(t, Options{Groups: oneGroup{cache.New(cache.Options{})}, Logger: slog.New(slog.NewJSONHandler(log, nil))})
}

// serveOn serves a Server made of opts (with a registry of its own and a
// silent logger if it has none) on 127.0.0.1:0 until the test ends, and returns it with a
// client connection to it.
func serveOn(t *testing.T, opts Options) (*Server, *grpc.ClientConn) {
	t.Helper()
	if opts.Metrics == nil {
		opts.Metrics = &metrics.Registry{}
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(ServerOptions()...)
	s.Register(g)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		g.Serve(s.Listen(ln))
	}()
	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cc.Close()
		g.Stop()
		<-served
	})
	return s, cc
}

// badStream opens an ADS stream that the server ends with INVALID_ARGUMENT
// and waits for its end.
func badStream(t *testing.T, cc *grpc.ClientConn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := discoverypb.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discoverypb.DiscoveryRequest{Node: &corepb.Node{Id: "broken"}, TypeUrl: "type.googleapis.com/not.a.Type"}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("stream ended with %v, want INVALID_ARGUMENT", err)
	}
}

// A fleet of broken clients is logged within the rate limit: with the clock
// standing still, a burst of lines and no more; once time passes, the next
// line is preceded by the count of the lines suppressed.
func TestStreamEndWarningsAreRateLimited(t *testing.T) {
	log := &logBuffer{}
	s, cc := startServer(t, log)
	var mu sync.Mutex
	now := time.Unix(1e9, 0)
	s.endLog.now = func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return now
	}
	const flood = 3 * endLogBurst
	for range flood {
		badStream(t, cc)
	}
	if n := len(log.Lines(t, "stream ended with an error")); n != endLogBurst {
		t.Fatalf("%d broken streams logged %d lines, want the burst of %d", flood, n, endLogBurst)
	}
	const suppressedMsg = "warnings about streams ended with an error were suppressed by the rate limit"
	if n := len(log.Lines(t, suppressedMsg)); n != 0 {
		t.Fatalf("%d suppressed-count lines before logging resumed", n)
	}
	mu.Lock()
	now = now.Add(time.Second)
	mu.Unlock()
	badStream(t, cc)
	sup := log.Lines(t, suppressedMsg)
	if len(sup) != 1 || sup[0]["suppressed"] != float64(flood-endLogBurst) || sup[0]["level"] != "WARN" {
		t.Fatalf("suppressed-count lines %v, want one counting %d", sup, flood-endLogBurst)
	}
	if n := len(log.Lines(t, "stream ended with an error")); n != endLogBurst+1 {
		t.Fatalf("after a second, %d lines, want %d", n, endLogBurst+1)
	}
}
