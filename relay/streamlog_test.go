package relay

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// startLoggedRelay is startRelay with the relay's log, at debug, in a buffer.
func startLoggedRelay(t *testing.T, upstream string) (*Relay, *logBuffer) {
	t.Helper()
	log := &logBuffer{}
	r := startRelayLogged(t, upstream, slog.New(slog.NewJSONHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug})))
	return r, log
}

// recvUntilEnd receives until the stream ends and checks how.
func recvUntilEnd(t *testing.T, recv func() error, want codes.Code) {
	t.Helper()
	for {
		if err := recv(); err != nil {
			if grpcstatus.Code(err) != want {
				t.Fatalf("stream ended with %v, want %v", err, want)
			}
			return
		}
	}
}

const endedMsg = "stream ended with an error"

// Every stream the relay ends with an error status is logged once, at
// warn, with the node, variant, type, code and message; client-provided
// texts are cut to a bound. Streams that end the ordinary way (the client
// closes or cancels, the relay drains at shutdown) are logged at debug.
func TestStreamEndsAreLogged(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("x"))
	r, log := startLoggedRelay(t, cp.Addr)

	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	ads := discoverypb.NewAggregatedDiscoveryServiceClient(dial(t, r.Addr()))
	badType, err := ads.StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := badType.Send(&discoverypb.DiscoveryRequest{Node: node("bad-type", "c1"), TypeUrl: "type.googleapis.com/not.a.Type"}); err != nil {
		t.Fatal(err)
	}
	recvUntilEnd(t, func() error { _, err := badType.Recv(); return err }, codes.InvalidArgument)

	huge := strings.Repeat("n", 100<<10)
	changed, err := ads.DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, req := range []*discoverypb.DeltaDiscoveryRequest{
		{Node: node("changed", "c1"), TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"x"}},
		{TypeUrl: resourcev3.ClusterType, ErrorDetail: &rpcstatus.Status{Code: 3, Message: huge}},
		{Node: node(huge, "c1"), TypeUrl: resourcev3.ClusterType},
	} {
		if err := changed.Send(req); err != nil {
			t.Fatal(err)
		}
	}
	recvUntilEnd(t, func() error { _, err := changed.Recv(); return err }, codes.InvalidArgument)

	lines := log.Lines(t, endedMsg)
	want := []map[string]string{
		{"node": "bad-type", "variant": "sotw-ads", "type": "type.googleapis.com/not.a.Type", "code": "InvalidArgument", "level": "WARN"},
		{"node": "changed", "variant": "delta-ads", "type": "Cluster", "code": "InvalidArgument", "level": "WARN"},
	}
	if len(lines) != len(want) {
		t.Fatalf("%d %q lines, want %d: %v", len(lines), endedMsg, len(want), lines)
	}
	for i, w := range want {
		for k, v := range w {
			if lines[i][k] != v {
				t.Errorf("line %d: %s = %v, want %q", i, k, lines[i][k], v)
			}
		}
	}
	if msg, _ := lines[0]["message"].(string); !strings.Contains(msg, "unknown resource type") {
		t.Errorf("message %q does not say why", msg)
	}
	if msg, _ := lines[1]["message"].(string); !strings.Contains(msg, "node changed") || len(msg) > 1100 {
		t.Errorf("message of %d bytes, want a clipped node-changed message", len(msg))
	}
	nack := log.Lines(t, "client rejected a response")
	if errText, _ := nack[0]["error"].(string); len(nack) != 1 || len(errText) > 1100 {
		t.Errorf("NACK lines %d, error of %d bytes: want one, clipped", len(nack), len(errText))
	}
	// A client NACKing over and over is logged within the rate limit, and
	// every NACK is counted.
	nacker := openSotW(t, r.Addr())
	nacker.send(&discoverypb.DiscoveryRequest{Node: node("nacker", "c1"), TypeUrl: resourcev3.ClusterType})
	resp := nacker.recv()
	before := len(log.Lines(t, "client rejected a response"))
	for range 60 {
		nacker.send(&discoverypb.DiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResponseNonce: resp.GetNonce(),
			ErrorDetail: &rpcstatus.Status{Code: 3, Message: "no"}})
	}
	waitMetric(t, r, `xdsrelay_downstream_nacks_total{type="Cluster"} 61`)
	if n := len(log.Lines(t, "client rejected a response")) - before; n < 1 || n > 25 {
		t.Errorf("%d NACK lines for 60 NACKs: want them rate limited (at most a burst of 20 and a few more)", n)
	}
	// Once lines pass again, the first says how many were left out.
	const suppressed = "warnings about clients' NACKs were suppressed by the rate limit"
	eventually(t, "the count of the NACK lines left out", func() bool {
		nacker.send(&discoverypb.DiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResponseNonce: resp.GetNonce(),
			ErrorDetail: &rpcstatus.Status{Code: 3, Message: "no"}})
		time.Sleep(20 * time.Millisecond)
		return len(log.Lines(t, suppressed)) > 0
	})
	if sup := log.Lines(t, suppressed); len(sup) != 1 || sup[0]["suppressed"] == nil || sup[0]["suppressed"].(float64) < 20 {
		t.Errorf("suppressed-count lines %v: want one, counting the NACK lines the flood left out (about 40)", sup)
	}

	// Ordinary ends: the client closes its side, cancels, or the relay
	// drains at shutdown.
	closed := openSotW(t, r.Addr())
	closed.send(&discoverypb.DiscoveryRequest{Node: node("closed", "c1"), TypeUrl: resourcev3.ClusterType})
	closed.recv()
	if err := closed.st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	ended(t, closed)
	cancelled := openDelta(t, r.Addr())
	cancelled.send(&discoverypb.DeltaDiscoveryRequest{Node: node("cancelled", "c1"), TypeUrl: resourcev3.ClusterType})
	cancelled.recv()
	cancelled.close()
	drained := openDelta(t, r.Addr())
	drained.send(&discoverypb.DeltaDiscoveryRequest{Node: node("drained", "c1"), TypeUrl: resourcev3.ClusterType})
	drained.recv()
	shutdown(t, r) // returns once every stream has ended
	if n := len(log.Lines(t, endedMsg)); n != len(want) {
		t.Fatalf("%d %q lines after ordinary ends, want still %d", n, endedMsg, len(want))
	}
	debug := map[string]bool{}
	for _, l := range log.Lines(t, "stream ended") {
		if l["level"] == "DEBUG" {
			debug[l["node"].(string)] = true
		}
	}
	for _, n := range []string{"closed", "cancelled", "drained"} {
		if !debug[n] {
			t.Errorf("no debug line for the stream of %s", n)
		}
	}
}

// A NACK's log line names what was rejected: the first resource the
// rejected response carried, at the version it was sent, and how many,
// whether the client is delta (whose NACK carries no version) or SotW
// (whose version_info is the one it kept).
func TestNACKLogNamesTheVersion(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("x"))
	r, log := startLoggedRelay(t, cp.Addr)
	version := func() string {
		for _, res := range r.snapshotGroups()[0].cache.Get(resourcev3.ClusterType, []string{"x"}) {
			if res.Resource != nil {
				return res.Resource.Version
			}
		}
		return ""
	}

	d := openDelta(t, r.Addr())
	d.send(&discoverypb.DeltaDiscoveryRequest{Node: node("delta", "c1"), TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"x"}})
	resp := d.recv()
	d.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResponseNonce: resp.GetNonce(), ErrorDetail: &rpcstatus.Status{Code: 3, Message: "no"}})
	s := openSotW(t, r.Addr())
	s.send(&discoverypb.DiscoveryRequest{Node: node("sotw", "c1"), TypeUrl: resourcev3.ClusterType, ResourceNames: []string{"x"}})
	sresp := s.recv()
	s.send(&discoverypb.DiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResponseNonce: sresp.GetNonce(), ResourceNames: []string{"x"},
		ErrorDetail: &rpcstatus.Status{Code: 3, Message: "no"}})
	eventually(t, "two NACK lines", func() bool { return len(log.Lines(t, "client rejected a response")) == 2 })
	for _, l := range log.Lines(t, "client rejected a response") {
		if l["rejected"] != "x at "+version() || l["resources"] != 1.0 {
			t.Errorf("NACK line %v; want rejected \"x at %s\", 1 resource", l, version())
		}
	}
}
