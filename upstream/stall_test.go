package upstream

import (
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/metrics"
)

// setPartial marks a message partly received on f's connection, begun
// now, or none.
func setPartial(f *Frames, on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	clear(f.partial)
	if on {
		now := time.Now()
		f.partial[&h2stream{began: now, progress: now}] = struct{}{}
	}
}

// No name is judged missing while a response is partly received on the
// stream's connection (docs/architecture.md, invariant 17): neither when
// the timer runs out, nor when a probe sent before the response began is
// answered. The name stays UNAVAILABLE, back on the timer, and is judged
// once nothing is partly received.
func TestNotFoundWaitsWhileAResponseIsPartlyRead(t *testing.T) {
	const eds = resourcev3.EndpointType
	h := &health{delay: 300 * time.Millisecond}
	_, f := WatchFrames(nil)
	c := cache.New(cache.Options{Retention: time.Minute})
	w := cache.NewWatch()
	c.Watch(w, eds, "x")
	srv, conn := startScripted(t, func(g *grpc.Server) { healthpb.RegisterHealthServer(g, h) })
	st := runClient(t, srv, Options{Servers: []Server{{Name: "cp", Conn: conn, Frames: f}}, Node: &corepb.Node{Id: "n"},
		Cache: c, Metrics: NewMetrics(&metrics.Registry{}), NotFoundTimeout: 100 * time.Millisecond, ProbeTimeout: 10 * time.Second,
		StallTimeout: -1})
	go func() {
		for {
			if _, err := st.Recv(); err != nil {
				return
			}
		}
	}()
	// The timer runs out with nothing partly read: the connection is
	// probed; a response begins to arrive before the probe is answered.
	if !lookupWithin(t, c, w.Ready(), eds, "x", 10*time.Second, isUnavailable) {
		t.Fatalf("x: %+v, want UNAVAILABLE while the probe is in flight", c.Get(eds, []string{"x"})[0])
	}
	setPartial(f, true)
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		if l := c.Get(eds, []string{"x"})[0]; !isUnavailable(l) {
			t.Fatalf("x while a response is partly read (probes answered: %d): %+v, want UNAVAILABLE", h.checks.Load(), l)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if h.checks.Load() != 1 {
		t.Errorf("%d probes, want 1: a partly read response waits on the timer, not on probes", h.checks.Load())
	}
	setPartial(f, false)
	if !lookupWithin(t, c, w.Ready(), eds, "x", 10*time.Second, isNotFound) {
		t.Fatalf("x: %+v, want NOT_FOUND once nothing is partly read", c.Get(eds, []string{"x"})[0])
	}
}
