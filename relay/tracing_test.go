package relay

import (
	"slices"
	"testing"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// named returns the ended spans called name, in the order they ended.
func named(rec *tracetest.SpanRecorder, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func attr(s sdktrace.ReadOnlySpan, key string) attribute.Value {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// One upstream change is one trace: an upstream.receive root with the
// cache.apply as its child, and a downstream.push per client that is sent
// it, each linked to the receive (pushes run later, on the send workers,
// so they are links, not children).
func TestTraceFollowsOneUpdate(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithSpanProcessor(rec)))
	t.Cleanup(func() { otel.SetTracerProvider(prev) })

	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Endpoints("a", "10.0.0.1:80"))
	r := startRelay(t, cp.Addr, func(c *Config) { c.Tracing = true })
	var streams []*deltaStream
	for _, id := range []string{"n1", "n2"} {
		s := openDelta(t, r.Addr())
		s.send(&discoverypb.DeltaDiscoveryRequest{Node: node(id, "c1"), TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: []string{"a"}})
		s.recv()
		s.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResponseNonce: "1"})
		streams = append(streams, s)
	}
	cp.Set(t, "c1", "2", testcp.Endpoints("a", "10.0.0.2:80"))
	for _, s := range streams {
		if got := deltaNames(s.recv()); !slices.Equal(got, []string{"a"}) {
			t.Fatalf("after the change: %v", got)
		}
	}
	// A receive span ends after the ACK upstream, which may follow the
	// clients' receipt: the change's span is found by its version.
	var receives []sdktrace.ReadOnlySpan
	eventually(t, "the change's upstream.receive span", func() bool {
		receives = receives[:0]
		for _, s := range named(rec, "upstream.receive") {
			if attr(s, "xds.version").AsString() == "2" {
				receives = append(receives, s)
			}
		}
		return len(receives) > 0
	})
	if len(receives) != 1 {
		t.Fatalf("%d upstream.receive spans for one change, want 1", len(receives))
	}
	recv := receives[0]
	if recv.Parent().IsValid() {
		t.Errorf("upstream.receive has parent %v, want a root", recv.Parent())
	}
	if got := attr(recv, "xds.type").AsString(); got != "ClusterLoadAssignment" {
		t.Errorf("upstream.receive xds.type = %q", got)
	}
	if attr(recv, "xds.version").AsString() != "2" || attr(recv, "xds.resources").AsInt64() != 1 || attr(recv, "xds.bytes").AsInt64() <= 0 {
		t.Errorf("upstream.receive attributes: %v", recv.Attributes())
	}
	var applies int
	for _, s := range named(rec, "cache.apply") {
		if s.Parent().SpanID() == recv.SpanContext().SpanID() && s.SpanContext().TraceID() == recv.SpanContext().TraceID() {
			applies++
		}
	}
	if applies != 1 {
		t.Errorf("%d cache.apply children of the receive, want 1", applies)
	}

	// The pushes end just after the write: the clients may read first.
	var pushes []sdktrace.ReadOnlySpan
	eventually(t, "two pushes linked to the receive", func() bool {
		pushes = pushes[:0]
		for _, s := range named(rec, "downstream.push") {
			for _, l := range s.Links() {
				if l.SpanContext.TraceID() == recv.SpanContext().TraceID() && l.SpanContext.SpanID() == recv.SpanContext().SpanID() {
					pushes = append(pushes, s)
				}
			}
		}
		return len(pushes) >= 2
	})
	var nodes []string
	for _, p := range pushes {
		if p.Parent().IsValid() {
			t.Errorf("downstream.push has parent %v, want a root linked to the receive", p.Parent())
		}
		if attr(p, "xds.type").AsString() != "ClusterLoadAssignment" || attr(p, "xds.resources").AsInt64() != 1 || attr(p, "xds.variant").AsString() == "" {
			t.Errorf("downstream.push attributes: %v", p.Attributes())
		}
		nodes = append(nodes, attr(p, "xds.node").AsString())
	}
	slices.Sort(nodes)
	if !slices.Equal(nodes, []string{"n1", "n2"}) {
		t.Errorf("pushes to %v, want one to each of n1 and n2", nodes)
	}
}
