package relay

import (
	"context"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/lockorder/lockcheck"
	"github.com/xdsrelay/xdsrelay/internal/testlog"
)

func TestMain(m *testing.M) { lockcheck.Main(m) }

// wait bounds every wait in these tests.
const wait = 10 * time.Second

func testLogger() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// startRelay runs a relay in front of upstream until the test ends.
func startRelay(t testing.TB, upstream string, mutate ...func(*Config)) *Relay {
	t.Helper()
	return startRelayLogged(t, upstream, testLogger(), mutate...)
}

// startRelayLogged is startRelay with the relay's log going to logger.
func startRelayLogged(t testing.TB, upstream string, logger *slog.Logger, mutate ...func(*Config)) *Relay {
	t.Helper()
	cfg := Default()
	cfg.Upstream.Address = upstream
	cfg.Downstream.Address = "127.0.0.1:0"
	cfg.Admin.Address = "127.0.0.1:0"
	cfg.Cache.Retention = time.Minute
	cfg.LRS.MinInterval = time.Millisecond // tests' control planes ask for periods of tens of ms
	// Most tests shut a relay down with clients connected: a second of
	// grace each is the package's time, not what they test.
	cfg.hooks.drainGrace = 200 * time.Millisecond
	for _, m := range mutate {
		m(&cfg)
	}
	r, err := New(cfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			if err := r.Shutdown(ctx); err != nil {
				t.Errorf("shutdown: %v", err)
			}
		})
	}
	shutdowns.Store(r, stop)
	t.Cleanup(stop)
	return r
}

// logBuffer collects a relay's JSON log lines.
type logBuffer = testlog.Buffer

// shutdowns holds, for each relay started by startRelay, its one shutdown.
var shutdowns sync.Map

// shutdown stops a relay started by startRelay before the test ends.
func shutdown(t *testing.T, r *Relay) {
	t.Helper()
	stop, _ := shutdowns.Load(r)
	stop.(func())()
}

func dial(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// stream is a client stream whose responses arrive on a channel, so that a
// test can wait for one with a bound, or prove that none comes.
type stream[Req, Resp any] struct {
	t      testing.TB
	st     grpc.BidiStreamingClient[Req, Resp]
	resps  chan *Resp
	cancel context.CancelFunc
	done   chan struct{}
	end    error // why Recv failed; set before done is closed
}

func newStream[Req, Resp any](t testing.TB, open func(context.Context, ...grpc.CallOption) (grpc.BidiStreamingClient[Req, Resp], error)) *stream[Req, Resp] {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	st, err := open(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	s := &stream[Req, Resp]{t: t, st: st, resps: make(chan *Resp, 100), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		defer close(s.resps)
		for {
			r, err := st.Recv()
			if err != nil {
				s.end = err
				return
			}
			s.resps <- r
		}
	}()
	t.Cleanup(s.close)
	return s
}

// ended waits, within wait, for the stream's receiver to see the stream
// end, and returns why it ended.
func ended[Req, Resp any](t *testing.T, s *stream[Req, Resp]) error {
	t.Helper()
	select {
	case <-s.done:
		return s.end
	case <-time.After(wait):
		t.Fatal("the stream did not end in time")
	}
	return nil
}

func (s *stream[Req, Resp]) close() {
	s.cancel()
	<-s.done
}

func (s *stream[Req, Resp]) send(r *Req) {
	s.t.Helper()
	if err := s.st.Send(r); err != nil {
		s.t.Fatalf("send: %v", err)
	}
}

// recv returns the next response, failing the test if none comes in time.
func (s *stream[Req, Resp]) recv() *Resp {
	s.t.Helper()
	return s.recvWithin(wait)
}

// recvWithin is recv with another bound, for large tests.
func (s *stream[Req, Resp]) recvWithin(bound time.Duration) *Resp {
	s.t.Helper()
	select {
	case r, ok := <-s.resps:
		if !ok {
			s.t.Fatalf("stream ended while waiting for a response: %v", s.end)
		}
		return r
	case <-time.After(bound):
		s.t.Fatal("no response in time")
	}
	return nil
}

// quiet fails the test if a response arrives within d.
func (s *stream[Req, Resp]) quiet(d time.Duration) {
	s.t.Helper()
	select {
	case r, ok := <-s.resps:
		if ok {
			s.t.Fatalf("unexpected response: %v", r)
		}
	case <-time.After(d):
	}
}

type (
	deltaStream = stream[discoverypb.DeltaDiscoveryRequest, discoverypb.DeltaDiscoveryResponse]
	sotwStream  = stream[discoverypb.DiscoveryRequest, discoverypb.DiscoveryResponse]
)

func openDelta(t *testing.T, addr string) *deltaStream {
	return newStream(t, discoverypb.NewAggregatedDiscoveryServiceClient(dial(t, addr)).DeltaAggregatedResources)
}

func openSotW(t *testing.T, addr string) *sotwStream {
	return newStream(t, discoverypb.NewAggregatedDiscoveryServiceClient(dial(t, addr)).StreamAggregatedResources)
}

func node(id, cluster string) *corepb.Node { return &corepb.Node{Id: id, Cluster: cluster} }

// eventually polls cond until it holds, failing the test after wait.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	eventuallyWithin(t, wait, what, cond)
}

// eventuallyWithin is eventually with its own bound. A wait longer than
// wait is for something that takes seconds (a keepalive, a recheck): it
// polls every 50ms, so that its scrapes do not take a core from the tests
// that run beside it.
func eventuallyWithin(t *testing.T, bound time.Duration, what string, cond func() bool) {
	t.Helper()
	poll := 5 * time.Millisecond
	if bound > wait {
		poll = 50 * time.Millisecond
	}
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(poll)
	}
}

// groupCache returns the cache of the group with key, nil if there is none.
func (r *Relay) groupCache(key string) *cache.Cache {
	r.mu.Lock()
	defer r.mu.Unlock()
	if g := r.groups[key]; g != nil {
		return g.cache
	}
	return nil
}

// keyOf is the group key, under the default upstream.group_by, of the
// clients of node.cluster cluster that send no user agent and no features
// (as node does).
func keyOf(cluster string) string {
	return GroupKey(&corepb.Node{Cluster: cluster}, Default().Upstream.GroupBy)
}
