package relay

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/downstream"
	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// loadNames is how many Clusters the group of BenchmarkLoadReportsStart
// wants.
const loadNames = 100_000

// BenchmarkLoadReportsStart starts, over and over, the load reports of a
// group that wants loadNames Clusters, with several upstreams: the
// reports go to the upstream that serves the group's Clusters, which
// Relay.loadRoute finds by reading every name. Beside the time of
// JoinLoads, it reports the longest another goroutine waited for Relay.mu
// meanwhile (relay-mu-wait-ns/op, the mean over the starts): what a Join
// of any group, an admin read or the sweeper would wait.
func BenchmarkLoadReportsStart(b *testing.B) {
	def, other := testcp.Start(b), testcp.Start(b)
	r := startRelay(b, def.Addr, withUpstream("mesh-b", other.Addr, nil, []string{"mesh-b"}))
	n := lrsNode("envoy-1", "c1", "z1")
	c, leave, err := r.Join(n, downstream.Caller{Variant: "delta-ads"})
	if err != nil {
		b.Fatal(err)
	}
	defer leave()
	// Names under an authority no upstream lists: each is read as any
	// other, and no control plane is asked for 100,000 names.
	names := make([]string, loadNames)
	for i := range names {
		names[i] = fmt.Sprintf("xdstp://nowhere/envoy.config.cluster.v3.Cluster/c-%06d", i)
	}
	w := cache.NewWatch()
	if err := c.Watch(w, resourcev3.ClusterType, names...); err != nil {
		b.Fatal(err)
	}
	defer c.Release(w)
	r.mu.Lock()
	g := r.groups[GroupKey(n, r.cfg.Upstream.GroupBy)]
	r.mu.Unlock()
	var waited time.Duration
	for b.Loop() {
		b.StopTimer()
		stopReporter(r, g)
		stop := probeRelayMu(r)
		b.StartTimer()
		_, leaveLoads, err := r.JoinLoads(n, downstream.Caller{Variant: "lrs"})
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		waited += stop()
		leaveLoads()
		b.StartTimer()
	}
	b.ReportMetric(float64(waited.Nanoseconds())/float64(b.N), "relay-mu-wait-ns/op")
}

// stopReporter ends g's load reporter, if one runs, and waits for it.
func stopReporter(r *Relay, g *group) {
	r.mu.Lock()
	var done chan struct{}
	if l := g.loads; l != nil && l.reporter != nil {
		l.cancel()
		l.reporter, l.cancel, done = nil, nil, l.done
	}
	r.mu.Unlock()
	if done != nil {
		<-done
	}
}

// probeRelayMu takes and releases r.mu over and over until stop, which
// returns the longest it waited for it.
func probeRelayMu(r *Relay) (stop func() time.Duration) {
	quit, done := make(chan struct{}), make(chan struct{})
	var longest time.Duration
	go func() {
		defer close(done)
		for {
			select {
			case <-quit:
				return
			default:
			}
			t0 := time.Now()
			r.mu.Lock()
			d := time.Since(t0)
			r.mu.Unlock()
			longest = max(longest, d)
			runtime.Gosched()
		}
	}()
	return func() time.Duration {
		close(quit)
		<-done
		return longest
	}
}
