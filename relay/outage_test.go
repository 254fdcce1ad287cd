package relay

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

func fastReconnect(c *Config) {
	c.Upstream.ReconnectBaseDelay = 20 * time.Millisecond
	c.Upstream.ReconnectMaxDelay = 100 * time.Millisecond
}

func readyz(t *testing.T, r *Relay) string {
	t.Helper()
	resp, err := http.Get("http://" + r.AdminAddr() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/readyz: %d %s", resp.StatusCode, b)
	}
	return string(b)
}

// Outages are not outages: with the control plane killed, clients keep their
// streams and configuration and new clients are served from the cache; when
// it comes back with a changed and a deleted resource, the relay resumes with
// initial_resource_versions and clients get exactly the difference.
func TestUpstreamOutage(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("x"), testcp.Cluster("y"), testcp.Cluster("keep"))
	r := startRelay(t, cp.Addr, fastReconnect)

	old := openDelta(t, r.Addr())
	old.send(&discoverypb.DeltaDiscoveryRequest{Node: node("old", "c1"), TypeUrl: resourcev3.ClusterType})
	if got := deltaNames(old.recv()); !slices.Equal(got, []string{"keep", "x", "y"}) {
		t.Fatalf("before the outage: %v", got)
	}

	cp.Stop()
	eventually(t, "the relay to notice the outage", func() bool {
		return strings.Contains(readyz(t, r), "upstream DOWN")
	})
	if m := getMetrics(t, r); !strings.Contains(m, `xdsrelay_upstream_connected{group="`+keyOf("c1")+`"} 0`) {
		t.Errorf("/metrics does not show the group's upstream down:\n%s", m)
	}
	old.quiet(100 * time.Millisecond) // the stream stays open, nothing is taken away

	late := openSotW(t, r.Addr())
	late.send(&discoverypb.DiscoveryRequest{Node: node("late", "c1"), TypeUrl: resourcev3.ClusterType})
	if got := sotwClusters(t, late.recv()); !slices.Equal(got, []string{"keep", "x", "y"}) {
		t.Fatalf("a new client during the outage got %v", got)
	}

	changed := testcp.Cluster("x")
	changed.ConnectTimeout.Seconds = 42
	cp.Set(t, "c1", "2", changed, testcp.Cluster("keep"))
	streamsBefore := cp.DeltaStreams.Load()
	cp.Restart()

	var sent, removed []string
	for !slices.Contains(sent, "x") || !slices.Contains(removed, "y") {
		resp := old.recv()
		sent = append(sent, deltaNames(resp)...)
		removed = append(removed, resp.GetRemovedResources()...)
	}
	if slices.Contains(sent, "keep") {
		t.Errorf("the unchanged resource was re-sent: %v", sent)
	}
	if got := sotwClusters(t, late.recv()); !slices.Equal(got, []string{"keep", "x"}) {
		t.Errorf("SotW client after the outage: %v", got)
	}
	eventually(t, "the relay to see the control plane again", func() bool {
		return strings.Contains(readyz(t, r), "upstream connected")
	})
	if n := cp.DeltaStreams.Load() - streamsBefore; n != 1 {
		t.Errorf("%d upstream streams after the restart, want 1", n)
	}
	// The resumed stream told the control plane what the relay had.
	var resumed *discoverypb.DeltaDiscoveryRequest
	for _, req := range cp.Requests() {
		if len(req.GetInitialResourceVersions()) > 0 {
			resumed = req
		}
	}
	if resumed == nil || len(resumed.GetInitialResourceVersions()) != 3 {
		t.Fatalf("resumed without the cached versions: %v", resumed)
	}
}

// Updates keep flowing while the control plane flaps: clients end at its
// final state.
func TestUpstreamFlapping(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "0", testcp.Endpoints("a", "10.0.0.0:80"))
	r := startRelay(t, cp.Addr, fastReconnect)
	s := openDelta(t, r.Addr())
	s.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "c1"), TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: []string{"a"}})
	s.recv()
	for i := 1; i <= 5; i++ {
		cp.Stop()
		cp.Set(t, "c1", fmt.Sprint(i), testcp.Endpoints("a", fmt.Sprintf("10.0.0.%d:80", i)))
		time.Sleep(30 * time.Millisecond) // let the relay see the outage
		cp.Restart()
		cp.Set(t, "c1", fmt.Sprint(i)+"b", testcp.Endpoints("a", fmt.Sprintf("10.0.1.%d:80", i)))
	}
	want := r.groupCache(keyOf("c1"))
	eventually(t, "the client to reach the final state", func() bool {
		l := want.Get(resourcev3.EndpointType, []string{"a"})[0]
		return l.Resource != nil && strings.Contains(string(l.Resource.Any), "10.0.1.5")
	})
	final := want.Get(resourcev3.EndpointType, []string{"a"})[0].Resource.Version
	for {
		resp := s.recv()
		if len(resp.GetResources()) == 1 && resp.GetResources()[0].GetVersion() == final {
			break
		}
	}
}

// A reconnect storm costs the control plane nothing: hundreds of clients
// dropping and coming back open no upstream stream and subscribe nothing.
func TestReconnectStorm(t *testing.T) {
	const clients = 200
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("x"), testcp.Endpoints("a", "10.0.0.1:80"))
	r := startRelay(t, cp.Addr)
	connect := func() []*deltaStream {
		var ss []*deltaStream
		for i := range clients {
			s := openDelta(t, r.Addr())
			s.send(&discoverypb.DeltaDiscoveryRequest{Node: node(fmt.Sprint("n", i), "c1"), TypeUrl: resourcev3.ClusterType})
			s.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: []string{"a"}})
			ss = append(ss, s)
		}
		for _, s := range ss {
			s.recv()
			s.recv()
		}
		return ss
	}
	first := connect()
	streams, requests := cp.DeltaStreams.Load(), cp.DeltaRequests.Load()
	for _, s := range first {
		s.close()
	}
	connect()
	if n := cp.DeltaStreams.Load(); n != streams {
		t.Errorf("the storm opened %d upstream streams", n-streams)
	}
	if n := cp.DeltaRequests.Load(); n != requests {
		t.Errorf("the storm sent %d upstream requests", n-requests)
	}
}

// Fallback and return (gRFC A71): with the primary refusing connections at
// start, clients are served from the secondary (upstream.addresses); once
// the primary is up, the group moves back to it within
// upstream.fallback_recheck and clients get the primary's version with no
// removal in between; the secondary's stream is then closed.
func TestUpstreamFailover(t *testing.T) {
	// Each server's protocol is found on its own: the fallback speaks
	// another dialect than the primary.
	forEachDialect(t, func(t *testing.T, d testcp.Dialect) {
		testUpstreamFailover(t, d, testcp.Dialects[(slices.Index(testcp.Dialects, d)+1)%len(testcp.Dialects)])
	})
}

func testUpstreamFailover(t *testing.T, primaryDialect, secondaryDialect testcp.Dialect) {
	primary := testcp.StartDialect(t, primaryDialect)
	changed := testcp.Cluster("x")
	changed.ConnectTimeout = durationpb.New(7 * time.Second) // another version of x
	primary.Set(t, "c1", "2", changed, testcp.Cluster("only-primary"))
	primary.Stop() // its address now refuses connections
	secondary := testcp.StartDialect(t, secondaryDialect)
	secondary.Set(t, "c1", "1", testcp.Cluster("x"), testcp.Cluster("only-secondary"))
	r := startRelay(t, primary.Addr, fastReconnect, func(c *Config) {
		c.Upstream.Addresses = []string{secondary.Addr}
		c.Upstream.FallbackRecheck = 200 * time.Millisecond
	})
	s := openDelta(t, r.Addr())
	s.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "c1"), TypeUrl: resourcev3.ClusterType,
		ResourceNamesSubscribe: []string{"x", "only-primary", "only-secondary"}})
	got := map[string]string{}
	ack := func(resp *discoverypb.DeltaDiscoveryResponse) {
		if len(resp.GetRemovedResources()) > 0 && !slices.Equal(resp.GetRemovedResources(), []string{"only-secondary"}) {
			t.Fatalf("a removal the primary did not make: %v", resp.GetRemovedResources())
		}
		for _, res := range resp.GetResources() {
			got[res.GetName()] = res.GetVersion()
		}
		s.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()})
	}
	for got["x"] == "" || got["only-secondary"] == "" {
		ack(s.recv())
	}
	if m := getMetrics(t, r); !strings.Contains(m, fmt.Sprintf(`xdsrelay_upstream_server{server=%q,upstream="default"} 1`, secondary.Addr)) ||
		!strings.Contains(m, `xdsrelay_upstream_fallbacks_total{upstream="default"} 1`) {
		t.Fatalf("/metrics does not show the fallback:\n%s", m)
	}
	fromSecondary := got["x"]

	primary.Restart()
	deadline := time.Now().Add(wait)
	for got["x"] == fromSecondary || got["only-primary"] == "" {
		if time.Now().After(deadline) {
			t.Fatalf("never got the primary's resources: %v", got)
		}
		ack(s.recv())
	}
	eventually(t, "the group to use the primary again", func() bool {
		m := getMetrics(t, r)
		return strings.Contains(m, fmt.Sprintf(`xdsrelay_upstream_server{server=%q,upstream="default"} 1`, primary.Addr)) &&
			strings.Contains(m, fmt.Sprintf(`xdsrelay_upstream_server{server=%q,upstream="default"} 0`, secondary.Addr))
	})
	if d := readyz(t, r); !strings.Contains(d, "server "+primary.Addr+", connected") {
		t.Errorf("/readyz does not show the primary in use:\n%s", d)
	}
}

// A control plane that comes back with nothing new sends nothing on the
// resumed stream: the relay still reports it connected once the stream is
// open and subscribed, not only once it answers.
func TestUpstreamBackWithNothingNewIsConnected(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("x"))
	r := startRelay(t, cp.Addr, fastReconnect)
	s := openDelta(t, r.Addr())
	s.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "c1"), TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"x"}})
	s.recv()
	cp.Stop()
	waitMetric(t, r, `xdsrelay_upstream_connected{group="`+keyOf("c1")+`"} 0`)
	requests := cp.DeltaRequests.Load()
	cp.Restart()
	waitMetric(t, r, `xdsrelay_upstream_connected{group="`+keyOf("c1")+`"} 1`)
	if !strings.Contains(readyz(t, r), "upstream connected") {
		t.Errorf("/readyz:\n%s", readyz(t, r))
	}
	if cp.DeltaRequests.Load() == requests {
		t.Error("the relay did not resume on the control plane")
	}
	s.quiet(100 * time.Millisecond) // and the client is sent nothing
}
