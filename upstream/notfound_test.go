package upstream

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/metrics"
	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// The does-not-exist timer reports only what upstream left unanswered: a
// name the control plane removed first is not reported again, and a name
// the stream resumed with (in initial_resource_versions) is not timed out.
func TestNotFoundTimerLeavesAnsweredNames(t *testing.T) {
	srv, conn := startScripted(t)

	const eds = resourcev3.EndpointType
	c := cache.New(cache.Options{Retention: time.Minute})
	c.Import([]cache.TypeState{{TypeURL: eds, Resources: []*cache.Resource{{Name: "cached", Version: "1", Any: []byte("x"), Wire: []byte("x")}}}})
	gone, never := cache.NewWatch(), cache.NewWatch()
	c.Watch(gone, eds, "gone", "cached")
	c.Watch(never, eds, "never")
	const timeout = 200 * time.Millisecond
	st := runClient(t, srv, Options{Conn: conn, Node: &corepb.Node{Id: "n"}, Cache: c, Metrics: NewMetrics(&metrics.Registry{}), NotFoundTimeout: timeout})
	if sub := recvReq(t, st); sub.GetInitialResourceVersions()["cached"] != "1" {
		t.Fatalf("first request: %v", sub)
	}
	if err := st.Send(&discoverypb.DeltaDiscoveryResponse{TypeUrl: eds, Nonce: "1", RemovedResources: []string{"gone"}}); err != nil {
		t.Fatal(err)
	}
	recvReq(t, st) // the ACK
	gone.Take()
	select {
	case <-never.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("the unanswered name was never reported")
	}
	l := c.Get(eds, []string{"gone", "never", "cached"})
	if !l[0].Absent || !l[1].Absent || l[2].Resource == nil {
		t.Fatalf("after the timer: gone %+v, never %+v, cached %+v", l[0], l[1], l[2])
	}
	if d := gone.Take(); d != nil {
		t.Fatalf("names upstream had answered were marked again: %v", d.Of(eds).Names)
	}

	// Should it arrive after the timer, it is applied like any update.
	never.Take()
	a, err := anypb.New(testcp.Endpoints("never", "127.0.0.1:1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discoverypb.DeltaDiscoveryResponse{TypeUrl: eds, Nonce: "2",
		Resources: []*discoverypb.Resource{{Name: "never", Version: "1", Resource: a}}}); err != nil {
		t.Fatal(err)
	}
	if ack := recvReq(t, st); ack.GetErrorDetail() != nil {
		t.Fatalf("the late resource was NACKed: %v", ack.GetErrorDetail())
	}
	select {
	case <-never.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("the late resource was never delivered")
	}
	if l := c.Get(eds, []string{"never"})[0]; l.Resource == nil || l.Absent {
		t.Fatalf("after the late response: %+v", l)
	}
}

// A name too long for upstream.max_request_bytes is never sent upstream;
// the does-not-exist timer reports it as not existing, so that its
// watchers are answered.
func TestNotFoundTimerReportsNameTooLongToAsk(t *testing.T) {
	srv, conn := startScripted(t)

	const eds = resourcev3.EndpointType
	c := cache.New(cache.Options{Retention: time.Minute})
	long := strings.Repeat("x", 1000)
	w := cache.NewWatch()
	c.Watch(w, eds, "short", long)
	st := runClient(t, srv, Options{Conn: conn, Node: &corepb.Node{Id: "n"}, Cache: c, Metrics: NewMetrics(&metrics.Registry{}),
		NotFoundTimeout: 100 * time.Millisecond, MaxRequestBytes: 512})
	if sub := recvReq(t, st); !slices.Equal(sub.GetResourceNamesSubscribe(), []string{"short"}) {
		t.Fatalf("first request subscribes %v, want only the short name", sub.GetResourceNamesSubscribe())
	}
	deadline := time.After(10 * time.Second)
	for {
		if l := c.Get(eds, []string{long}); l[0].Absent {
			return
		}
		select {
		case <-w.Ready():
			w.Take()
		case <-deadline:
			t.Fatal("the name too long to ask for was never reported as not existing")
		}
	}
}

// health is a control plane's health service as the stream's liveness
// probe sees it: it answers SERVING after delay or, while mute, not at all
// (as a half-open connection answers nothing); it counts the checks.
type health struct {
	healthpb.UnimplementedHealthServer
	delay  time.Duration
	mute   atomic.Bool
	checks atomic.Int32
}

func (h *health) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	h.checks.Add(1)
	if h.mute.Load() {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	t := time.NewTimer(h.delay)
	defer t.Stop()
	select {
	case <-t.C:
		return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// startSilent serves a control plane that answers no subscription unless
// the test sends on the stream it returns, with h as its health service,
// and runs a client of c on it with the given does-not-exist and probe
// timeouts. The client's requests are read and dropped.
func startSilent(t *testing.T, h *health, c *cache.Cache, notFound, probe time.Duration) grpc.BidiStreamingServer[discoverypb.DeltaDiscoveryRequest, discoverypb.DeltaDiscoveryResponse] {
	t.Helper()
	srv, conn := startScripted(t, func(g *grpc.Server) { healthpb.RegisterHealthServer(g, h) })
	st := runClient(t, srv, Options{Conn: conn, Node: &corepb.Node{Id: "n"}, Cache: c, Metrics: NewMetrics(&metrics.Registry{}),
		NotFoundTimeout: notFound, ProbeTimeout: probe})
	go func() {
		for {
			if _, err := st.Recv(); err != nil {
				return
			}
		}
	}()
	return st
}

// lookupWithin waits up to bound, woken by wake (a watch's Ready), until
// cond holds of name's lookup in c; it reports whether it did.
func lookupWithin(t *testing.T, c *cache.Cache, wake <-chan struct{}, typeURL, name string, bound time.Duration, cond func(cache.Lookup) bool) bool {
	t.Helper()
	deadline := time.NewTimer(bound)
	defer deadline.Stop()
	for {
		if cond(c.Get(typeURL, []string{name})[0]) {
			return true
		}
		select {
		case <-wake:
		case <-deadline.C:
			return cond(c.Get(typeURL, []string{name})[0])
		}
	}
}

func isUnavailable(l cache.Lookup) bool {
	return !l.Absent && l.Error != nil && l.Error.Code == int32(codes.Unavailable)
}

func isNotFound(l cache.Lookup) bool {
	return l.Absent && l.Error != nil && l.Error.Code == int32(codes.NotFound)
}

// Silence is not an answer (docs/architecture.md, invariant 15): a name
// the timer finds unanswered on a stream that has shown no sign of life is
// UNAVAILABLE, not removed, until a probe of the connection is answered;
// a name asked after that probe was sent waits for a probe of its own, and
// is decided by it.
func TestNotFoundWaitsForAProbeSentAfterTheNameWasAsked(t *testing.T) {
	const eds = resourcev3.EndpointType
	h := &health{delay: time.Second}
	c := cache.New(cache.Options{Retention: time.Minute})
	w := cache.NewWatch()
	c.Watch(w, eds, "first")
	startSilent(t, h, c, 100*time.Millisecond, 10*time.Second)
	if !lookupWithin(t, c, w.Ready(), eds, "first", 10*time.Second, isUnavailable) {
		t.Fatalf("first: %+v, want UNAVAILABLE while the probe is in flight", c.Get(eds, []string{"first"})[0])
	}
	// The probe sent for "first" is in flight: "second", asked now, times
	// out before it is answered, and cannot be decided by it.
	c.Watch(w, eds, "second")
	if !lookupWithin(t, c, w.Ready(), eds, "first", 10*time.Second, isNotFound) {
		t.Fatalf("first: %+v, want NOT_FOUND once the probe was answered", c.Get(eds, []string{"first"})[0])
	}
	if !lookupWithin(t, c, w.Ready(), eds, "second", 10*time.Second, isNotFound) {
		t.Fatalf("second: %+v, want NOT_FOUND once a probe sent after it was asked was answered (probes: %d)",
			c.Get(eds, []string{"second"})[0], h.checks.Load())
	}
}

// A probe the connection does not answer leaves the names UNAVAILABLE, not
// removed, and puts them back on the timer: they are probed again, and
// decided once a probe is answered.
func TestNotFoundUnansweredProbeIsTriedAgain(t *testing.T) {
	const eds = resourcev3.EndpointType
	h := &health{}
	h.mute.Store(true)
	c := cache.New(cache.Options{Retention: time.Minute})
	w := cache.NewWatch()
	c.Watch(w, eds, "x")
	startSilent(t, h, c, 100*time.Millisecond, 100*time.Millisecond)
	if !lookupWithin(t, c, w.Ready(), eds, "x", 10*time.Second, isUnavailable) {
		t.Fatalf("x: %+v, want UNAVAILABLE", c.Get(eds, []string{"x"})[0])
	}
	// Probes go unanswered: x is never removed meanwhile.
	deadline := time.Now().Add(10 * time.Second)
	for h.checks.Load() < 3 {
		if l := c.Get(eds, []string{"x"})[0]; l.Absent {
			t.Fatalf("x removed on the word of a connection that answered no probe: %+v", l)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d probes in 10s, want the unanswered one tried again", h.checks.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if l := c.Get(eds, []string{"x"})[0]; !isUnavailable(l) {
		t.Fatalf("x after %d unanswered probes: %+v, want UNAVAILABLE", h.checks.Load(), l)
	}
	h.mute.Store(false)
	if !lookupWithin(t, c, w.Ready(), eds, "x", 10*time.Second, isNotFound) {
		t.Fatalf("x: %+v, want NOT_FOUND once a probe was answered", c.Get(eds, []string{"x"})[0])
	}
}

// discard is a stream to a control plane that takes every request and
// answers nothing.
type discard struct {
	grpc.BidiStreamingClient[discoverypb.DeltaDiscoveryRequest, discoverypb.DeltaDiscoveryResponse]
}

func (discard) Send(*discoverypb.DeltaDiscoveryRequest) error { return nil }

// What the timer judged on a stream is kept, to be taken back should the
// stream fail (withdraw), once per name and only while the name is
// subscribed: a stream that lives for days, its clients asking for names
// that do not exist and leaving them again, holds no more than it
// subscribes.
func TestJudgedNamesAreBoundedBySubscriptions(t *testing.T) {
	const eds = resourcev3.EndpointType
	_, conn := startScripted(t)
	c := cache.New(cache.Options{Retention: time.Nanosecond})
	cl, err := New(Options{Conn: conn, Node: &corepb.Node{Id: "n"}, Cache: c, Metrics: NewMetrics(&metrics.Registry{}),
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	s := &session{c: cl, st: discard{}, subs: map[string]*subscription{}}
	sync := func() {
		t.Helper()
		if err := s.sync(); err != nil {
			t.Fatal(err)
		}
	}
	w := cache.NewWatch()
	for i := range 100 {
		name := fmt.Sprint("missing-", i%10)
		c.Watch(w, eds, name)
		sync()
		s.judge(eds, []string{name})
		c.Unwatch(w, eds, name)
		c.Sweep() // the retention ends: unsubscribed upstream
		sync()
	}
	c.Watch(w, eds, "kept")
	sync()
	s.judge(eds, []string{"kept"})
	s.judge(eds, []string{"kept"}) // again, as after a withdraw on the stream before
	if n := len(s.judged[eds]); n != 1 {
		t.Errorf("the stream holds %d judged names, want 1: the one still subscribed, once", n)
	}
}

// A response that arrives while names wait for a proof of life is that
// proof, and an answer: what it carries is applied before the others are
// judged, and is never reported not to exist on the way
// (docs/architecture.md, invariant 15).
func TestNotFoundResponseAnswersBeforeItProves(t *testing.T) {
	const eds = resourcev3.EndpointType
	h := &health{}
	h.mute.Store(true) // the probe goes unanswered: the response decides
	c := cache.New(cache.Options{Retention: time.Minute})
	var removed atomic.Bool
	wake := make(chan struct{}, 1)
	w := cache.NewWatch()
	w.OnReady(func() { // at every change, on the client's goroutine
		if c.Get(eds, []string{"x"})[0].Absent {
			removed.Store(true)
		}
		select {
		case wake <- struct{}{}:
		default:
		}
	})
	c.Watch(w, eds, "x", "y")
	st := startSilent(t, h, c, 100*time.Millisecond, 10*time.Second)
	if !lookupWithin(t, c, wake, eds, "x", 10*time.Second, isUnavailable) {
		t.Fatalf("x: %+v, want UNAVAILABLE", c.Get(eds, []string{"x"})[0])
	}
	a, err := anypb.New(testcp.Endpoints("x", "127.0.0.1:1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discoverypb.DeltaDiscoveryResponse{TypeUrl: eds, Nonce: "1",
		Resources: []*discoverypb.Resource{{Name: "x", Version: "1", Resource: a}}}); err != nil {
		t.Fatal(err)
	}
	if !lookupWithin(t, c, wake, eds, "y", 10*time.Second, isNotFound) {
		t.Fatalf("y: %+v, want NOT_FOUND once the stream proved alive", c.Get(eds, []string{"y"})[0])
	}
	if l := c.Get(eds, []string{"x"})[0]; l.Resource == nil || l.Error != nil {
		t.Errorf("x: %+v, want the resource the response carried, without an error", l)
	}
	if removed.Load() {
		t.Error("x was reported not to exist on the way to the response that carries it")
	}
}
