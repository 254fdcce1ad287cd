package relay

import (
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	clusterpb "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/xdsrelay/xdsrelay/internal/faultproxy"
	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// tierRecheck is upstream.fallback_recheck in these tests.
const tierRecheck = 300 * time.Millisecond

// tierFallback gives a relay fallback servers after its upstream.address,
// with a fast reconnect and a short recheck.
func tierFallback(addrs ...string) func(*Config) {
	return func(c *Config) {
		fastReconnect(c)
		c.Upstream.Addresses = addrs
		c.Upstream.FallbackRecheck = tierRecheck
	}
}

// tierCluster is cluster name with a connect timeout of seconds.
func tierCluster(name string, seconds int64) *clusterpb.Cluster {
	c := testcp.Cluster(name)
	c.ConnectTimeout.Seconds = seconds
	return c
}

// tierRecvCluster receives on s until cluster name arrives with a connect
// timeout of seconds, within bound; no response on the way may remove
// anything.
func tierRecvCluster(t *testing.T, s *deltaStream, name string, seconds int64, bound time.Duration) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for {
		resp := s.recvWithin(time.Until(deadline))
		if rm := resp.GetRemovedResources(); len(rm) > 0 {
			t.Fatalf("the client was told %v were removed", rm)
		}
		for _, r := range resp.GetResources() {
			c := &clusterpb.Cluster{}
			if err := r.GetResource().UnmarshalTo(c); err != nil {
				t.Fatal(err)
			}
			if r.GetName() == name && c.GetConnectTimeout().GetSeconds() == seconds {
				return
			}
		}
	}
}

// tierServer is the server the relay's only group uses, as /metrics and
// /debug/groups both say; "" while they disagree or there is no group.
func tierServer(t *testing.T, r *Relay, servers ...string) string {
	t.Helper()
	var groups []debugGroup
	getJSON(t, r, "/debug/groups", &groups)
	if len(groups) != 1 || len(groups[0].Upstreams) != 1 {
		return ""
	}
	debug := groups[0].Upstreams[0].Server
	mfs := scrape(t, r)
	inUse := ""
	for _, s := range servers {
		if value(mfs, "xdsrelay_upstream_server", map[string]string{"upstream": "default", "server": s}) == 1 {
			if inUse != "" {
				return "" // two servers in use
			}
			inUse = s
		}
	}
	if inUse != debug {
		return ""
	}
	return inUse
}

// tierHolds fails the test if cond stops holding within d.
func tierHolds(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if !cond() {
			t.Fatalf("%s stopped holding", what)
		}
	}
}

// tierRestart starts a relay in front of upstream listening on addr, the
// address of a relay that was shut down.
func tierRestart(t *testing.T, addr, upstream string, mutate ...func(*Config)) *Relay {
	t.Helper()
	eventually(t, addr+" to be free again", func() bool {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return false
		}
		ln.Close()
		return true
	})
	return startRelay(t, upstream, append(mutate, func(c *Config) { c.Downstream.Address = addr })...)
}

func tierFallbacks(t *testing.T, r *Relay) float64 {
	t.Helper()
	return value(scrape(t, r), "xdsrelay_upstream_fallbacks_total", map[string]string{"upstream": "default"})
}

// Relays in tiers fail over (gRFC A71): a zone relay in front of two
// regional relays stays on the first while its cache holds what clients
// want, moves to the second when a client asks for something not cached,
// and moves back once the first answers again. Its clients keep their
// stream and never lose a resource.
func TestRelayTiersFailOver(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", tierCluster("x", 1), tierCluster("y", 1))
	r1 := startRelay(t, cp.Addr, fastReconnect)
	r2 := startRelay(t, cp.Addr, fastReconnect)
	r1Addr, r2Addr := r1.Addr(), r2.Addr()
	z := startRelay(t, r1Addr, tierFallback(r2Addr))

	c := openDelta(t, z.Addr())
	c.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "c1"), TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"x"}})
	tierRecvCluster(t, c, "x", 1, wait)
	eventually(t, "the zone relay on R1", func() bool { return tierServer(t, z, r1Addr, r2Addr) == r1Addr })

	// R1 goes away. Everything wanted is cached: the zone relay keeps
	// trying R1 and its client is undisturbed.
	shutdown(t, r1)
	waitMetric(t, z, `xdsrelay_upstream_connected{group="`+keyOf("c1")+`"} 0`)
	c.quiet(3 * tierRecheck)
	if n := tierFallbacks(t, z); n != 0 {
		t.Fatalf("%v fallbacks with everything cached", n)
	}
	if s := tierServer(t, z, r1Addr, r2Addr); s != r1Addr {
		t.Fatalf("with everything cached the zone relay uses %q, want R1 %s", s, r1Addr)
	}

	// A name not cached: the zone relay falls back to R2, which serves it.
	c.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"y"}})
	tierRecvCluster(t, c, "y", 1, wait)
	if n := tierFallbacks(t, z); n < 1 {
		t.Errorf("xdsrelay_upstream_fallbacks_total %v, want ≥ 1", n)
	}
	eventually(t, "the zone relay on R2", func() bool { return tierServer(t, z, r1Addr, r2Addr) == r2Addr })

	// R1 comes back on its address and the control plane changes x: the
	// client gets the change and the zone relay returns to R1.
	tierRestart(t, r1Addr, cp.Addr, fastReconnect)
	cp.Set(t, "c1", "2", tierCluster("x", 42), tierCluster("y", 1))
	tierRecvCluster(t, c, "x", 42, wait)
	eventuallyWithin(t, tierRecheck+wait, "the zone relay back on R1", func() bool {
		return tierServer(t, z, r1Addr, r2Addr) == r1Addr
	})
	c.quiet(2 * tierRecheck) // the move back re-sends and removes nothing
}

// A warm cache opens no stream to the fallback server (gRFC A71): with the
// primary down and everything wanted cached, the secondary is left alone;
// a name not cached moves the stream there; the primary, back with a
// change, takes over within a recheck and the secondary's stream is closed.
func TestFallbackWarmCacheOpensNoStream(t *testing.T) {
	p, s := testcp.Start(t), testcp.Start(t)
	p.Set(t, "c1", "1", tierCluster("x", 1))
	s.Set(t, "c1", "1", tierCluster("x", 1), tierCluster("y", 1))
	r := startRelay(t, p.Addr, tierFallback(s.Addr))

	c := openDelta(t, r.Addr())
	c.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "c1"), TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"x"}})
	tierRecvCluster(t, c, "x", 1, wait)

	p.Stop()
	waitMetric(t, r, `xdsrelay_upstream_connected{group="`+keyOf("c1")+`"} 0`)
	reconnects := func() float64 {
		return value(scrape(t, r), "xdsrelay_upstream_reconnects_total", map[string]string{"group": keyOf("c1")})
	}
	before := reconnects()
	tierHolds(t, time.Second, "no stream to the secondary", func() bool { return s.DeltaStreams.Load() == 0 })
	if n := reconnects() - before; n < 3 {
		t.Fatalf("%v reconnects in a second, want several: the window proves nothing", n)
	}
	c.quiet(10 * time.Millisecond) // nothing arrived meanwhile

	c.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"y"}})
	tierRecvCluster(t, c, "y", 1, wait)
	if n := s.DeltaStreams.Load(); n < 1 {
		t.Fatalf("y came with %d streams to the secondary", n)
	}
	watched := func() int { // the secondary's open delta watches for the group
		if info := s.Cache.GetStatusInfo("c1"); info != nil {
			return info.GetNumDeltaWatches()
		}
		return 0
	}
	eventually(t, "the secondary to watch for the relay", func() bool { return watched() > 0 })

	p.Set(t, "c1", "2", tierCluster("x", 42), tierCluster("y", 1))
	p.Restart()
	tierRecvCluster(t, c, "x", 42, tierRecheck+wait)
	eventually(t, "the relay on the primary", func() bool { return tierServer(t, r, p.Addr, s.Addr) == p.Addr })
	eventually(t, "the secondary's stream to close", func() bool { return watched() == 0 })
	c.quiet(2 * tierRecheck)
}

// A zone relay whose link to regional relay R1 goes silent (a partition:
// the connection stays open and carries nothing) finds it out within
// keepalive.time + timeout, moves to R2 for a name it had not cached, and
// returns to R1 once R1 answers again. Its client never sees a removal:
// meanwhile the name is UNAVAILABLE, not gone.
func TestZoneRelayPartitionedFromRegional(t *testing.T) {
	t.Parallel()
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", tierCluster("x", 1), tierCluster("y", 1))
	r1 := startRelay(t, cp.Addr, fastReconnect)
	r2 := startRelay(t, cp.Addr, fastReconnect)
	proxy := startProxy(t, r1.Addr())
	z := startRelay(t, proxy.Addr, tierFallback(r2.Addr()), func(c *Config) {
		c.Upstream.KeepaliveTime, c.Upstream.KeepaliveTimeout = 10*time.Second, 2*time.Second
		c.Upstream.ConnectTimeout, c.Cache.NotFoundTimeout = 2*time.Second, 2*time.Second
	})
	c := openDelta(t, z.Addr())
	c.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "c1"), TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"x"}})
	tierRecvCluster(t, c, "x", 1, wait)

	proxy.Set(faultproxy.Silent, 0)
	start := time.Now()
	c.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"y"}})
	sawUnavailable := false
	deltaUntil(t, c, "y", faultWait, func(got, removed []string, errs map[string]codes.Code) bool {
		if len(removed) > 0 {
			t.Fatalf("the client was told %v were removed", removed)
		}
		sawUnavailable = sawUnavailable || errs["y"] == codes.Unavailable
		return slices.Contains(got, "y")
	})
	t.Logf("y arrived from R2 %v after the partition", time.Since(start))
	if !sawUnavailable {
		t.Error("the client was not told y was UNAVAILABLE while R1 was silent")
	}
	eventually(t, "the zone relay on R2", func() bool { return tierServer(t, z, proxy.Addr, r2.Addr()) == r2.Addr() })

	proxy.Set(faultproxy.Pass, 0)
	eventuallyWithin(t, tierRecheck+faultWait, "the zone relay back on R1", func() bool {
		return tierServer(t, z, proxy.Addr, r2.Addr()) == proxy.Addr
	})
	c.quiet(2 * tierRecheck)
}

// tierErrors receives on s for d and returns the codes of the errors it
// was sent for name; a removal, or a resource, fails the test.
func tierErrors(t *testing.T, s *deltaStream, name string, d time.Duration) []codes.Code {
	t.Helper()
	var got []codes.Code
	for end := time.Now().Add(d); time.Until(end) > 0; {
		var resp *discoverypb.DeltaDiscoveryResponse
		select {
		case r, ok := <-s.resps:
			if !ok {
				t.Fatal("the client's stream ended")
			}
			resp = r
		case <-time.After(time.Until(end)):
			return got
		}
		if len(resp.GetRemovedResources()) > 0 || len(resp.GetResources()) > 0 {
			t.Fatalf("the client was sent %v and told %v were removed", deltaNames(resp), resp.GetRemovedResources())
		}
		for _, e := range resp.GetResourceErrors() {
			if e.GetResourceName().GetName() == name {
				got = append(got, codes.Code(e.GetErrorDetail().GetCode()))
			}
		}
		s.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()})
	}
	return got
}

// Silence is not an answer, across tiers (docs/architecture.md, invariant
// 15): with the top control plane down, the regional relay answers a name
// it has not cached with UNAVAILABLE. For the zone relay that error is
// the answer, whether it speaks delta or SotW to the regional relay: its
// does-not-exist timer passes, many times over, without turning it into
// NOT_FOUND or a removal, and its client keeps being told the name is
// unavailable, nothing else.
func TestTiersKeepUnavailableThroughTheTimer(t *testing.T) {
	for _, protocol := range []string{"delta", "sotw"} {
		t.Run(protocol, func(t *testing.T) { testTiersKeepUnavailableThroughTheTimer(t, protocol) })
	}
}

func testTiersKeepUnavailableThroughTheTimer(t *testing.T, protocol string) {
	cp := testcp.Start(t)
	cp.Stop()
	region := startRelay(t, cp.Addr, fastReconnect)
	const timeout = 200 * time.Millisecond
	zone := startRelay(t, region.Addr(), func(c *Config) { c.Cache.NotFoundTimeout, c.Upstream.Protocol = timeout, protocol })
	c := openDelta(t, zone.Addr())
	c.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "c1"), TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"x"}})
	got := tierErrors(t, c, "x", 10*timeout)
	if !slices.Equal(got, []codes.Code{codes.Unavailable}) {
		t.Fatalf("the zone's client was sent errors %v for x over %v, want [Unavailable]", got, 10*timeout)
	}
	l := zone.groupCache(keyOf("c1")).Get(resourcev3.ClusterType, []string{"x"})[0]
	if l.Absent || l.Error == nil || l.Error.Code != int32(codes.Unavailable) {
		t.Fatalf("the zone relay holds x as %+v, want UNAVAILABLE and not absent", l)
	}
}

// A group names at most maxTiers lower relays; the streams of the others
// are counted in tiers_more, and a name is freed for another relay once its
// streams end. An advertised address longer than maxAdvertised, or with a
// port that is not a number, is not read.
func TestTiersBounded(t *testing.T) {
	long := node("long", "c1")
	setMetadata(long, TierMetadataKey, structpb.NewStringValue(strings.Repeat("a", maxAdvertised)+".example:9901"))
	named := node("named", "c1")
	setMetadata(named, TierMetadataKey, structpb.NewStringValue("10.0.0.7:http"))
	for _, n := range []*corepb.Node{long, named} {
		if got := advertised(n); got != "" {
			t.Errorf("node %s advertises %q", n.GetId(), got)
		}
	}

	r := &Relay{}
	g := &group{id: "g"}
	tier := func(i int) *corepb.Node {
		n := node(fmt.Sprintf("relay-%d", i), "c1")
		setMetadata(n, TierMetadataKey, structpb.NewStringValue(fmt.Sprintf("10.0.%d.%d:9901", i/250, i%250+1)))
		return n
	}
	var leave []func()
	for i := range maxTiers + 3 {
		leave = append(leave, g.joinTierLocked(tier(i)))
	}
	leave = append(leave, g.joinTierLocked(tier(0))) // a second stream of one named
	tiers, more := r.tiersOf([]*group{g})
	if len(tiers) != maxTiers || more != 3 {
		t.Fatalf("%d tiers named, %d more; want %d and 3", len(tiers), more, maxTiers)
	}
	left := map[int]bool{}
	out := func(i int) { leave[i](); left[i] = true }
	out(0)
	if tiers, _ := r.tiersOf([]*group{g}); len(tiers) != maxTiers {
		t.Errorf("relay-0 left with a stream still open: %d tiers named", len(tiers))
	}
	out(len(leave) - 1)
	out(maxTiers)
	tiers, more = r.tiersOf([]*group{g})
	if len(tiers) != maxTiers-1 || more != 2 {
		t.Errorf("after relay-0 and one past the bound left: %d tiers named, %d more; want %d and 2", len(tiers), more, maxTiers-1)
	}
	leave = append(leave, g.joinTierLocked(tier(maxTiers+3)))
	if tiers, _ := r.tiersOf([]*group{g}); len(tiers) != maxTiers {
		t.Errorf("a relay joining below the bound again is not named: %d tiers", len(tiers))
	}
	for i := range leave {
		if !left[i] {
			out(i)
		}
	}
	if tiers, more := r.tiersOf([]*group{g}); len(tiers) != 0 || more != 0 || len(g.tiers) != 0 {
		t.Errorf("every stream left: %d tiers named, %d more, %d kept", len(tiers), more, len(g.tiers))
	}
}
