package downstream

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/xdsrelay/xdsrelay/cache"
)

// sendSlow reports whether a send has been blocked for slowSend (the
// watchdog saw it), on a stream's handler goroutine or on a pool worker.
// As the watchdog, it collects the sends under the pool's watchMu and
// looks at each after releasing it (docs/architecture.md, "Locks").
func sendSlow(s *Server) bool {
	var guards []*sendGuard
	s.sends.watchMu.Lock()
	for sl := range s.sends.slots {
		if g := sl.g.Load(); g != nil {
			guards = append(guards, g)
		}
	}
	s.sends.watchMu.Unlock()
	for _, g := range guards {
		g.mu.Lock()
		slow := g.sending && g.slow
		g.mu.Unlock()
		if slow {
			return true
		}
	}
	return false
}

// A send blocked on a stream's handler goroutine (the flush of its own
// request) strands no other stream of its connection: a change marked
// meanwhile for another stream of that connection reaches it, although
// that stream sends no request and nothing else is queued (a signal is
// never lost, docs/architecture.md, invariant 5).
func TestSlowHandlerSendStrandsNoStreamOfItsConnection(t *testing.T) {
	const cds = resourcev3.ClusterType
	c := cache.New(cache.Options{Retention: time.Hour})
	var big []*cache.Resource
	var names []string
	for i := range 8 {
		names = append(names, fmt.Sprint("big-", i))
		big = append(big, encoded(t, cds, names[i], "1", 64<<10))
	}
	s, any := serveOn(t, Options{Groups: oneGroup{c}, SendTimeout: time.Minute})
	// One connection, whose streams' windows are small and fixed: the
	// stream that does not read blocks its own sends, not the others'.
	cc := smallWindows(t, any.Target())
	ads := discoverypb.NewAggregatedDiscoveryServiceClient(cc)

	// The reading stream wants x and the big ones, which the cache then
	// holds.
	good := openStream(t, ads.DeltaAggregatedResources)
	good.send(&discoverypb.DeltaDiscoveryRequest{Node: &corepb.Node{Id: "good"}, TypeUrl: cds,
		ResourceNamesSubscribe: append([]string{"x"}, names...)})
	watched(t, c, cds, append(slices.Clone(names), "x")...)
	c.Apply(cds, cache.Change{Upserts: append(big, encoded(t, cds, "x", "1", 0))})
	for got := 0; got < len(names)+1; {
		resp := good.recv()
		got += len(resp.GetResources())
		good.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: cds, ResponseNonce: resp.GetNonce()})
	}

	// The stuck stream asks for 256 KiB it never reads, then for 256 KiB
	// more: gRPC takes the first response whole, and the handler's flush
	// of the second request blocks until the first is written.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stuck, err := ads.DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stuck.Send(&discoverypb.DeltaDiscoveryRequest{Node: &corepb.Node{Id: "stuck"}, TypeUrl: cds, ResourceNamesSubscribe: names[:4]}); err != nil {
		t.Fatal(err)
	}
	if err := stuck.Send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: cds, ResourceNamesSubscribe: names[4:]}); err != nil {
		t.Fatal(err)
	}
	// Which goroutine flushes the second request is the scheduler's: most
	// often the handler (the case this test was written for), sometimes a
	// pool worker that took the stream's mark first. Neither may strand
	// the reading stream.
	eventually(t, "the stuck stream's send to be blocked for slowSend", func() bool { return sendSlow(s) })

	c.Apply(cds, cache.Change{Upserts: []*cache.Resource{encoded(t, cds, "x", "2", 0)}})
	if got := good.recv(); len(got.GetResources()) != 1 || got.GetResources()[0].GetVersion() != "2" {
		t.Fatalf("the reading stream got %v, want x at version 2", got)
	}
}
