package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
	"github.com/xdsrelay/xdsrelay/relay"
)

// freeAddr is a loopback address nothing listens on, for an admin
// endpoint that must be advertised before it listens.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// tierRelay starts a relay in front of upstream whose admin endpoint is
// advertised to it (admin.advertise_address), speaking protocol to it.
func startTierRelay(t *testing.T, upstream, protocol string) *relay.Relay {
	t.Helper()
	cfg := relay.Default()
	cfg.Upstream.Address, cfg.Upstream.Protocol = upstream, protocol
	cfg.Downstream.Address = "127.0.0.1:0"
	cfg.Admin.Address = freeAddr(t)
	cfg.Admin.AdvertiseAddress = cfg.Admin.Address
	return startRelayConfig(t, cfg)
}

// advertisingClient is a delta client of addr whose node advertises admin
// as a lower relay's admin endpoint, subscribed to every Cluster, ACKing
// what it is sent.
func advertisingClient(t *testing.T, addr, id, admin string) {
	t.Helper()
	md, _ := structpb.NewStruct(map[string]any{relay.TierMetadataKey: admin})
	_, st, run := clusterStream(t, addr, &corepb.Node{Id: id, Cluster: "c1", Metadata: md})
	run(func() {
		for {
			resp, err := st.Recv()
			if err != nil || st.Send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()}) != nil {
				return
			}
		}
	})
}

// Three tiers: a SotW control plane, relay A in front of it, relay B (delta)
// in front of A, relay C (SotW) in front of B, each advertising its admin
// endpoint upstream, with real delta clients at every tier (two at C).
// `xdsrelay wait --tiers` asks A and counts the four clients at the leaves
// in place of B and C; without --tiers, A's clients (node-a and B's two
// groups' streams) are all it knows. A client of C that never answers:
// wait at A says converged, wait --tiers times out naming C's pending
// client. A change that a client of C rejects: wait at A alone
// says converged (B accepted it, and so did C), wait --tiers exits 1 naming
// the client at the bottom and its error. The version the control plane
// gave (version_info) is found at every tier through the upstream version
// beside each version. A lower relay that cannot be reached is not
// converged, and is named.
func TestWaitTiers(t *testing.T) {
	cp := testcp.StartDialect(t, testcp.DialectSotW)
	cp.Set(t, "c1", "cp-1", timedCluster(time.Second))
	cfg := relay.Default()
	cfg.Upstream.Address = cp.Addr
	cfg.Downstream.Address, cfg.Admin.Address = "127.0.0.1:0", "127.0.0.1:0"
	a := startRelayConfig(t, cfg)
	b := startTierRelay(t, a.Addr(), "delta")
	c := startTierRelay(t, b.Addr(), "sotw")
	clients := []*judge{acceptingClient(t, a.Addr(), "node-a"), acceptingClient(t, b.Addr(), "node-b"),
		acceptingClient(t, c.Addr(), "node-c1"), judgingClient(t, c.Addr(), "node-c2")}
	for _, j := range clients {
		j.wait(t, "1s")
	}
	top := a.AdminAddr()
	wait := func(args ...string) (int, string) {
		t.Helper()
		code, out, errOut := runCLI(append([]string{"wait", "--admin", top, "--type", "clusters"}, args...)...)
		return code, out + errOut
	}

	// At A: node-a and B's two groups (node-b's, and C's, which presents
	// the relay's client features), one upstream stream each.
	if code, out := wait("--timeout", "20s"); code != 0 || out != "3 of 3 clients accepted\n" {
		t.Fatalf("wait at the top: exit %d, %q", code, out)
	}
	if code, out := wait("--tiers", "--timeout", "20s"); code != 0 || out != "4 of 4 clients accepted\n" {
		t.Fatalf("wait --tiers: exit %d, %q", code, out)
	}
	if code, out := wait("--version", "cp-1", "--timeout", "20s"); code != 0 || out != "3 of 3 clients accepted\n" {
		t.Fatalf("wait at the top for the control plane's version_info: exit %d, %q", code, out)
	}
	if code, out := wait("--tiers", "--version", "cp-1", "--timeout", "20s"); code != 0 || out != "4 of 4 clients accepted\n" {
		t.Fatalf("wait --tiers for the control plane's version_info: exit %d, %q", code, out)
	}

	// A client at the bottom that is sent the version and never answers:
	// the tiers above accepted it; --tiers waits for that client, and says
	// where it is.
	stop := silentClient(t, c.Addr(), "node-silent")
	if code, out := wait("--timeout", "20s"); code != 0 || out != "3 of 3 clients accepted\n" {
		t.Fatalf("wait at the top with a silent client at the bottom: exit %d, %q", code, out)
	}
	code, out := wait("--tiers", "--timeout", "1s")
	if code != 1 || !strings.Contains(out, "4 of 5 clients accepted after 1s") || !strings.Contains(out, c.AdminAddr()+" (a lower relay of ") ||
		!strings.Contains(out, "2/3 accepted, 1 pending") {
		t.Fatalf("wait --tiers with a silent client at the bottom: exit %d, %q", code, out)
	}
	stop()
	eventually(t, func() string {
		sum := 0
		for _, s := range convergenceAt(t, c.AdminAddr()).Summary {
			sum += s.Subscribed
		}
		if sum != 2 {
			return fmt.Sprintf("C counts %d clients, not 2: the silent one is not forgotten", sum)
		}
		return ""
	})

	cp.Set(t, "c1", "cp-2", timedCluster(13*time.Second)) // node-c2, at the bottom, NACKs it
	for _, j := range clients {
		j.wait(t, "13s")
	}
	if code, out := wait("--timeout", "20s"); code != 0 || out != "3 of 3 clients accepted\n" {
		t.Fatalf("wait at the top after a change the bottom rejects: exit %d, %q; the tiers above accepted it", code, out)
	}
	for _, args := range [][]string{{"--tiers"}, {"--tiers", "--version", "cp-2"}} {
		code, out := wait(append(args, "--timeout", "20s")...)
		t.Logf("wait %q: exit %d\n%s", args, code, out)
		if code != 1 || !strings.Contains(out, "1 of 4 clients rejected") || !strings.Contains(out, `1 rejected: "13s is too slow" by node-c2`) ||
			!strings.Contains(out, c.AdminAddr()+" (a lower relay of "+b.AdminAddr()) {
			t.Fatalf("wait %q after a change the bottom rejects: exit %d, %q", args, code, out)
		}
	}

	// A lower relay nobody answers at: not converged, and named.
	gone := freeAddr(t)
	advertisingClient(t, b.Addr(), "node-gone", gone)
	eventually(t, func() string {
		if !slices.ContainsFunc(convergenceAt(t, b.AdminAddr()).Tiers, func(l relay.ConvergenceTier) bool { return l.Admin == gone }) {
			return "B does not list the lower relay at " + gone
		}
		return ""
	})
	code, out = wait("--tiers", "--fraction", "0.5", "--timeout", "2s")
	t.Logf("wait --tiers with a lower relay gone: exit %d\n%s", code, out)
	if code != 1 || !strings.Contains(out, gone+" (a lower relay of "+b.AdminAddr()) {
		t.Fatalf("wait --tiers with a lower relay that does not answer: exit %d, %q", code, out)
	}
}

// convergenceAt is a relay's /debug/convergence.
func convergenceAt(t *testing.T, server string) relay.DebugConvergence {
	t.Helper()
	resp, err := http.Get("http://" + server + "/debug/convergence")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var dc relay.DebugConvergence
	if err := json.NewDecoder(resp.Body).Decode(&dc); err != nil {
		t.Fatal(err)
	}
	return dc
}

// silentClient is a delta client of addr subscribed to every Cluster that
// reads what it is sent and never answers; it returns once it was sent
// something, and stop ends its stream.
func silentClient(t *testing.T, addr, id string) (stop func()) {
	t.Helper()
	_, st, run := clusterStream(t, addr, &corepb.Node{Id: id, Cluster: "c1"})
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	return run(func() {
		for {
			if _, err := st.Recv(); err != nil {
				return
			}
		}
	})
}

// Through a SotW tier under a delta control plane: the control plane's
// version of a resource does not cross it (the relay below versions what
// it is sent over SotW by its bytes), but the hash of the bytes the relay
// above tells does, and wait --tiers finds the version at the bottom,
// asked for by the control plane's version or not.
func TestWaitTiersThroughSotW(t *testing.T) {
	cp := testcp.StartDialect(t, testcp.DialectDelta)
	cp.Set(t, "c1", "cp-1", timedCluster(time.Second))
	cfg := relay.Default()
	cfg.Upstream.Address = cp.Addr
	cfg.Downstream.Address, cfg.Admin.Address = "127.0.0.1:0", "127.0.0.1:0"
	a := startRelayConfig(t, cfg)
	b := startTierRelay(t, a.Addr(), "sotw")
	for _, j := range []*judge{acceptingClient(t, a.Addr(), "node-a"), acceptingClient(t, b.Addr(), "node-b1"), acceptingClient(t, b.Addr(), "node-b2")} {
		j.wait(t, "1s")
	}
	var top relay.ConvergenceResource
	eventually(t, func() string {
		rs := convergenceAt(t, a.AdminAddr()).Resources // in node-a's group and in B's
		if len(rs) != 2 || rs[0].Version != rs[1].Version || rs[0].Version == "" {
			return fmt.Sprintf("A lists %+v, want the cluster in two groups at one version", rs)
		}
		top = rs[0]
		return ""
	})
	if code, out, _ := runCLI("wait", "--admin", a.AdminAddr(), "--type", "clusters", "--timeout", "20s"); code != 0 || out != "2 of 2 clients accepted\n" {
		t.Fatalf("wait at A: exit %d, %q; want node-a and B", code, out)
	}
	below := convergenceAt(t, b.AdminAddr()).Resources
	if len(below) != 1 || below[0].Version == top.Version {
		t.Fatalf("the cluster at A %q, at B over SotW %+v: want another version below", top.Version, below)
	}
	for _, args := range [][]string{{}, {"--version", top.Version}} {
		code, out, errOut := runCLI(append([]string{"wait", "--admin", a.AdminAddr(), "--type", "clusters", "--tiers", "--timeout", "20s"}, args...)...)
		if code != 0 || out != "3 of 3 clients accepted\n" {
			t.Fatalf("wait --tiers %q through a SotW tier: exit %d, %q%s", args, code, out, errOut)
		}
	}
}

// wait --tiers asks at most tierDepth tiers below the relays it is given
// and tierRelays relays in all; a lower relay past either bound, and the
// streams a relay counts past the lower relays it names, are not
// converged, and are named.
func TestWaitTiersBounds(t *testing.T) {
	var f waitFlags
	listing := func(depth, n, more int) *tierRelay {
		dc := &relay.DebugConvergence{TiersMore: more}
		for i := range n {
			dc.Tiers = append(dc.Tiers, relay.ConvergenceTier{Group: "g", Node: fmt.Sprintf("n%d", i), Admin: fmt.Sprintf("10.0.%d.%d:9901", i/250, i%250+1)})
		}
		return &tierRelay{af: adminFlags{server: "above:9901"}, depth: depth, dc: dc}
	}

	var c waitCount
	if next := f.below(listing(tierDepth-1, 1, 0), nil, map[string]*tierRelay{}, 1, &c); len(next) != 1 || next[0].depth != tierDepth || len(c.unknown) != 0 {
		t.Errorf("a relay %d tiers down: asked %d, unknown %q; want it asked", tierDepth, len(next), c.unknown)
	}
	c = waitCount{}
	if next := f.below(listing(tierDepth, 1, 0), nil, map[string]*tierRelay{}, 1, &c); len(next) != 0 || len(c.unknown) != 1 || !strings.Contains(c.unknown[0], fmt.Sprintf("deeper than %d tiers", tierDepth)) {
		t.Errorf("a relay %d tiers down: asked %d, unknown %q; want it named, not asked", tierDepth+1, len(next), c.unknown)
	}

	c = waitCount{}
	next := f.below(listing(0, tierRelays+4, 2), nil, map[string]*tierRelay{}, 1, &c)
	if len(next) != tierRelays-1 {
		t.Errorf("%d lower relays asked below one, want %d", len(next), tierRelays-1)
	}
	var over, past int
	for _, u := range c.unknown {
		switch {
		case strings.Contains(u, fmt.Sprintf("more than %d relays, not asked", tierRelays)):
			over++
		case strings.Contains(u, "2 streams of lower relays past the bound"):
			past++
		}
	}
	if over != 5 || past != 1 || len(c.unknown) != 6 {
		t.Errorf("unknown %d lines (%d over the relays, %d past the bound), want 5 and 1", len(c.unknown), over, past)
	}

	// What is not counted is named up to waitShown relays, then counted.
	c = waitCount{}
	f.below(listing(0, tierRelays+30, 0), nil, map[string]*tierRelay{}, 1, &c)
	var out strings.Builder
	c.print(&out)
	if len(c.unknown) != waitShown || c.unknownMore != 31-waitShown || !strings.Contains(out.String(), fmt.Sprintf("... and %d more not counted\n", 31-waitShown)) {
		t.Errorf("31 relays not asked: %d named, %d more; printed %q", len(c.unknown), c.unknownMore, out.String())
	}
}
