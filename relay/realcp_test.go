package relay

import (
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc/codes"

	"github.com/xdsrelay/xdsrelay/internal/realcp"
	"github.com/xdsrelay/xdsrelay/internal/testcp"
	"github.com/xdsrelay/xdsrelay/upstream"
)

// The relay in front of go-control-plane v0.9.8's own, unmodified server
// (its serverv3.NewServer over cachev3.NewSnapshotCache(true, ...), run as
// a process: internal/realcp), in each of the shapes servers built on it
// take (docs/control-planes.md, "How control planes refuse"): with
// upstream.protocol: auto the relay finds what each speaks, a real gRPC
// client is served through it, and nothing it says calls a server that
// refused "unreachable" (docs/architecture.md, invariant 20 "A refusal is
// an answer").
func TestV098AutoFindsWhatItSpeaks(t *testing.T) {
	for _, tc := range []struct {
		shape   realcp.Shape
		speaks  string
		refused []string // the protocols refused, in order, and in what words
	}{
		// v0.9.8's own: delta is Unknown "not implemented" (as Gloo's).
		{realcp.ShapeADS, "sotw", []string{`delta Unknown "not implemented"`}},
		// Per-type services only (Contour, Cilium): no ADS at all.
		{realcp.ShapePerType, "sotw-per-type", []string{`delta Unimplemented "unknown service`, `sotw Unimplemented "unknown service`}},
		// A server that says Unimplemented, as the spec would.
		{realcp.ShapePolite, "sotw", []string{`delta Unimplemented "delta xDS is not served"`}},
	} {
		t.Run(string(tc.shape), func(t *testing.T) {
			cp := realcp.StartV098(t, tc.shape)
			backend := startBackend(t, "backend-1")
			cp.Set(t, "greeters", "1", testcp.Listener("greeter", "greeter-route"), testcp.Route("greeter-route", "greeter-cluster"),
				testcp.Cluster("greeter-cluster"), testcp.Endpoints("greeter-cluster", backend))
			logs := &logBuffer{}
			r := startRelayLogged(t, cp.Addr, slog.New(slog.NewJSONHandler(logs, nil)))

			cc := grpcXDSClient(t, r.Addr(), "grpc-client-1", "greeters", "xds:///greeter")
			rpcReaches(t, cc, "backend-1", func() { t.Logf("relay log:\n%s", logs) })

			lines := logs.Lines(t, "control plane server refused the protocol; trying the next (upstream.protocol: auto)")
			if len(lines) != len(tc.refused) {
				t.Fatalf("%d refusals logged, want %d:\n%s", len(lines), len(tc.refused), logs)
			}
			for i, want := range tc.refused {
				if got := lines[i]["refused"].(string) + " " + lines[i]["error"].(string); !strings.HasPrefix(got, want) {
					t.Errorf("refusal %d logged as %q, want %q...", i, got, want)
				}
			}
			if n := len(logs.Lines(t, "control plane server speaks "+tc.speaks)); n != 1 {
				t.Errorf("\"control plane server speaks %s\" logged %d times, want once", tc.speaks, n)
			}
			if _, body := get(t, http.DefaultClient, "http://"+r.AdminAddr()+"/readyz"); !strings.Contains(body, "connected, speaks "+tc.speaks) {
				t.Errorf("/readyz says:\n%s\nwant the upstream connected, speaking %s", body, tc.speaks)
			}
			// A refusal auto moved on from is no error once the next answers.
			if _, body := get(t, http.DefaultClient, "http://"+r.AdminAddr()+"/debug/groups"); strings.Contains(body, "last_error") {
				t.Errorf("/debug/groups keeps the refusal as the last error once the stream answers:\n%s", body)
			}
			if strings.Contains(logs.String(), "unreachable") || strings.Contains(logs.String(), "stream ended; reconnecting") {
				t.Errorf("the log calls a server that refused unreachable, or a reconnect:\n%s", logs)
			}
			if n := cp.Count("open /envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"); tc.shape == realcp.ShapeADS && n != 1 {
				t.Errorf("v0.9.8 saw %d delta streams, want the one it refused", n)
			}
		})
	}
}

// upstream.protocol: delta, which v0.9.8 refuses (Unknown "not
// implemented"): the relay keeps to it, and every word it says names the
// refusal and what it does next, never "unreachable": the log (at error,
// once per attempt), /readyz to anyone and to a private caller, and a
// client's per-resource error (gRFC A88).
func TestV098RefusesTheConfiguredProtocol(t *testing.T) {
	cp := realcp.StartV098(t, realcp.ShapeADS)
	cp.Set(t, "c1", "1", testcp.Cluster("a"))
	logs := &logBuffer{}
	r := startRelayLogged(t, cp.Addr, slog.New(slog.NewJSONHandler(logs, nil)), func(c *Config) {
		c.Upstream.Protocol = "delta"
		c.Admin.ReadyAfterSync = true
	})

	d := openDelta(t, r.Addr())
	d.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n1", "c1"), TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"a"}})
	resp := d.recvWithin(10 * time.Second)
	errs := resp.GetResourceErrors()
	if len(errs) != 1 || errs[0].GetErrorDetail().GetCode() != int32(codes.Unavailable) || len(resp.GetRemovedResources()) > 0 {
		t.Fatalf("the client got %v, want UNAVAILABLE for a", resp)
	}
	msg := errs[0].GetErrorDetail().GetMessage()
	for _, want := range []string{`refused delta with Unknown "not implemented"`, "upstream.protocol: delta", "asks again after the backoff"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the client's error %q does not say %q", msg, want)
		}
	}
	if strings.Contains(msg, "unreachable") {
		t.Errorf("the client's error calls the server unreachable: %q", msg)
	}

	code, public := get(t, &http.Client{Transport: &http.Transport{Proxy: nil}}, "http://"+r.AdminAddr()+"/readyz")
	t.Logf("/readyz: %d %s", code, public)
	if !strings.Contains(public, "refused") || strings.Contains(public, "unreachable") || strings.Contains(public, "cannot be reached") {
		t.Errorf("/readyz says %q, want the refusal", public)
	}
	lines := logs.Lines(t, "control plane server refused the protocol; asking again after the backoff")
	if len(lines) == 0 || !strings.Contains(lines[0]["refused"].(string), `refused delta with Unknown "not implemented"`) {
		t.Errorf("the log does not say the refusal:\n%s", logs)
	}
	if strings.Contains(logs.String(), "unreachable") {
		t.Errorf("the log calls the server unreachable:\n%s", logs)
	}
	if n := cp.Count("open /envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"); n != 0 {
		t.Errorf("%d SotW streams with upstream.protocol: delta", n)
	}
}

// With admin.ready_after_sync, a relay whose control plane refuses the
// configured protocol is never ready, before any client came: a refusal
// of the dialect is a configuration error, and a rolling update stops at
// its first new pod. Readiness asks the server, in that dialect, before
// any group exists; /readyz (503) and the log say the refusal. With auto
// the same server is found to speak SotW first, and the relay is ready.
func TestV098ReadinessRefusedProtocol(t *testing.T) {
	cp := realcp.StartV098(t, realcp.ShapeADS)
	for _, tc := range []struct {
		protocol string
		ready    bool
	}{{"delta", false}, {"auto", true}} {
		t.Run(tc.protocol, func(t *testing.T) {
			logs := &logBuffer{}
			r := startRelayLogged(t, cp.Addr, slog.New(slog.NewJSONHandler(logs, nil)), func(c *Config) {
				c.Upstream.Protocol = tc.protocol
				c.Admin.ReadyAfterSync = true
			})
			noProxy := &http.Client{Transport: &http.Transport{Proxy: nil}}
			var code int
			var body string
			eventually(t, "/readyz to decide", func() bool {
				code, body = get(t, noProxy, "http://"+r.AdminAddr()+"/readyz")
				return code == http.StatusOK || strings.Contains(body, "refuse")
			})
			if !tc.ready {
				if code != http.StatusServiceUnavailable || !strings.Contains(body, `refused delta with Unknown "not implemented"`) ||
					!strings.Contains(body, "upstream.protocol") {
					t.Fatalf("/readyz: %d %q; want 503 with the refusal", code, body)
				}
				// It stays so: a second look, after the relay looked again.
				eventually(t, "the refusal logged", func() bool {
					return strings.Contains(logs.String(), "not ready: waiting for the first upstream sync") &&
						strings.Contains(logs.String(), `refused delta with Unknown`)
				})
				if code, body = get(t, noProxy, "http://"+r.AdminAddr()+"/readyz"); code != http.StatusServiceUnavailable {
					t.Errorf("/readyz later: %d %q", code, body)
				}
				return
			}
			if code != http.StatusOK {
				t.Fatalf("/readyz: %d %q; want ready", code, body)
			}
			if n := len(logs.Lines(t, "control plane server refused the protocol; trying the next (upstream.protocol: auto)")); n != 1 {
				t.Errorf("%d refusals logged before ready, want delta's:\n%s", n, logs)
			}
		})
	}
}

// A control plane that keys its config by node answers nothing to a node
// it does not know: go-control-plane v0.9.8's snapshot cache (here keyed
// by node.cluster) given a group whose node it has no snapshot for. A
// whole cache.not_found_timeout after the group's stream asked, the log
// warns once, naming the node id presented and upstream.node.id, and the
// private /readyz says it; a group the control plane answers is not
// warned of.
func TestV098UnknownNodeIsSaid(t *testing.T) {
	cp := realcp.StartV098(t, realcp.ShapeADS)
	cp.Set(t, "known", "1", testcp.Cluster("a"))
	logs := &logBuffer{}
	r := startRelayLogged(t, cp.Addr, slog.New(slog.NewJSONHandler(logs, nil)), func(c *Config) {
		c.Cache.NotFoundTimeout = 300 * time.Millisecond
	})
	const warning = upstream.UnheardWarning
	known := openDelta(t, r.Addr())
	known.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n1", "known"), TypeUrl: resourcev3.ClusterType})
	if resp := known.recvWithin(10 * time.Second); len(resp.GetResources()) != 1 {
		t.Fatalf("the known group got %v", resp)
	}
	unknown := openDelta(t, r.Addr())
	unknown.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n2", "nobody"), TypeUrl: resourcev3.ClusterType})
	eventually(t, "the warning", func() bool { return len(logs.Lines(t, warning)) > 0 })
	lines := logs.Lines(t, warning)
	if len(lines) != 1 || !strings.Contains(lines[0]["node_id"].(string), "cluster=nobody") || lines[0]["key"] != "upstream.node.id" ||
		lines[0]["group"] == nil || !strings.Contains(lines[0]["group"].(string), "nobody") {
		t.Fatalf("warned %v, want once, for the unknown group, with its node id and upstream.node.id", lines)
	}
	code, body := get(t, &http.Client{Transport: &http.Transport{Proxy: nil}}, "http://"+r.AdminAddr()+"/readyz")
	if code != http.StatusOK || !strings.Contains(body, "no answer 300ms after it was asked for Cluster; node id presented") {
		t.Errorf("/readyz: %d %q; want the unknown group's silence said", code, body)
	}
}
