package loadtest

import (
	"context"
	"sync"
	"sync/atomic"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc/stats"
)

// cpCounts is what the tool's control plane sees of its clients, counted
// as it goes: the xDS streams and the connections open, and the responses
// it sent. Loaded directly, it sees every client; behind a relay, the
// relay's streams (one per group) on its connection.
type cpCounts struct {
	streams, conns, responses atomic.Int64
	// live is the streams open by node.cluster, and those ever opened:
	// what a fleet run reads.
	live openStreams
}

// callbacks count the streams and the responses of go-control-plane's
// server, SotW and delta.
func (c *cpCounts) callbacks() serverv3.Callbacks {
	open := func(kind int64) func(context.Context, int64, string) error {
		return func(_ context.Context, id int64, _ string) error {
			c.streams.Add(1)
			c.live.open(kind, id)
			return nil
		}
	}
	closed := func(kind int64) func(int64, *corepb.Node) {
		return func(id int64, _ *corepb.Node) {
			c.streams.Add(-1)
			c.live.close(kind, id)
		}
	}
	return serverv3.CallbackFuncs{
		StreamOpenFunc: open(0), StreamClosedFunc: closed(0), DeltaStreamOpenFunc: open(1), DeltaStreamClosedFunc: closed(1),
		StreamRequestFunc: func(id int64, r *discoverypb.DiscoveryRequest) error { c.live.node(0, id, r.GetNode()); return nil },
		StreamDeltaRequestFunc: func(id int64, r *discoverypb.DeltaDiscoveryRequest) error {
			c.live.node(1, id, r.GetNode())
			return nil
		},
		StreamResponseFunc: func(context.Context, int64, *discoverypb.DiscoveryRequest, *discoverypb.DiscoveryResponse) {
			c.responses.Add(1)
		},
		StreamDeltaResponseFunc: func(int64, *discoverypb.DeltaDiscoveryRequest, *discoverypb.DeltaDiscoveryResponse) {
			c.responses.Add(1)
		},
	}
}

// connCounter is a gRPC server stats handler that counts open connections.
type connCounter struct{ c *cpCounts }

func (connCounter) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context   { return ctx }
func (connCounter) HandleRPC(context.Context, stats.RPCStats)                         {}
func (connCounter) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }

func (h connCounter) HandleConn(_ context.Context, s stats.ConnStats) {
	switch s.(type) {
	case *stats.ConnBegin:
		h.c.conns.Add(1)
	case *stats.ConnEnd:
		h.c.conns.Add(-1)
	}
}

// ControlPlaneSeen is what the tool's control plane saw of a run: the xDS
// streams and connections open once every client was configured, and
// the responses it sent for the updates. Without a relay in front, one
// stream and one connection per client (or --streams-per-conn) and a
// response per client and update; through a relay, one stream per group
// of clients (upstream.group_by) on one connection, and a response per
// group and update.
type ControlPlaneSeen struct {
	Streams     int64 `json:"streams"`
	Connections int64 `json:"connections"`
	Responses   int64 `json:"responses"` // sent for the updates
	// PerUpdate is Responses divided by the updates.
	PerUpdate float64 `json:"responses_per_update"`
}

// cpCountsOf is the counts of b's control plane, if the tool serves it in
// this process; nil otherwise.
func cpCountsOf(b backend) *cpCounts {
	if x, ok := b.(*xdsBackend); ok {
		if s, ok := x.server.(*cpStack); ok {
			return &s.cp.counts
		}
	}
	return nil
}

// openStreams is a control plane's streams open now, by the node.cluster
// of their first request, and the streams ever opened.
type openStreams struct {
	mu     sync.Mutex
	live   map[[2]int64]string // guarded by mu: {delta 1/SotW 0, id} → node.cluster ("" before the node)
	opened int                 // guarded by mu
}

func (o *openStreams) open(kind, id int64) {
	o.mu.Lock()
	if o.live == nil {
		o.live = map[[2]int64]string{}
	}
	o.live[[2]int64{kind, id}] = ""
	o.opened++
	o.mu.Unlock()
}

func (o *openStreams) node(kind, id int64, n *corepb.Node) {
	if n == nil {
		return
	}
	o.mu.Lock()
	if _, ok := o.live[[2]int64{kind, id}]; ok {
		o.live[[2]int64{kind, id}] = n.GetCluster()
	}
	o.mu.Unlock()
}

func (o *openStreams) close(kind, id int64) {
	o.mu.Lock()
	delete(o.live, [2]int64{kind, id})
	o.mu.Unlock()
}

// count is the streams open by node.cluster, and the streams ever opened.
func (o *openStreams) count() (map[string]int, int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	by := map[string]int{}
	for _, c := range o.live {
		by[c]++
	}
	return by, o.opened
}
