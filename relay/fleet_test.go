package relay

import (
	"context"
	"crypto/ecdsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/rand/v2"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clusterpb "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/xdsrelay/xdsrelay/downstream"
	"github.com/xdsrelay/xdsrelay/fleet"
	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// fleetTimeout is upstream.connect_timeout in the fleet tests: a member
// that stops answering is out of the others' views within it.
const fleetTimeout = time.Second

// fleetPort is a port free on 127.0.0.1 now, for members each on its own
// loopback address (127.0.0.N) and this one port.
func fleetPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}

// fleetAddrs are n members' addresses: 127.0.0.1 to 127.0.0.n on one port.
func fleetAddrs(port string, n int) []string {
	var out []string
	for i := range n {
		out = append(out, net.JoinHostPort("127.0.0."+strconv.Itoa(i+1), port))
	}
	return out
}

// hosts are the hosts of addrs, as a name resolves to them.
func hosts(addrs []string) []string {
	var out []string
	for _, a := range addrs {
		h, _, _ := net.SplitHostPort(a)
		out = append(out, h)
	}
	return out
}

// inFleet makes a relay member i of the members at addrs, which it knows
// by the name "peers.fleet.test", resolved by resolve (to every member's
// host if nil).
func inFleet(addrs []string, i int, resolve func() []string) func(*Config) {
	return func(c *Config) {
		fastReconnect(c)
		c.Downstream.Address = addrs[i]
		_, port, _ := net.SplitHostPort(addrs[i])
		c.Fleet.Peers = []string{net.JoinHostPort("peers.fleet.test", port)}
		c.Fleet.Self = addrs[i]
		c.Fleet.Refresh = 50 * time.Millisecond
		c.Fleet.Balance = false
		c.Upstream.ConnectTimeout = fleetTimeout
		c.Upstream.FallbackRecheck = 300 * time.Millisecond
		if resolve == nil {
			resolve = func() []string { return hosts(addrs) }
		}
		c.hooks.resolve = func(context.Context, string) ([]string, error) { return resolve(), nil }
	}
}

// startFleetOf starts a relay for each of addrs in front of cp, and waits
// until each sees them all.
func startFleetOf(t *testing.T, cp *testcp.ControlPlane, addrs []string, mutate ...func(*Config)) []*Relay {
	t.Helper()
	var rs []*Relay
	for i := range addrs {
		rs = append(rs, startRelay(t, cp.Addr, append([]func(*Config){inFleet(addrs, i, nil)}, mutate...)...))
	}
	for _, r := range rs {
		eventually(t, "every member in the view of "+r.Addr(), func() bool { return len(viewOf(r)) == len(addrs) })
	}
	return rs
}

func viewOf(r *Relay) []string { return r.fleet.members.View().Members }

// fleetGroups are n groups' clusters, g0 to g(n-1), each serving one
// Cluster c-gN, version version, its connect timeout version seconds.
func fleetGroups(t *testing.T, cp *testcp.ControlPlane, n int, version int) []string {
	t.Helper()
	var out []string
	for i := range n {
		out = append(out, "g"+strconv.Itoa(i))
	}
	setGroups(t, cp, out, version)
	return out
}

// setGroups sets each group's Cluster c-GROUP at version.
func setGroups(t *testing.T, cp *testcp.ControlPlane, groups []string, version int) {
	t.Helper()
	for _, g := range groups {
		cp.Set(t, g, strconv.Itoa(version), tierCluster("c-"+g, int64(version)))
	}
}

// splitGroups are n groups, half of them owned by member i of addrs in
// the view of them all, half by the others.
func splitGroups(addrs []string, i, n int) []string {
	ring := fleet.NewRing(slices.Sorted(slices.Values(addrs)))
	var mine, others []string
	for j := 0; len(mine) < n/2 || len(others) < n-n/2; j++ {
		g := "g" + strconv.Itoa(j)
		if ring.Owner(keyOf(g)) == addrs[i] {
			if len(mine) < n/2 {
				mine = append(mine, g)
			}
		} else if len(others) < n-n/2 {
			others = append(others, g)
		}
	}
	return append(mine, others...)
}

// fleetClient is a delta client of a group on a relay.
type fleetClient struct {
	relay, group string
	s            *deltaStream
}

// openFleetClients opens, on every relay, a client of every group, and
// waits for each to have its Cluster at version.
func openFleetClients(t *testing.T, rs []*Relay, groups []string, version int64) []*fleetClient {
	t.Helper()
	return openFleetClientsOn(t, rs, groups, version, func(addr string) *grpc.ClientConn { return dial(t, addr) })
}

// openFleetClientsOn is openFleetClients over the connections dial makes.
func openFleetClientsOn(t *testing.T, rs []*Relay, groups []string, version int64, dial func(string) *grpc.ClientConn) []*fleetClient {
	t.Helper()
	var out []*fleetClient
	for _, r := range rs {
		for _, g := range groups {
			s := newStream(t, discoverypb.NewAggregatedDiscoveryServiceClient(dial(r.Addr())).DeltaAggregatedResources)
			s.send(&discoverypb.DeltaDiscoveryRequest{Node: node("envoy-"+g+"@"+r.Addr(), g), TypeUrl: resourcev3.ClusterType,
				ResourceNamesSubscribe: []string{"c-" + g}})
			out = append(out, &fleetClient{relay: r.Addr(), group: g, s: s})
		}
	}
	for _, c := range out {
		fleetRecv(t, c, version)
	}
	return out
}

// fleetRecv waits for c's Cluster at version, ACKing what comes; nothing
// on the way may be a removal, or the same version again.
func fleetRecv(t *testing.T, c *fleetClient, version int64) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		resp := c.s.recvWithin(time.Until(deadline))
		c.s.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResponseNonce: resp.GetNonce()})
		if rm := resp.GetRemovedResources(); len(rm) > 0 {
			t.Fatalf("%s on %s was told %v were removed", c.group, c.relay, rm)
		}
		for _, r := range resp.GetResources() {
			got := &clusterpb.Cluster{}
			if err := r.GetResource().UnmarshalTo(got); err != nil {
				t.Fatal(err)
			}
			if got.GetConnectTimeout().GetSeconds() == version {
				return
			}
		}
	}
}

// cpStreams is the control plane's open streams of the groups, by group.
func cpStreams(cp *testcp.ControlPlane, groups []string) map[string]int {
	open := cp.Open()
	out := map[string]int{}
	for _, g := range groups {
		out[g] = open[g]
	}
	return out
}

// oneStreamEach reports whether the control plane holds exactly one
// stream for each group.
func oneStreamEach(cp *testcp.ControlPlane, groups []string) bool {
	for _, n := range cpStreams(cp, groups) {
		if n != 1 {
			return false
		}
	}
	return true
}

// holdsFor fails the test unless cond holds throughout d.
func holdsFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if !cond() {
			t.Fatalf("%s stopped holding", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The proof of one fetch: three relays that know each other, and a client
// of each of six groups on every one. The control plane holds exactly one
// stream per group; a change reaches every client on every replica; when
// one replica stops, the other replicas' clients see no removal and
// nothing sent again unchanged, and the control plane again holds one
// stream per group.
func TestFleetFetchesEachGroupOnce(t *testing.T) {
	cp := testcp.Start(t)
	groups := fleetGroups(t, cp, 6, 1)
	rs := startFleetOf(t, cp, fleetAddrs(fleetPort(t), 3))
	clients := openFleetClients(t, rs, groups, 1)
	eventually(t, "one stream per group at the control plane", func() bool { return oneStreamEach(cp, groups) })
	holdsFor(t, 500*time.Millisecond, "one stream per group", func() bool { return oneStreamEach(cp, groups) })
	checkSources(t, rs, groups)
	checkSeen(t, rs, len(groups))

	fleetGroups(t, cp, 6, 2)
	for _, c := range clients {
		fleetRecv(t, c, 2)
	}

	// Stop the member that owns the most groups.
	stopped := rs[0]
	for _, r := range rs[1:] {
		if ownedBy(r, groups) > ownedBy(stopped, groups) {
			stopped = r
		}
	}
	moved := ownedBy(stopped, groups)
	shutdown(t, stopped)
	var left []*Relay
	for _, r := range rs {
		if r != stopped {
			left = append(left, r)
		}
	}
	var rest []*fleetClient
	for _, c := range clients {
		if c.relay != stopped.Addr() {
			rest = append(rest, c)
		}
	}
	eventuallyWithin(t, 4*fleetTimeout+wait, "one stream per group again", func() bool {
		return len(viewOf(left[0])) == 2 && len(viewOf(left[1])) == 2 && oneStreamEach(cp, groups)
	})
	checkSources(t, left, groups)
	checkSeen(t, left, len(groups))
	if moves := value(scrape(t, left[0]), "xdsrelay_fleet_moves_total", nil) + value(scrape(t, left[1]), "xdsrelay_fleet_moves_total", nil); moves < float64(moved) {
		t.Fatalf("%v moves counted, want at least the %d groups moved", moves, moved)
	}
	// The moves sent the clients nothing: no removal, and nothing again.
	for _, c := range rest {
		c.s.quiet(10 * time.Millisecond)
	}
	if moved == 0 {
		t.Fatal("the stopped member owned no group: nothing moved")
	}
	fleetGroups(t, cp, 6, 3)
	for _, c := range rest {
		fleetRecv(t, c, 3)
	}
}

// checkSeen checks what the members show: /debug/fleet's members, groups
// owned and where each group comes from, and the metrics: each group
// fetched from the control plane by one member, and from a peer by the
// others.
func checkSeen(t *testing.T, rs []*Relay, groups int) {
	t.Helper()
	owned, direct, peer := 0, 0.0, 0.0
	for _, r := range rs {
		var df DebugFleet
		getJSON(t, r, "/debug/fleet", &df)
		if !df.Enabled || len(df.Members) != len(rs) || df.Self != r.Addr() || len(df.Groups) != groups || df.ViewSince == nil {
			t.Fatalf("/debug/fleet of %s: %+v", r.Addr(), df)
		}
		for _, g := range df.Groups {
			if (g.Owner == df.Self) != (g.Source == sourceControlPlane) || (g.Source == sourcePeer && g.Peer != g.Owner) {
				t.Fatalf("/debug/fleet of %s: group %+v", r.Addr(), g)
			}
		}
		owned += df.GroupsOwned
		mfs := scrape(t, r)
		if v := value(mfs, "xdsrelay_fleet_members", nil); v != float64(len(rs)) {
			t.Fatalf("xdsrelay_fleet_members %v on %s", v, r.Addr())
		}
		for _, g := range df.Groups {
			if v := value(mfs, "xdsrelay_upstream_connected", map[string]string{"group": g.Group}); v != 1 {
				t.Fatalf("xdsrelay_upstream_connected of %s on %s: %v, want 1 (its path is up)", g.Group, r.Addr(), v)
			}
		}
		direct += value(mfs, "xdsrelay_fleet_groups", map[string]string{"source": sourceControlPlane})
		peer += value(mfs, "xdsrelay_fleet_groups", map[string]string{"source": sourcePeer})
	}
	if owned != groups || direct != float64(groups) || peer != float64(groups*(len(rs)-1)) {
		t.Fatalf("groups owned %d, from the control plane %v, from a peer %v; want %d, %d, %d", owned, direct, peer, groups, groups, groups*(len(rs)-1))
	}
}

// ownedBy counts the groups r owns in its view.
func ownedBy(r *Relay, groups []string) int {
	n := 0
	for _, g := range groups {
		if _, self := r.fleet.members.Owner(keyOf(g)); self {
			n++
		}
	}
	return n
}

// checkSources checks where each relay draws each group from: its owner
// from the control plane, every other member from the owner.
func checkSources(t *testing.T, rs []*Relay, groups []string) {
	t.Helper()
	for _, g := range groups {
		owner, _ := rs[0].fleet.members.Owner(keyOf(g))
		for _, r := range rs {
			want := directPath
			if r.Addr() != owner {
				want = owner
			}
			eventually(t, fmt.Sprintf("%s on %s from %s", g, r.Addr(), want), func() bool {
				grp := r.groupOf(keyOf(g))
				if grp == nil {
					return false
				}
				p, fallback, ok := grp.sw.Serving()
				return ok && !fallback && p.Name == want
			})
		}
	}
}

// groupOf is the group with key; nil if there is none.
func (r *Relay) groupOf(key string) *group {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.groups[key]
}

// Views that disagree (one member does not know another yet) make no
// loop and no fetch past the hop rule: a member that draws a group from a
// peer draws it from one that fetches it from the control plane, so every
// change reaches every client; and once the views agree, the control plane
// holds one stream per group again, with no removal on the way.
func TestFleetViewsThatDisagreeMakeNoLoop(t *testing.T) {
	cp := testcp.Start(t)
	addrs := fleetAddrs(fleetPort(t), 3)
	groups := splitGroups(addrs, 1, 6) // half owned by the member the third does not know
	setGroups(t, cp, groups, 1)
	var mu sync.Mutex
	partial := true // the third member's name resolves without the second
	resolveThird := func() []string {
		mu.Lock()
		defer mu.Unlock()
		if partial {
			return hosts([]string{addrs[0], addrs[2]})
		}
		return hosts(addrs)
	}
	rs := []*Relay{startRelay(t, cp.Addr, inFleet(addrs, 0, nil)), startRelay(t, cp.Addr, inFleet(addrs, 1, nil)),
		startRelay(t, cp.Addr, inFleet(addrs, 2, resolveThird))}
	eventually(t, "the views to settle, disagreeing", func() bool {
		return len(viewOf(rs[0])) == 3 && len(viewOf(rs[1])) == 3 && len(viewOf(rs[2])) == 2
	})
	clients := openFleetClients(t, rs, groups, 1)
	disagree := 0
	for _, g := range groups {
		a, _ := rs[0].fleet.members.Owner(keyOf(g))
		c, _ := rs[2].fleet.members.Owner(keyOf(g))
		if a != c {
			disagree++
		}
	}
	if disagree != 3 {
		t.Fatalf("the views disagree on %d owners, want 3", disagree)
	}
	eventually(t, "every group drawn at most one hop from the control plane", func() bool { return oneHop(rs, groups) })
	for g, n := range cpStreams(cp, groups) {
		if n < 1 || n > 2 {
			t.Fatalf("group %s has %d streams at the control plane with two views", g, n)
		}
	}
	setGroups(t, cp, groups, 2)
	for _, c := range clients {
		fleetRecv(t, c, 2)
	}
	eventually(t, "the disagreement counted", func() bool { return rs[0].fleet.members.Disagreeing() == 1 })

	mu.Lock()
	partial = false
	mu.Unlock()
	eventually(t, "one stream per group once the views agree", func() bool {
		return len(viewOf(rs[2])) == 3 && oneStreamEach(cp, groups) && oneHop(rs, groups)
	})
	setGroups(t, cp, groups, 3)
	for _, c := range clients {
		fleetRecv(t, c, 3)
	}
}

// oneHop reports whether every relay draws every group from the control
// plane or from a member that draws it from the control plane.
func oneHop(rs []*Relay, groups []string) bool {
	byAddr := map[string]*Relay{}
	for _, r := range rs {
		byAddr[r.Addr()] = r
	}
	for _, g := range groups {
		for _, r := range rs {
			grp := r.groupOf(keyOf(g))
			if grp == nil || grp.sw == nil {
				return false
			}
			p, _, ok := grp.sw.Serving()
			if !ok {
				return false
			}
			if p.Name == directPath {
				continue
			}
			up := byAddr[p.Name]
			if up == nil || sourceOf(up.groupOf(keyOf(g))) != sourceControlPlane {
				return false
			}
		}
	}
	return true
}

// fleetTLS is a fleet with client certificates: each member serves and
// dials with one certificate (CN xdsrelay-peer), whose identity is
// fleet.peer_identities; clients spiffe://example.org/client may claim the
// nodes of clusters g*.
func fleetTLS(ca *testCA) func(*Config) {
	peer := ca.issue(&x509.Certificate{Subject: pkix.Name{CommonName: "xdsrelay-peer"}, DNSNames: []string{"peers.fleet.test"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("127.0.0.2"), net.ParseIP("127.0.0.3")},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}})
	dir := ca.t.TempDir()
	kder, _ := x509.MarshalECPrivateKey(peer.PrivateKey.(*ecdsa.PrivateKey))
	cert := writePEM(ca.t, filepath.Join(dir, "peer.crt"), "CERTIFICATE", peer.Certificate[0])
	key := writePEM(ca.t, filepath.Join(dir, "peer.key"), "EC PRIVATE KEY", kder)
	return func(c *Config) {
		c.Downstream.TLS.CertFile, c.Downstream.TLS.KeyFile, c.Downstream.TLS.CAFile = cert, key, ca.file
		c.Downstream.Authorization.Rules = []AuthorizationRule{{Identity: "spiffe://example.org/client", Node: map[string]string{"cluster": "g*"}}}
		c.Fleet.PeerIdentities = []string{"xdsrelay-peer"}
	}
}

// With client certificates, members reach each other over the downstream
// TLS and a group is fetched once; a client's forged peer mark gains
// nothing: it is ignored and counted, the client joins the group its node
// names (not the one its mark names) as any client, the member it asks
// keeps drawing the group from the owner, and a node its certificate may
// not claim is refused whatever its mark.
func TestFleetForgedPeerMarkGainsNothing(t *testing.T) {
	cp := testcp.Start(t)
	groups := fleetGroups(t, cp, 6, 1)
	cp.Set(t, "secret", "1", testcp.Cluster("c-secret"))
	ca := newTestCA(t)
	rs := startFleetOf(t, cp, fleetAddrs(fleetPort(t), 3), fleetTLS(ca))
	client := ca.client("spiffe://example.org/client")
	openFleetClientsOn(t, rs, groups, 1, func(addr string) *grpc.ClientConn { return ca.dialAs(addr, client) })
	eventually(t, "one stream per group over TLS", func() bool { return oneStreamEach(cp, groups) })
	checkSources(t, rs, groups)

	// A member that does not own g0.
	owner, _ := rs[0].fleet.members.Owner(keyOf("g0"))
	var other *Relay
	for _, r := range rs {
		if r.Addr() != owner {
			other = r
		}
	}
	forged := node("forger", "g0")
	setMetadata(forged, PeerMarkKey, structpb.NewStringValue(other.Addr()))
	setMetadata(forged, PeerGroupKey, structpb.NewStringValue(keyOf("secret")))
	s := newStream(t, discoverypb.NewAggregatedDiscoveryServiceClient(ca.dialAs(other.Addr(), client)).DeltaAggregatedResources)
	s.send(&discoverypb.DeltaDiscoveryRequest{Node: forged, TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"c-g0"}})
	fleetRecv(t, &fleetClient{relay: other.Addr(), group: "g0", s: s}, 1)
	if v := value(scrape(t, other), "xdsrelay_fleet_peer_marks_ignored_total", nil); v != 1 {
		t.Fatalf("xdsrelay_fleet_peer_marks_ignored_total %v, want 1", v)
	}
	if other.groupOf(keyOf("secret")) != nil {
		t.Fatal("the forged mark joined the group it names")
	}
	if other.flushFirst(forged, downstream.Caller{Variant: "delta-ads", Identities: []string{"spiffe://example.org/client"}}) {
		t.Fatal("a forged mark's stream is flushed first")
	}
	if !other.flushFirst(forged, downstream.Caller{Variant: "delta-ads", Identities: []string{"xdsrelay-peer"}}) {
		t.Fatal("a peer's stream is not flushed first")
	}
	holdsFor(t, 500*time.Millisecond, "g0 drawn from its owner, once", func() bool {
		return sourceOf(other.groupOf(keyOf("g0"))) == sourcePeer && oneStreamEach(cp, groups)
	})

	secret := node("forger", "secret")
	setMetadata(secret, PeerMarkKey, structpb.NewStringValue(other.Addr()))
	setMetadata(secret, PeerGroupKey, structpb.NewStringValue(keyOf("secret")))
	err := firstReply(t, discoverypb.NewAggregatedDiscoveryServiceClient(ca.dialAs(other.Addr(), client)).DeltaAggregatedResources,
		&discoverypb.DeltaDiscoveryRequest{Node: secret, TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"c-secret"}})
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("a node the certificate may not claim, with a peer mark: %v, want PERMISSION_DENIED", err)
	}
	if n := cp.Open()["secret"]; n != 0 {
		t.Fatalf("the control plane has %d streams of the group the forger named", n)
	}
}

// roamer is a client that, whenever its stream ends, opens another on a
// member picked at random, as a client behind a Service does; it counts
// its streams' ends.
type roamer struct {
	ends atomic.Int32
}

func (c *roamer) run(ctx context.Context, addrs []string, first int, group string) {
	addr := addrs[first]
	for ctx.Err() == nil {
		c.once(ctx, addr, group)
		c.ends.Add(1)
		addr = addrs[rand.IntN(len(addrs))]
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond): // a client's reconnect backoff
		}
	}
}

// once holds one stream to addr until it ends.
func (c *roamer) once(ctx context.Context, addr, group string) {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return
	}
	defer cc.Close()
	st, err := discoverypb.NewAggregatedDiscoveryServiceClient(cc).DeltaAggregatedResources(ctx)
	if err != nil {
		return
	}
	if st.Send(&discoverypb.DeltaDiscoveryRequest{Node: node("roamer", group), TypeUrl: resourcev3.ClusterType,
		ResourceNamesSubscribe: []string{"c-" + group}}) != nil {
		return
	}
	for {
		if _, err := st.Recv(); err != nil {
			return
		}
	}
}

// Balance after a restart: a member that comes back empty gets clients
// from the others, which shed theirs (closing their connections) while
// over (1 + slack) times the mean, until every member is within the slack;
// no client moves more than twice for it. With fleet.balance off, nothing
// is shed.
func TestFleetBalanceAfterARestartStaysWithinTheSlack(t *testing.T) {
	for _, balance := range []bool{true, false} {
		t.Run(fmt.Sprintf("balance=%v", balance), func(t *testing.T) { testBalance(t, balance) })
	}
}

func testBalance(t *testing.T, balance bool) {
	const clients, slack = 60, 0.2
	cp := testcp.Start(t)
	groups := fleetGroups(t, cp, 6, 1)
	addrs := fleetAddrs(fleetPort(t), 3)
	balanced := func(c *Config) {
		c.Fleet.Balance, c.Fleet.BalanceSlack, c.Fleet.ShedPerSecond = balance, slack, 20
	}
	rs := startFleetOf(t, cp, addrs, balanced)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	roamers := make([]*roamer, clients)
	for i := range roamers {
		roamers[i] = &roamer{}
		wg.Go(func() { roamers[i].run(ctx, addrs, i%len(addrs), groups[i%len(groups)]) })
	}
	held := func(r *Relay) int { return r.fleetClients() }
	eventually(t, "every client connected", func() bool { return held(rs[0])+held(rs[1])+held(rs[2]) == clients })

	shutdown(t, rs[2])
	eventually(t, "the stopped member's clients on the others", func() bool { return held(rs[0])+held(rs[1]) == clients })
	for _, c := range roamers {
		c.ends.Store(0)
	}
	rs[2] = tierRestart(t, addrs[2], cp.Addr, inFleet(addrs, 2, nil), balanced)
	bound := int((1 + slack) * clients / 3)
	within := func() bool {
		return held(rs[0]) <= bound && held(rs[1]) <= bound && held(rs[2]) <= bound &&
			held(rs[0])+held(rs[1])+held(rs[2]) == clients
	}
	if !balance {
		holdsFor(t, time.Second, "no client shed with balance off", func() bool { return held(rs[2]) == 0 })
		if v := value(scrape(t, rs[0]), "xdsrelay_fleet_shed_total", nil); v != 0 {
			t.Fatalf("%v connections shed with balance off", v)
		}
		return
	}
	// The fleet settles: every member within the slack for a whole second.
	// A client shed just before the others' counts reached a member may land
	// on one at the bound and be shed once more, so the first moment within
	// is not yet the end.
	var since time.Time
	eventuallyWithin(t, 2*wait, "every member within the slack for a second", func() bool {
		if !within() {
			if !since.IsZero() {
				t.Logf("clients held: %d %d %d, bound %d", held(rs[0]), held(rs[1]), held(rs[2]), bound)
			}
			since = time.Time{}
			return false
		}
		if since.IsZero() {
			since = time.Now()
		}
		return time.Since(since) >= time.Second
	})
	for i, c := range roamers {
		if n := c.ends.Load(); n > 2 {
			t.Errorf("client %d reconnected %d times for the balance", i, n)
		}
	}
	if shed := value(scrape(t, rs[0]), "xdsrelay_fleet_shed_total", nil) + value(scrape(t, rs[1]), "xdsrelay_fleet_shed_total", nil); shed < float64(clients/2-bound) {
		t.Fatalf("%v connections shed", shed)
	}
}

// Balance with few clients settles at once: two clients that dial one
// member whose peers hold none, then four over three members behind a
// Service (a mean under 1/slack, where (1 + slack) times the mean is below
// the mean rounded up), are within the bound, and nothing is shed, not
// even while the peers' counts are on their way.
func TestFleetBalanceWithFewClientsShedsNothing(t *testing.T) {
	cp := testcp.Start(t)
	groups := fleetGroups(t, cp, 2, 1)
	addrs := fleetAddrs(fleetPort(t), 3)
	rs := startFleetOf(t, cp, addrs, func(c *Config) {
		c.Fleet.Balance, c.Fleet.BalanceSlack, c.Fleet.ShedPerSecond = true, 0.2, 20
	})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	roam := func(n int, to []string) {
		for i := range n {
			c := &roamer{}
			wg.Go(func() { c.run(ctx, to, i%len(to), groups[i%len(groups)]) })
		}
	}
	shed := func() int64 {
		var n int64
		for _, r := range rs {
			n += r.fleetM.shed.Get()
		}
		return n
	}
	// counted reports whether every member holds want and every other
	// member has heard so.
	counted := func(want []int) bool {
		for i, r := range rs {
			if r.fleetClients() != want[i] {
				return false
			}
			for _, p := range r.fleet.members.View().Peers {
				if j := slices.Index(addrs, p.Addr); p.Clients != want[j] {
					return false
				}
			}
		}
		return true
	}

	roam(2, addrs[:1])
	eventually(t, "two clients on the first member, counted by all", func() bool { return counted([]int{2, 0, 0}) })
	holdsFor(t, time.Second, "nothing shed with two clients on one member", func() bool { return shed() == 0 })

	roam(2, addrs[1:])
	eventually(t, "four clients over three members, counted by all", func() bool { return counted([]int{2, 1, 1}) })
	holdsFor(t, time.Second, "nothing shed with four clients over three members", func() bool { return shed() == 0 })
}
