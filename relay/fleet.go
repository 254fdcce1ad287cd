package relay

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/xdsrelay/xdsrelay/downstream"
	"github.com/xdsrelay/xdsrelay/fleet"
	"github.com/xdsrelay/xdsrelay/internal/authz"
	"github.com/xdsrelay/xdsrelay/internal/lockorder"
	"github.com/xdsrelay/xdsrelay/internal/metrics"
	"github.com/xdsrelay/xdsrelay/upstream"
)

// The fleet's wiring (docs/architecture.md, invariant 22 "One fetch per
// group per fleet", and "Fleet"): the fleet package says which member owns
// a group; here "from a peer" becomes an upstream like any other. Each
// group's feed is an upstream.Switch whose fallback path is the control
// plane and whose other paths are the members, each an ADS source (delta)
// over one connection to its xDS port; the group wants the owner's path,
// or the control plane's when this member owns it or a peer asks for it
// (the hop rule).

// The peer mark: node metadata a member puts in the node it presents to
// another for a group, and that the other believes only from a peer
// (trustsPeer).
const (
	// PeerMarkKey holds the asking member's fleet.self.
	PeerMarkKey = "xdsrelay.fleet.peer"
	// PeerGroupKey holds the group's key, which the node's own fields
	// (the relay's features added to its clients') would not give back.
	PeerGroupKey = "xdsrelay.fleet.group"
)

// directPath is the control plane's path's name.
const directPath = "control_plane"

// The sources a group's path is counted under in xdsrelay_fleet_groups.
const (
	sourceControlPlane = "control_plane"
	sourcePeer         = "peer"
	sourceFallback     = "fallback"
)

// fleetWiring is the relay's part of the fleet: the members, the paths to
// them, the client connections that balance counts, and the metrics.
type fleetWiring struct {
	// Read-only after newFleet.
	members *fleet.Members
	direct  upstream.Path
	tc      credentials.TransportCredentials // the downstream TLS, as a client's; nil without TLS
	peerCfg UpstreamConfig                   // how a member is dialled
	m       fleetMetrics

	mu    lockorder.Mutex[fleetWiringMu]
	links map[string]*peerLink // guarded by mu: by address
}

// peerLink is a member as an upstream: one connection, an ADS source on it.
type peerLink struct {
	conn *grpc.ClientConn
	src  *upstream.ADS
}

type fleetMetrics struct {
	members, disagree, clients *metrics.Value
	unreachable                *metrics.Value
	groups                     *metrics.Vec
	moves, shed, ignored       *metrics.Value
}

func newFleetMetrics(reg *metrics.Registry) fleetMetrics {
	m := fleetMetrics{
		members:     reg.Gauge("xdsrelay_fleet_members", "Members in this replica's view of its fleet (fleet.peers), itself included; 0 without a fleet.").With(),
		disagree:    reg.Gauge("xdsrelay_fleet_view_disagreements", "Live members of the fleet whose view (the members they see) differs from this replica's, as they last answered.").With(),
		unreachable: reg.Gauge("xdsrelay_fleet_unreachable_peers", "Members that fleet.peers resolves to and that do not answer the exchange (this replica left out): a member down, or a fleet set up wrong (TLS, fleet.peer_identities, fleet.self); /debug/fleet's last_error says why.").With(),
		clients:     reg.Gauge("xdsrelay_fleet_clients", "Client connections this replica holds, as balance counts them (peer streams left out).").With(),
		groups: reg.Gauge("xdsrelay_fleet_groups", "Groups by where they are fetched from: control_plane (this replica owns them, or a peer asks for them), peer (from the owner), fallback (the control plane, while the owner cannot be reached).", "source").
			ZeroEach(sourceControlPlane, sourcePeer, sourceFallback),
		moves:   reg.Counter("xdsrelay_fleet_moves_total", "Times a group moved from one path to another (the owner or the control plane), make-before-break.").With(),
		shed:    reg.Counter("xdsrelay_fleet_shed_total", "Client connections closed to balance the fleet (fleet.balance), at most fleet.shed_per_second.").With(),
		ignored: reg.Counter("xdsrelay_fleet_peer_marks_ignored_total", "Streams whose node carried the peer mark from a caller not trusted with it (not an identity of fleet.peer_identities with client certificates, or no fleet): the mark was ignored.").With(),
	}
	return m
}

// newFleet wires the fleet, if fleet.peers is set: the members, the paths,
// and the exchange on the downstream gRPC server.
func (r *Relay) newFleet() error {
	if !r.cfg.Fleet.On() {
		return nil
	}
	fw := &fleetWiring{direct: upstream.Path{Name: directPath, Source: r.source}, m: r.fleetM,
		links: map[string]*peerLink{}, peerCfg: peerUpstream(r.cfg)}
	if rl := r.certs["downstream"]; rl != nil {
		// Peer streams use the downstream TLS: this replica's certificate
		// as the client's, the other's verified as the clients' are.
		fw.tc = rl.ClientCredentials("downstream.tls.cert_file and key_file")
	}
	members, err := fleet.New(fleet.Options{Config: r.cfg.Fleet, Timeout: r.cfg.Upstream.ConnectTimeout,
		Ask: r.askPeer, Clients: r.fleetClients, Resolve: r.cfg.hooks.resolve, Logger: r.log, Fingerprint: fleetFingerprint(r.cfg)})
	if err != nil {
		return fmt.Errorf("fleet: %w", err)
	}
	fw.members = members
	r.fleet = fw
	r.grpc.RegisterService(&fleet.ServiceDesc, fleetAnswerer{r})
	return nil
}

// fleetFingerprint is what of the configuration the members must share:
// how clients are grouped (upstream.group_by) and the control planes they
// are fetched from; a SHA-256 prefix when that is past the exchange's
// bound.
func fleetFingerprint(cfg Config) string {
	addrs := []string{cfg.Upstream.Address}
	for _, u := range cfg.Upstreams {
		addrs = append(addrs, u.Address)
	}
	s := "group_by=" + strings.Join(cfg.Upstream.GroupBy, ",") + " upstream=" + strings.Join(addrs, ",")
	if len(s) > 200 {
		sum := sha256.Sum256([]byte(s))
		return "sha256:" + hex.EncodeToString(sum[:8])
	}
	return s
}

// peerUpstream is how a member dials another: the default upstream's
// bounds, no headers (they are the control plane's), and a reconnect
// backoff no longer than fleet.refresh, so that a member that comes back
// is heard at the next round.
func peerUpstream(cfg Config) UpstreamConfig {
	u := cfg.Upstream.UpstreamConfig
	u.Name, u.Headers = "fleet", nil
	u.ReconnectMaxDelay = min(u.ReconnectMaxDelay, cfg.Fleet.Refresh)
	u.ReconnectBaseDelay = min(u.ReconnectBaseDelay, u.ReconnectMaxDelay)
	return u
}

// firstRound bounds the round Start makes: a name server or a member that
// does not answer delays no start past it.
const firstRound = 2 * time.Second

// startFleet makes the first round (so that the first groups find the
// members that answer), then runs the members, follows their view and
// balances.
func (r *Relay) startFleet() {
	if r.fleet == nil {
		return
	}
	ctx, cancel := context.WithTimeout(r.ctx, min(r.cfg.Upstream.ConnectTimeout, firstRound))
	r.fleet.members.Round(ctx)
	cancel()
	r.goRun(func() { r.fleet.members.Run(r.ctx) })
	r.goRun(r.followFleet)
	if r.cfg.Fleet.Balance {
		r.goRun(r.balance)
	}
}

// link is the member at p's path, made at first use.
func (fw *fleetWiring) link(r *Relay, p fleet.Peer) (*peerLink, error) {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	if l := fw.links[p.Addr]; l != nil {
		return l, nil
	}
	if r.ctx.Err() != nil {
		return nil, errors.New("relay: shutting down")
	}
	s, err := dialServer(fw.peerCfg, p.Addr, r.cfg.Tracing, fw.tc, grpc.WithAuthority(p.Name))
	if err != nil {
		return nil, err
	}
	src, err := upstream.NewADS(upstream.Options{Servers: []upstream.Server{s}, Metrics: r.upm, Logger: r.log,
		Backoff: reconnectBackoff(fw.peerCfg), NotFoundTimeout: r.cfg.Cache.NotFoundTimeout, ProbeTimeout: fw.peerCfg.KeepaliveTimeout,
		StallTimeout: stallTimeout(fw.peerCfg), MaxRequestBytes: fw.peerCfg.MaxRequestBytes, FallbackRecheck: fw.peerCfg.FallbackRecheck,
		Protocol: upstream.ProtocolDelta, Upstream: "fleet", Peers: true, ForwardNACKs: fw.peerCfg.ForwardNACKs})
	if err != nil {
		s.Conn.(*grpc.ClientConn).Close()
		s.Attempts.Release()
		return nil, err
	}
	l := &peerLink{conn: s.Conn.(*grpc.ClientConn), src: src}
	fw.links[p.Addr] = l
	return l, nil
}

// prune closes the links to addresses no longer resolved.
func (fw *fleetWiring) prune() {
	known := map[string]bool{}
	for _, p := range fw.members.Known() {
		known[p.Addr] = true
	}
	fw.mu.Lock()
	var gone []*peerLink
	for a, l := range fw.links {
		if !known[a] {
			gone = append(gone, l)
			delete(fw.links, a)
		}
	}
	fw.mu.Unlock()
	for _, l := range gone {
		l.src.Close()
	}
}

// close closes every link, once the groups have ended.
func (fw *fleetWiring) close() error {
	fw.mu.Lock()
	links := fw.links
	fw.links = nil
	fw.mu.Unlock()
	var errs []error
	for _, l := range links {
		errs = append(errs, l.src.Close())
	}
	return errors.Join(errs...)
}

// askPeer makes the exchange with a member.
func (r *Relay) askPeer(ctx context.Context, p fleet.Peer, mine fleet.Report) (fleet.Report, error) {
	l, err := r.fleet.link(r, p)
	if err != nil {
		return fleet.Report{}, err
	}
	return fleet.Ask(ctx, l.conn, mine)
}

// fleetAnswerer answers the exchange, to peers alone when client
// certificates are in use.
type fleetAnswerer struct{ r *Relay }

func (a fleetAnswerer) Exchange(ctx context.Context, caller fleet.Report) (fleet.Report, error) {
	switch {
	case a.r.stopped.Load():
		return fleet.Report{}, status.Error(codes.Unavailable, "xdsrelay: shutting down")
	case !a.r.trustsPeer(downstream.Caller{Variant: "fleet", Identities: identitiesOf(ctx)}):
		return fleet.Report{}, status.Error(codes.PermissionDenied, "xdsrelay: only fleet.peer_identities may ask: the caller's certificate names none of them")
	}
	a.r.fleet.members.Heard(caller)
	return a.r.fleet.members.Answer(), nil
}

// identitiesOf is the identities of a gRPC caller's verified certificate.
func identitiesOf(ctx context.Context) []string {
	if p, ok := peer.FromContext(ctx); ok {
		if info, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			return authz.Identities(&info.State)
		}
	}
	return nil
}

// trustsPeer reports whether from may speak as a member: with client
// certificates, only an identity in fleet.peer_identities; without them,
// as any client may claim any node, anyone (docs/architecture.md,
// "Fleet": trust).
func (r *Relay) trustsPeer(from downstream.Caller) bool {
	if r.fleet == nil {
		return false
	}
	if r.cfg.Downstream.TLS.CAFile == "" {
		return true
	}
	return slices.ContainsFunc(from.Identities, func(id string) bool { return slices.Contains(r.cfg.Fleet.PeerIdentities, id) })
}

// peerKey is the group a node joins, and whether it is a peer's: the key
// its peer mark names, believed from a peer's delta ADS stream alone
// (trustsPeer); a mark from anyone else is ignored, and counted.
func (r *Relay) peerKey(node *corepb.Node, from downstream.Caller) (string, bool) {
	key, marked, trusted := r.peerMark(node, from)
	switch {
	case trusted:
		return key, true
	case marked:
		r.fleetM.ignored.Inc()
	}
	return GroupKey(node, r.cfg.Upstream.GroupBy), false
}

// peerMark is the group key a node's peer mark names, whether it carries
// one, and whether it is to be believed.
func (r *Relay) peerMark(node *corepb.Node, from downstream.Caller) (key string, marked, trusted bool) {
	f := node.GetMetadata().GetFields()
	if f[PeerMarkKey].GetStringValue() == "" {
		return "", false, false
	}
	key = f[PeerGroupKey].GetStringValue()
	return key, true, from.Variant == "delta-ads" && key != "" && r.trustsPeer(from)
}

// flushFirst says which streams are flushed first at each change
// (downstream.Options.FlushFirst): a peer's, and a lower relay's (one that
// advertises its admin address), each fanning out to clients of its own,
// so that a relay below adds as little as can be to its clients' wait.
func (r *Relay) flushFirst(node *corepb.Node, from downstream.Caller) bool {
	_, _, trusted := r.peerMark(node, from)
	return trusted || advertised(node) != ""
}

// isPeer says a stream is a trusted peer's: counted apart from the
// clients in convergence (downstream.Options.Peer).
func (r *Relay) isPeer(node *corepb.Node, from downstream.Caller) bool {
	_, _, trusted := r.peerMark(node, from)
	return trusted
}

// peerNode is the node a group presents to an owner: the node it presents
// to the control plane, with the peer mark, its id ending in this
// member's address (the members' ids may not differ otherwise, and the
// owner tells its lower relays apart by node id: tiers.go).
func (r *Relay) peerNode(g *group) *corepb.Node {
	n := proto.Clone(g.nodes[0]).(*corepb.Node)
	self := r.fleet.members.Self()
	n.Id += "~" + self
	setMetadata(n, PeerMarkKey, structpb.NewStringValue(self))
	setMetadata(n, PeerGroupKey, structpb.NewStringValue(g.key))
	return n
}

// newSwitch is a group's feed with the fleet on: the control plane, or the
// owner.
func (r *Relay) newSwitch(g *group) (*upstream.Switch, error) {
	return upstream.NewSwitch(upstream.Group{ID: g.id, Node: g.nodes[0], Nodes: g.nodes, Cache: g.cache},
		upstream.SwitchOptions{Fallback: r.fleet.direct, Metrics: r.upm, Logger: r.log,
			Recheck: r.cfg.Upstream.FallbackRecheck, Settle: r.cfg.Upstream.ConnectTimeout,
			OnMove: func(from, to upstream.Path) { r.fleetM.moves.Inc() }})
}

// wantLocked tells g's switch the path it should draw from: the control
// plane if a peer asks for the group (at most one hop) or this member
// owns it, else the owner (docs/architecture.md, "Fleet": the hop rule).
// Call with Relay.mu held.
func (r *Relay) wantLocked(g *group) {
	if g.sw == nil {
		return
	}
	g.sw.Want(r.pathFor(g, g.peers > 0))
}

// pathFor is g's path: the control plane if asked (by a peer), or if
// this member owns g or cannot reach the owner; else the owner's.
func (r *Relay) pathFor(g *group, asked bool) upstream.Path {
	if asked {
		return r.fleet.direct
	}
	owner, self := r.fleet.members.Owner(g.key)
	if self {
		return r.fleet.direct
	}
	p, ok := r.fleet.members.Peer(owner)
	if !ok {
		return r.fleet.direct
	}
	l, err := r.fleet.link(r, p)
	if err != nil {
		r.log.Warn("fleet member cannot be dialled; the group is fetched from the control plane", "member", owner, "error", err)
		return r.fleet.direct
	}
	// Fresh: the owner counts this member, one of its clients, as holding
	// what it sent it alone, not what a resume says it holds; what the
	// owner sends again unchanged, the cache drops.
	return upstream.Path{Name: owner, Source: l.src, Node: g.peerNode, Upstream: "fleet", Fresh: true}
}

// followFleet tells every group its path whenever the view changes, and
// closes the links to members no longer resolved. Each group is told under
// Relay.mu of its own (its peers' streams are read there), never the
// whole fleet's groups under one hold of it.
func (r *Relay) followFleet() {
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-r.fleet.members.Changed():
		}
		for _, g := range r.snapshotGroups() {
			r.mu.Lock()
			r.wantLocked(g)
			r.mu.Unlock()
		}
		r.fleet.prune()
	}
}

// clientConn is a client connection as balance counts it: its streams
// (xDS and load reports), how many of them are a peer's, when its first
// stream joined, and whether it is counted in Relay.clientConns (a
// connection with streams, none a peer's, not shed).
type clientConn struct {
	streams, peers int
	since          time.Time
	counted        bool
}

// recountLocked counts c in Relay.clientConns, or not, as it stands now.
// Call with Relay.mu held.
func (r *Relay) recountLocked(c *clientConn, held bool) {
	switch want := held && c.streams > 0 && c.peers == 0; {
	case want && !c.counted:
		r.clientConns++
	case !want && c.counted:
		r.clientConns--
	}
	c.counted = held && c.streams > 0 && c.peers == 0
}

// joinConnLocked counts a stream's connection for balance; the returned
// func uncounts it. Polls are not counted: they hold no connection long.
// Call with Relay.mu held.
func (r *Relay) joinConnLocked(from downstream.Caller, isPeer bool) func() {
	if r.fleet == nil || from.Addr == "" || from.Variant == "fetch" || from.Variant == "rest" {
		return func() {}
	}
	c := r.conns[from.Addr]
	if c == nil {
		c = &clientConn{since: time.Now()}
		r.conns[from.Addr] = c
	}
	c.streams++
	if isPeer {
		c.peers++
	}
	r.recountLocked(c, true)
	return func() {
		c.streams--
		if isPeer {
			c.peers--
		}
		held := r.conns[from.Addr] == c
		r.recountLocked(c, held)
		if c.streams == 0 && held {
			delete(r.conns, from.Addr)
		}
	}
}

// fleetClients is the client connections this member holds, peers' left
// out: a count kept as streams join and leave (docs/architecture.md,
// invariant 19 "Count as it happens"), not found by walking them.
func (r *Relay) fleetClients() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.clientConns
}

// oldestClientLocked is the address of the client connection held
// longest, peers' left out: a connection just moved here is shed last, so
// that a client is moved as few times as can be. Call with Relay.mu held.
func (r *Relay) oldestClientLocked() string {
	addr, since := "", time.Time{}
	for a, c := range r.conns {
		if c.peers == 0 && (addr == "" || c.since.Before(since)) {
			addr, since = a, c.since
		}
	}
	return addr
}

// balance sheds client connections while this member holds more than the
// bound (fleet.Bound: (1 + fleet.balance_slack) times the fleet's mean,
// and at least the mean rounded up, plus one), one a tick, a tick every
// 1/fleet.shed_per_second (a ticker drops the ticks a slow loop misses:
// never more): each is closed, and its client reconnects through the
// Service to any member. What is past the bound is read from counts that
// every live member answered after the last shed, and shed whole before
// it is read again: a member does not shed on counts that do not yet
// hold the clients it shed (fleet.Members.Shed).
func (r *Relay) balance() {
	t := time.NewTicker(max(time.Duration(float64(time.Second)/r.cfg.Fleet.ShedPerSecond), time.Millisecond))
	defer t.Stop()
	budget := 0 // clients still to shed of the last excess read
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-t.C:
		}
		clients := r.fleetClients()
		r.fleetM.clients.Set(int64(clients))
		if r.stopped.Load() {
			continue
		}
		if budget == 0 {
			budget = r.fleet.members.Excess(clients)
		}
		if budget == 0 {
			continue
		}
		budget--
		if r.shedOne() {
			r.fleet.members.Shed()
		}
	}
}

// shedOne closes the oldest client connection; it is no longer counted.
// It reports whether one was closed.
func (r *Relay) shedOne() bool {
	r.mu.Lock()
	addr := r.oldestClientLocked()
	if c := r.conns[addr]; c != nil {
		r.recountLocked(c, false)
		delete(r.conns, addr) // its streams' releases find it gone
	}
	r.mu.Unlock()
	if addr == "" || !r.down.CloseConnection(addr) {
		return false
	}
	r.fleetM.shed.Inc()
	r.log.Debug("client connection shed to balance the fleet", "client", addr)
	return true
}

// registerFleetMetrics sets, at each scrape, the members and where the
// groups come from.
func (r *Relay) registerFleetMetrics() {
	r.metrics.OnScrape(func() {
		if r.fleet == nil {
			return
		}
		v := r.fleet.members.View()
		r.fleetM.members.Set(int64(len(v.Members)))
		r.fleetM.disagree.Set(int64(disagreeing(v)))
		r.fleetM.unreachable.Set(int64(r.fleet.members.Unreachable()))
		r.fleetM.clients.Set(int64(r.fleetClients()))
		counts := map[string]int64{}
		for _, g := range r.snapshotGroups() {
			if src := sourceOf(g); src != "" {
				counts[src]++
			}
		}
		for _, src := range []string{sourceControlPlane, sourcePeer, sourceFallback} {
			r.fleetM.groups.With(src).Set(counts[src])
		}
	})
}

func disagreeing(v fleet.View) int {
	n := 0
	for _, p := range v.Peers {
		if p.Live && !p.Agrees {
			n++
		}
	}
	return n
}

// sourceOf is where g is fetched from now; "" before its switch runs.
func sourceOf(g *group) string {
	if g.sw == nil {
		return ""
	}
	p, fallback, ok := g.sw.Serving()
	switch {
	case !ok:
		return ""
	case fallback:
		return sourceFallback
	case p.Name == directPath:
		return sourceControlPlane
	}
	return sourcePeer
}
