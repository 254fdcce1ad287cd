package relay

import (
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// A control plane that serves one type (go-control-plane's LinearCache, its
// only cache) ends a stream that asks it for another with Unknown "request
// type X does not match cache type Y" (docs/architecture.md, invariant 20
// "A refusal is an answer"). The relay fetches the endpoints its Clusters
// name on its own; it learns that the server does not serve them and asks
// no more: with one client watching CDS, the control plane sees at most 2
// streams in 10 quiet seconds (the first, ended when the relay asked the
// endpoints, and the one opened again without them), and the client has
// its Clusters.
func TestOneTypeControlPlaneSeesTwoStreams(t *testing.T) {
	cp := testcp.StartOneType(t, resourcev3.ClusterType)
	cp.Set(t, testcp.Cluster("a"), testcp.Cluster("b"))
	logs := &logBuffer{}
	r := startRelayLogged(t, cp.Addr, slog.New(slog.NewJSONHandler(logs, nil)))

	d := openDelta(t, r.Addr())
	d.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n1", "c1"), TypeUrl: resourcev3.ClusterType,
		ResourceNamesSubscribe: []string{"*"}})
	if got := collectDelta(d, 2); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("the client's Clusters: %v, want [a b]", got)
	}
	atMostStreams(t, cp, 2, 10*time.Second)
	if m := getMetrics(t, r); !strings.Contains(m, `xdsrelay_upstream_unserved_types{server="`+cp.Addr+`",type="ClusterLoadAssignment",upstream="default"} 1`) {
		t.Errorf("xdsrelay_upstream_unserved_types does not show the endpoints refused")
	}
	if n := len(logs.Lines(t, "control plane server does not serve a type; not asked of it again")); n != 1 {
		t.Errorf("the refusal was logged %d times, want once", n)
	}
	if body := readyz(t, r); !strings.Contains(body, "connected, speaks delta, does not serve ClusterLoadAssignment (not asked of it)") {
		t.Errorf("/readyz does not say what the server does not serve:\n%s", body)
	}
	var groups []debugGroup
	getJSON(t, r, "/debug/groups", &groups)
	if len(groups) != 1 || len(groups[0].Upstreams) != 1 || !slices.Equal(groups[0].Upstreams[0].Unserved, []string{"ClusterLoadAssignment"}) {
		t.Errorf("/debug/groups: %+v, want the upstream's unserved [ClusterLoadAssignment]", groups)
	}
	// The Clusters keep flowing on the stream opened again.
	cp.Set(t, testcp.Cluster("c"))
	if got := deltaNames(d.recv()); !slices.Equal(got, []string{"c"}) {
		t.Fatalf("after the refusal, the client got %v, want [c]", got)
	}
}

// A client that asks a one-type control plane's relay for the other type
// gets an answer, not a loop: UNAVAILABLE in resource_errors (gRFC A88),
// naming what was refused; a SotW client whose first request asks only for
// it has its stream ended with that status (gRFC A57). The control plane
// sees the one stream that refused it and the one opened again.
func TestOneTypeOtherTypeIsAnswered(t *testing.T) {
	cp := testcp.StartOneType(t, resourcev3.ClusterType)
	cp.Set(t, testcp.Cluster("a"))
	r := startRelay(t, cp.Addr)

	d := openDelta(t, r.Addr())
	d.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n1", "c1"), TypeUrl: resourcev3.EndpointType,
		ResourceNamesSubscribe: []string{"a"}})
	resp := d.recvWithin(5 * time.Second)
	errs := resp.GetResourceErrors()
	if len(errs) != 1 || errs[0].GetResourceName().GetName() != "a" || errs[0].GetErrorDetail().GetCode() != int32(codes.Unavailable) ||
		len(resp.GetRemovedResources()) > 0 {
		t.Fatalf("the delta client asking for endpoints got %v, want UNAVAILABLE for a", resp)
	}
	if msg := errs[0].GetErrorDetail().GetMessage(); !strings.Contains(msg, "does not serve ClusterLoadAssignment") ||
		strings.Contains(msg, "unreachable") {
		t.Errorf("the error says %q, want what was refused, not \"unreachable\"", msg)
	}
	s := openSotW(t, r.Addr())
	s.send(&discoverypb.DiscoveryRequest{Node: node("n2", "c1"), TypeUrl: resourcev3.EndpointType, ResourceNames: []string{"a"}})
	if err := ended(t, s); status.Code(err) != codes.Unavailable {
		t.Fatalf("the SotW client asking for endpoints alone: %v, want UNAVAILABLE", err)
	}
	atMostStreams(t, cp, 2, 3*time.Second)
}

// atMostStreams fails as soon as the control plane has seen more than max
// streams, watching it for window.
func atMostStreams(t *testing.T, cp *testcp.OneType, max int64, window time.Duration) {
	t.Helper()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	end := time.After(window)
	for {
		if n := cp.Streams.Load(); n > max {
			t.Fatalf("the control plane saw %d streams, want at most %d in %v", n, max, window)
		}
		select {
		case <-tick.C:
		case <-end:
			return
		}
	}
}

// Over state of the world too, ADS or the per-type services, the one-type
// server's refusal is learned: on ADS the stream is opened again without
// the endpoints; per type, only the endpoints' stream ends, and the
// Clusters' keeps running. Either way the control plane sees at most 2
// streams.
func TestOneTypeControlPlaneInSotW(t *testing.T) {
	for _, p := range []string{"sotw", "sotw-per-type"} {
		t.Run(p, func(t *testing.T) {
			cp := testcp.StartOneType(t, resourcev3.ClusterType)
			cp.Set(t, testcp.Cluster("a"), testcp.Cluster("b"))
			r := startRelay(t, cp.Addr, func(c *Config) { c.Upstream.Protocol = p })
			d := openDelta(t, r.Addr())
			d.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n1", "c1"), TypeUrl: resourcev3.ClusterType,
				ResourceNamesSubscribe: []string{"*"}})
			if got := collectDelta(d, 2); !slices.Equal(got, []string{"a", "b"}) {
				t.Fatalf("the client's Clusters: %v, want [a b]", got)
			}
			waitMetric(t, r, `xdsrelay_upstream_unserved_types{server="`+cp.Addr+`",type="ClusterLoadAssignment",upstream="default"} 1`)
			atMostStreams(t, cp, 2, 3*time.Second)
			cp.Set(t, testcp.Cluster("c"))
			if got := deltaNames(d.recv()); !slices.Equal(got, []string{"c"}) {
				t.Fatalf("after the refusal, the client got %v, want [c]", got)
			}
		})
	}
}

// What a server was found to speak is forgotten once a stream to it fails
// without an answer: a SotW-only server replaced, at the same address, by
// one that speaks delta is spoken to in delta.
func TestDialectFoundAgainAfterARestart(t *testing.T) {
	cp := testcp.StartDialect(t, testcp.DialectSotW)
	cp.Set(t, "c1", "1", testcp.Cluster("a"))
	r := startRelay(t, cp.Addr, fastReconnect)
	d := openDelta(t, r.Addr())
	d.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n1", "c1"), TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"a"}})
	d.recv()
	eventually(t, "the relay to speak sotw", func() bool { return upstreamProtocol(t, r) == "sotw" })
	cp.Stop()
	eventually(t, "a stream to fail without an answer", func() bool {
		var groups []debugGroup
		getJSON(t, r, "/debug/groups", &groups)
		return len(groups) == 1 && strings.Contains(groups[0].LastError, "connection refused")
	})
	cp.RestartAs(testcp.DialectDelta)
	eventually(t, "the relay to open a delta stream to the new server", func() bool { return cp.DeltaStreams.Load() > 0 })
	if got := upstreamProtocol(t, r); got == "sotw" {
		t.Errorf("/debug/groups says the upstream speaks %q", got)
	}
}
