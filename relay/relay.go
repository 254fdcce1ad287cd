package relay

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/downstream"
	"github.com/xdsrelay/xdsrelay/internal/creds"
	"github.com/xdsrelay/xdsrelay/internal/lockorder"
	"github.com/xdsrelay/xdsrelay/internal/metrics"
	"github.com/xdsrelay/xdsrelay/internal/xds"
	"github.com/xdsrelay/xdsrelay/upstream"
)

// Relay is a running relay.
//
// Who guards what: the configuration, the parts New wires together and the
// metrics are read-only once New returns; the lifecycle flags are atomic;
// the groups are guarded by mu, which is never held across a call into
// another component that could wait (a group's feed runs in a goroutine of
// its own, and cancelling it waits for nothing); the listeners and servers
// are set by Start before the goroutines that use them, and read by
// Shutdown after.
type Relay struct {
	// Read-only after New: the configuration and the wired parts.
	cfg    Config
	log    *slog.Logger
	host   string             // the host name, for upstream node ids
	ctx    context.Context    // ends the groups' upstreams
	cancel context.CancelFunc // of ctx
	source upstream.Source    // the control plane, or the resource files, or a router among several
	routes *upstream.Routes   // which upstream serves which name; nil with one upstream
	upConn *grpc.ClientConn   // the control plane; nil with resource files
	// upFallbacks are the default upstream's fallback servers
	// (upstream.addresses), in priority order: readiness before any
	// group looks at them while upConn cannot connect.
	upFallbacks []*grpc.ClientConn
	upADS       *upstream.ADS // upConn's source: readiness asks its dialect (dialect.go)
	down        *downstream.Server
	grpc        *grpc.Server
	health      *health.Server // gRPC health on the downstream port
	// certs are the certificate watchers by side (upstream, downstream,
	// admin), closed on shutdown; adminTLS and restTLS their admin and
	// downstream TLS configurations, nil without TLS.
	certs    map[string]*creds.Reloader
	adminTLS *tls.Config
	restTLS  *tls.Config

	// Read-only after New: the metrics and the health records they feed.
	metrics       *metrics.Registry
	upm           *upstream.Metrics
	groupsG       *metrics.Value
	guardM        guardMetrics
	refM          referenceMetrics
	rolloutM      rolloutMetrics
	persistHealth *persistHealth
	warnings      *configWarnings // xdsrelay_config_warnings and their /readyz lines
	loads         loadReports     // load report metrics (loads.go)
	fleetM        fleetMetrics    // the fleet's metrics, registered with or without a fleet (fleet.go)

	// Read-only after New: the fleet (fleet.peers), nil without one.
	fleet *fleetWiring

	// Lifecycle flags, set at run time; atomic.
	ready    atomic.Bool
	stopped  atomic.Bool // set when Shutdown begins
	synced   atomic.Bool // something to serve (admin.ready_after_sync; see hasSynced)
	restored atomic.Bool // a saved cache loaded (cache.persist_dir)
	// refusal is what the control plane refused when readiness last
	// asked its dialect before any group (readiness.go); nil if nothing.
	refusal atomic.Pointer[dialectRefusal]

	// The groups and, with a fleet, the client connections balance counts
	// (fleet.go), guarded by mu.
	mu          lockorder.Mutex[relayMu]
	groups      map[string]*group
	conns       map[string]*clientConn
	clientConns int // the connections of conns that balance counts

	// live counts every goroutine the relay starts (goRun), the groups'
	// included. Goroutines are added by Start or under mu while ctx is
	// live, so none is added once Shutdown has cancelled ctx under mu and
	// waits for them.
	live goroutines

	// Set by Start before the goroutines that use them; read by Shutdown.
	listener net.Listener
	admin    *http.Server
	adminLn  net.Listener
	rest     *http.Server
	restLn   net.Listener
	// adminLocal serves admin.local_address; nil unless it is opened.
	adminLocal   *http.Server
	adminLocalLn net.Listener
}

func (r *Relay) closeReloaders() {
	for _, rl := range r.certs {
		rl.Close()
	}
}

// group is one group of clients: a cache and the upstream that fills it.
// Its fields are read-only once it is started, but clients and loads,
// guarded by Relay.mu.
type group struct {
	key    string
	id     string         // GroupID(key): the group's name in logs, metrics and the admin endpoint
	nodes  []*corepb.Node // presented to each upstream, by route index (groupNodes); the default upstream's first
	fields *corepb.Node   // the group_by fields of its clients' nodes (keyNode)
	cache  *cache.Cache
	feed   upstream.Feed // what fills cache; its Status is the group's upstream state
	cancel context.CancelFunc

	// With a fleet (fleet.go), read-only once started: the feed as a
	// switch between the control plane and the owner, and the node
	// presented to the owner. nil without a fleet.
	sw       *upstream.Switch
	peerNode *corepb.Node

	// Guarded by Relay.mu.
	clients   int
	peers     int                  // the clients that are peers' streams (the hop rule: fleet.go)
	loads     *groupLoads          // nil until a client reports load
	tiers     map[string]*tierLink // lower relays among the clients, by node id (tiers.go)
	tiersOver int                  // their streams past maxTiers, not named
}

// New validates cfg and prepares a relay; Start runs it. It is the steps
// below, in order: each adds one part to the relay, and a failure undoes
// what the earlier ones started.
func New(cfg Config, logger *slog.Logger) (*Relay, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := newRelay(cfg, logger)
	ok := false
	defer func() {
		if !ok {
			r.cancel()
			if r.source != nil {
				r.source.Close()
			}
			r.closeReloaders()
		}
	}()
	for _, step := range []func() error{r.openSource, r.newDownstream, r.newGRPCServer, r.newFleet} {
		if err := step(); err != nil {
			return nil, err
		}
	}
	ok = true
	return r, nil
}

// newRelay is the relay's record with its metrics registered.
func newRelay(cfg Config, logger *slog.Logger) *Relay {
	if logger == nil {
		logger = slog.Default()
	}
	r := &Relay{
		cfg:     cfg,
		host:    hostname(),
		log:     logger,
		metrics: metrics.New(metrics.Options{NoGroupLabel: !cfg.Metrics.GroupLabel}),
		groups:  make(map[string]*group),
		conns:   make(map[string]*clientConn),
		certs:   make(map[string]*creds.Reloader),
	}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.upm = upstream.NewMetrics(r.metrics)
	r.zeroUpstreamSeries()
	r.groupsG = r.metrics.Gauge("xdsrelay_groups", "Groups of downstream clients, each with its own upstream stream.").With()
	r.registerGroupMetrics()
	r.registerConvergenceMetrics()
	r.registerCertMetrics()
	r.registerServerMetrics()
	r.registerBuildInfo()
	r.guardM = newGuardMetrics(r.metrics)
	r.refM = newReferenceMetrics(r.metrics)
	r.registerReferenceMetrics()
	r.rolloutM = newRolloutMetrics(r.metrics)
	r.persistHealth = newPersistHealth(r.metrics)
	r.warnings = newConfigWarnings(r.metrics, warnedKeys(cfg))
	r.loads = newLoadReports(r.metrics)
	r.fleetM = newFleetMetrics(r.metrics)
	r.registerFleetMetrics()
	return r
}

// openSource opens the upstream: a control plane, several, or files.
func (r *Relay) openSource() error {
	src, err := r.newSource()
	if err != nil {
		return err
	}
	r.source = src
	return nil
}

// newDownstream makes the xDS services' server, with the authorization
// rules and limits, and warns about the rules' gaps.
func (r *Relay) newDownstream() error {
	cfg := r.cfg
	az, err := cfg.authorizer()
	if err != nil {
		return err
	}
	warnUnboundGroups(cfg, r.log)
	r.warnAllowAll()
	r.down, err = downstream.New(downstream.Options{Groups: r, Metrics: r.metrics, Logger: r.log,
		PollTimeout: cfg.Downstream.PollTimeout, SendTimeout: cfg.Downstream.SendTimeout, Authorizer: az,
		Limits: downstreamLimits(cfg), AnswerWait: min(cfg.Cache.NotFoundTimeout, firstAnswerWait),
		WildcardWait: cfg.wildcardWait(), FlushFirst: r.flushFirst, Peer: r.isPeer, HeldWait: cfg.longestConnectTimeout(), Loads: r.loads.downstream(r)})
	return err
}

// newGRPCServer makes the downstream gRPC server (with TLS if configured)
// and registers on it the xDS services, CSDS, load reports, health and,
// unless turned off, reflection. It loads the admin TLS too.
func (r *Relay) newGRPCServer() error {
	opts := serverOptions(r.cfg)
	down, err := downstreamTLS(r.ctx, r.cfg, r.log)
	if err != nil {
		return err
	}
	if down != nil {
		r.certs["downstream"] = down
		opts = append(opts, grpc.Creds(down.ServerCredentials()))
		r.restTLS = down.ServerConfig()
	}
	if err := r.loadAdminTLS(); err != nil {
		return err
	}
	r.grpc = grpc.NewServer(opts...)
	r.down.Register(r.grpc)
	if r.cfg.Downstream.Reflection {
		reflection.Register(r.grpc) // grpcurl, against CSDS and the xDS services
	}
	r.health = health.NewServer()
	r.updateHealth() // NOT_SERVING until Start
	healthpb.RegisterHealthServer(r.grpc, drainingHealth{Server: r.health, r: r})
	return nil
}

// serverOptions are the downstream gRPC server's options: the pre-encoded
// codec, keepalive and connection bounds, request size and stream limits,
// and lean per-connection buffers.
func serverOptions(cfg Config) []grpc.ServerOption {
	opts := append(downstream.ServerOptions(),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(connectionBounds(cfg)),
		grpc.MaxRecvMsgSize(cfg.Downstream.MaxRequestBytes),
		grpc.MaxConcurrentStreams(uint32(cfg.Limits.MaxStreamsPerConnection)),
		// Lean idle streams: a connection's write buffer is taken from a
		// pool only while it writes, and its read buffer is small (requests
		// are small). Throughput per connection is not what bounds a relay.
		grpc.SharedWriteBuffer(true),
		grpc.ReadBufferSize(8<<10),
		grpc.WriteBufferSize(32<<10),
		// Static flow-control windows: no BDP estimation, whose ping (and
		// the client's ping ack) would follow every ACK a client sends,
		// doubling the frames per push. Requests are small; 64 KiB per
		// stream and connection bounds what a client can make the relay
		// buffer.
		grpc.StaticStreamWindowSize(64<<10),
		grpc.StaticConnWindowSize(64<<10),
	)
	if cfg.Tracing {
		opts = append(opts, grpc.StatsHandler(otelgrpc.NewServerHandler()))
	}
	return opts
}

// firstAnswerWait bounds how long a SotW stream whose first request names
// what its client waits for is held for the answer (downstream's
// AnswerWait): long enough for the relay to learn that a name's authority
// is served by no upstream, or that its control plane refuses connections,
// and short, since a request the client sends meanwhile waits too.
const firstAnswerWait = 2 * time.Second

// wildcardWait bounds how long a stream whose first request is a wildcard
// of one type is held for its first answer (downstream's WildcardWait):
// the longest upstream.connect_timeout, by which the relay knows whether
// its control plane can be reached, and firstAnswerWait for the rest.
func (c *Config) wildcardWait() time.Duration {
	return c.longestConnectTimeout() + firstAnswerWait
}

// longestConnectTimeout is the longest upstream.connect_timeout: by then
// the relay knows whether each control plane can be reached. It bounds
// how long a SotW stream holds a Listener or Cluster state that would
// leave out a name its client may hold (downstream's HeldWait,
// docs/architecture.md, invariant 21).
func (c *Config) longestConnectTimeout() time.Duration {
	longest := c.Upstream.ConnectTimeout
	for _, u := range c.Upstreams {
		longest = max(longest, u.ConnectTimeout)
	}
	return longest
}

// newSource opens what the configuration names upstream: a directory of
// resource files, a control plane, or several behind a router. Any listed
// authority routes through the router, upstream.authorities alone
// included: an xdstp name under another authority is served by no one
// (docs/control-planes.md, "Which control plane serves a name").
func (r *Relay) newSource() (upstream.Source, error) {
	def, err := r.upstreamSource(r.cfg.Upstream.UpstreamConfig, "upstream")
	if err != nil || (len(r.cfg.Upstreams) == 0 && len(r.cfg.Upstream.Authorities) == 0) {
		return def, err
	}
	routes, err := r.cfg.Routes()
	if err != nil {
		def.Close()
		return nil, fmt.Errorf("upstreams: %w", err)
	}
	r.routes = routes
	members := []upstream.Source{def}
	for i, u := range r.cfg.Upstreams {
		src, err := r.upstreamSource(u, fmt.Sprintf("upstreams[%d]", i))
		if err != nil {
			for _, m := range members {
				m.Close()
			}
			return nil, err
		}
		members = append(members, src)
	}
	return upstream.NewRouter(routes, members, r.upm, r.metrics, r.log)
}

// upstreamSource opens one upstream, whose keys are named with key: a
// directory of resource files, or a control plane's servers.
func (r *Relay) upstreamSource(u UpstreamConfig, key string) (upstream.Source, error) {
	if dir, isFile := strings.CutPrefix(u.Address, FilePrefix); isFile {
		f, err := upstream.NewFile(dir, r.log, r.metrics)
		if err != nil {
			return nil, fmt.Errorf("%s.address: %w", key, err)
		}
		return f, nil
	}
	var tc credentials.TransportCredentials
	up, err := upstreamTLS(r.ctx, u, key, r.log)
	if err != nil {
		return nil, err
	}
	if up != nil && u.TLS.Insecure {
		k := key + ".tls.insecure_skip_verify"
		r.warnings.warn(r.log, k, "docs/control-planes.md#relaying-a-control-plane", k+" is set: the control plane's certificate is NOT verified")
	}
	if up != nil {
		tc = up.ClientCredentials(key + ".tls.cert_file and key_file")
		r.certs[key] = up
	}
	var servers []upstream.Server
	closeAll := func() {
		for _, s := range servers {
			s.Conn.(*grpc.ClientConn).Close()
			s.Attempts.Release()
		}
	}
	for _, addr := range u.Servers() {
		s, err := dialServer(u, addr, r.cfg.Tracing, tc)
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("%s.address: %w", key, err)
		}
		servers = append(servers, s)
	}
	first := r.upConn == nil
	if first {
		r.upConn = servers[0].Conn.(*grpc.ClientConn)
		for _, s := range servers[1:] {
			r.upFallbacks = append(r.upFallbacks, s.Conn.(*grpc.ClientConn))
		}
	}
	src, err := upstream.NewADS(upstream.Options{Servers: servers, Metrics: r.upm, Logger: r.log,
		Backoff: reconnectBackoff(u), NotFoundTimeout: r.cfg.Cache.NotFoundTimeout, ProbeTimeout: u.KeepaliveTimeout,
		StallTimeout:    stallTimeout(u),
		MaxRequestBytes: u.MaxRequestBytes, FallbackRecheck: u.FallbackRecheck, Protocol: upstream.Protocol(u.Protocol), Upstream: u.Name,
		ForwardNACKs: u.ForwardNACKs})
	if err != nil {
		closeAll()
		return nil, err
	}
	if first {
		r.upADS = src
	}
	return src, nil
}

// stallTimeout is upstream.StallTimeout for u: never (negative) for 0.
func stallTimeout(u UpstreamConfig) time.Duration {
	if u.StallTimeout == 0 {
		return -1
	}
	return u.StallTimeout
}

// Start listens and serves; it returns once the relay accepts clients.
func (r *Relay) Start() error {
	if r.cfg.Cache.PersistDir != "" {
		r.restore()
	}
	ln, err := net.Listen("tcp", r.cfg.Downstream.Address)
	if err != nil {
		return fmt.Errorf("downstream.address: %w", err)
	}
	r.listener = ln
	if err := r.startAdmin(); err != nil {
		r.closeListeners()
		return err
	}
	if r.cfg.Downstream.RESTAddress != "" {
		rln, err := net.Listen("tcp", r.cfg.Downstream.RESTAddress)
		if err != nil {
			r.closeListeners()
			return fmt.Errorf("downstream.rest_address: %w", err)
		}
		r.restLn = rln
		// IdleTimeout: a keep-alive connection waiting for its next
		// request is closed after downstream.max_connection_idle (0: never).
		r.rest = &http.Server{Handler: r.down.RESTHandler(), ReadHeaderTimeout: r.cfg.Limits.RESTReadTimeout,
			IdleTimeout: r.cfg.Downstream.MaxConnectionIdle, TLSConfig: r.restTLS}
		if r.restTLS != nil {
			rln = tls.NewListener(rln, r.restTLS)
		}
		r.goRun(func() {
			if err := r.rest.Serve(rln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				r.log.Error("REST server", "error", err)
			}
		})
	}
	r.goRun(func() {
		if err := r.source.Run(r.ctx); err != nil {
			r.log.Error("upstream", "error", err)
		}
	})
	r.goRun(r.sweep)
	r.startFleet()
	if r.cfg.Cache.PersistDir != "" {
		r.goRun(func() { r.persist(r.cfg.Cache.PersistInterval) })
	}
	r.goRun(func() {
		if err := r.grpc.Serve(r.down.Listen(ln)); err != nil {
			r.log.Error("downstream server", "error", err)
		}
	})
	r.ready.Store(true)
	r.updateHealth()
	if r.cfg.Admin.ReadyAfterSync {
		r.goRun(r.watchSync)
	}
	r.log.Info("relay serving", r.listening(ln)...)
	return nil
}

// listening is what the "relay serving" line says: the xDS listener, the
// upstream, and each other listener that is open (admin, admin_local,
// rest), none that is not.
func (r *Relay) listening(ln net.Listener) []any {
	attrs := []any{"downstream", ln.Addr().String(), "upstream", r.cfg.Upstream.Address}
	for _, l := range []struct{ key, addr string }{{"admin", r.AdminAddr()}, {"admin_local", r.AdminLocalAddr()}, {"rest", r.RESTAddr()}} {
		if l.addr != "" {
			attrs = append(attrs, l.key, l.addr)
		}
	}
	return attrs
}

func (r *Relay) goRun(f func()) {
	r.live.add()
	go func() {
		defer r.live.done()
		f()
	}()
}

// goroutines counts running goroutines, for a wait that a context bounds
// and that leaves nothing behind when the bound passes: a WaitGroup's Wait
// cannot be given up, so a bounded wait on one leaves a goroutine in Wait
// for as long as what it waits for runs, which an abandoned goroutine may
// do for ever.
type goroutines struct {
	mu   lockorder.Mutex[goroutinesMu]
	n    int           // guarded by mu
	zero chan struct{} // guarded by mu: closed when n falls to 0; nil while no one waits
}

func (g *goroutines) add() {
	g.mu.Lock()
	g.n++
	g.mu.Unlock()
}

func (g *goroutines) done() {
	g.mu.Lock()
	if g.n--; g.n == 0 && g.zero != nil {
		close(g.zero)
		g.zero = nil
	}
	g.mu.Unlock()
}

// wait waits until none runs, or ctx is done.
func (g *goroutines) wait(ctx context.Context) error {
	g.mu.Lock()
	if g.n == 0 {
		g.mu.Unlock()
		return nil
	}
	if g.zero == nil {
		g.zero = make(chan struct{})
	}
	zero := g.zero
	g.mu.Unlock()
	select {
	case <-zero:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (r *Relay) closeListeners() {
	for _, ln := range []net.Listener{r.listener, r.adminLn, r.adminLocalLn, r.restLn} {
		if ln != nil {
			ln.Close()
		}
	}
}

// RESTAddr is the REST-JSON listener's address, empty if disabled.
func (r *Relay) RESTAddr() string {
	if r.restLn == nil {
		return ""
	}
	return r.restLn.Addr().String()
}

// Addr is the downstream listener's address.
func (r *Relay) Addr() string { return r.listener.Addr().String() }

// AdminAddr is the admin listener's address, empty if disabled.
func (r *Relay) AdminAddr() string {
	if r.adminLn == nil {
		return ""
	}
	return r.adminLn.Addr().String()
}

// AdminLocalAddr is the address of admin.local_address's listener, empty
// if it is not opened (admin.address is loopback, or either is empty).
func (r *Relay) AdminLocalAddr() string {
	if r.adminLocalLn == nil {
		return ""
	}
	return r.adminLocalLn.Addr().String()
}

// drainGrace is how long Shutdown lets clients learn that the relay goes
// (GOAWAY on every connection, gRPC health NOT_SERVING) before it ends
// their streams: a client that opens a stream meanwhile opens it elsewhere.
// The package's tests shorten it (Config.hooks).
const drainGrace = time.Second

// drainGrace is the package's drainGrace, or the shorter one a test set
// (Config.hooks).
func (r *Relay) drainGrace() time.Duration {
	if g := r.cfg.hooks.drainGrace; g > 0 {
		return g
	}
	return drainGrace
}

// Shutdown drains the relay: it stops accepting, sends GOAWAY on every
// connection, and after drainGrace asks every stream to end (clients
// reconnect elsewhere), waits for them until ctx is done, then closes what
// is left and the upstream.
func (r *Relay) Shutdown(ctx context.Context) error {
	r.stopped.Store(true)
	r.ready.Store(false)
	r.health.Shutdown() // NOT_SERVING, for good
	stopped := make(chan struct{})
	go func() {
		r.grpc.GracefulStop() // closes the listener and sends GOAWAY at once
		close(stopped)
	}()
	grace := time.NewTimer(r.drainGrace())
	select {
	case <-grace.C:
	case <-ctx.Done():
	case <-stopped:
	}
	grace.Stop()
	r.down.Drain()
	select {
	case <-stopped:
	case <-ctx.Done():
		r.grpc.Stop()
		<-stopped
	}
	var err error
	for _, h := range []*http.Server{r.rest, r.admin, r.adminLocal} {
		if h != nil {
			err = errors.Join(err, h.Shutdown(ctx))
		}
	}
	// Ends the upstreams, the sweeper and, after a last write, the persister.
	// Under mu, so that no group starts (and joins wg) once it is done.
	r.mu.Lock()
	r.cancel()
	r.mu.Unlock()
	// They get shutdown_timeout of their own, even if the streams used ctx
	// up: the last save of the caches matters more than a stuck client.
	wctx, wcancel := context.WithTimeout(context.Background(), r.cfg.ShutdownTimeout)
	defer wcancel()
	if werr := r.live.wait(wctx); werr != nil {
		// Never wait without bound: what did not end is abandoned.
		werr = fmt.Errorf("relay: shutdown_timeout passed before the upstreams and workers ended: %w", werr)
		r.log.Error("shutdown", "error", werr)
		err = errors.Join(err, werr)
	}
	err = errors.Join(err, r.source.Close())
	if r.fleet != nil {
		err = errors.Join(err, r.fleet.close())
	}
	r.closeReloaders()
	if r.cfg.Cache.PersistDir == "" {
		r.log.Info("shut down; the caches were not saved (cache.persist_dir is not set): the next start begins empty")
	} else {
		r.log.Info("shut down")
	}
	return err
}

var _ downstream.Groups = (*Relay)(nil)

// Join implements downstream.Groups: it places node in its group, creating
// the group (and its upstream stream, presenting this node) if it is the
// first.
func (r *Relay) Join(node *corepb.Node, from downstream.Caller) (*cache.Cache, func(), error) {
	g, release, err := r.join(node, from)
	if err != nil {
		return nil, nil, err
	}
	return g.cache, release, nil
}

// join places node in its group: the one its key names, or, from a peer
// (fleet.go), the one its peer mark names, which a peer's stream makes
// this member fetch from the control plane (the hop rule).
func (r *Relay) join(node *corepb.Node, from downstream.Caller) (*group, func(), error) {
	key, isPeer := r.peerKey(node, from)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ctx.Err() != nil {
		return nil, nil, errors.New("relay is shutting down")
	}
	g := r.groups[key]
	if g == nil {
		if err := r.checkGroupsLocked(); err != nil {
			return nil, nil, err
		}
		var err error
		if g, err = r.startGroupLocked(key, node, nil, isPeer); err != nil {
			return nil, nil, err
		}
	}
	g.clients++
	if isPeer {
		if g.peers++; g.peers == 1 {
			r.wantLocked(g)
		}
	}
	leaveConn := r.joinConnLocked(from, isPeer)
	leaveTier := g.joinTierLocked(node)
	var once sync.Once
	return g, func() {
		once.Do(func() {
			r.mu.Lock()
			g.clients--
			if isPeer {
				if g.peers--; g.peers == 0 {
					r.wantLocked(g)
				}
			}
			leaveConn()
			leaveTier()
			r.mu.Unlock()
		})
	}, nil
}

// startGroupLocked creates a group, its cache filled with saved (restored)
// contents if any, and starts its upstream presenting node; asked says
// that a peer's stream starts it (fleet.go: it is fetched from the
// control plane from the start).
func (r *Relay) startGroupLocked(key string, client *corepb.Node, saved []cache.TypeState, asked bool) (*group, error) {
	ctx, cancel := context.WithCancel(r.ctx)
	g := &group{
		key:    key,
		id:     GroupID(key),
		nodes:  groupNodes(&r.cfg, r.host, key, client),
		fields: keyNode(r.cfg.Upstream.GroupBy, client),
		cancel: cancel,
	}
	opts := cache.Options{Retention: r.cfg.Cache.Retention, MaxResources: r.cfg.Cache.MaxResources,
		MaxNames: r.cfg.Limits.MaxNamesPerGroup, Guard: r.cfg.cacheGuard(),
		OnGuard:       func(ev cache.GuardEvent) { r.guardEvent(g.id, ev) },
		Rollout:       r.cfg.cacheRollout(),
		OnRollout:     func(ev cache.RolloutEvent) { r.rolloutEvent(g.id, ev) },
		Consistency:   r.cfg.cacheConsistency(),
		OnReference:   func(ev cache.ReferenceEvent) { r.referenceEvent(g.id, ev) },
		OnUnsafeOrder: func(u cache.UnsafeOrder) { r.unsafeOrder(g.id, u) },
		OnRefused:     func(rr cache.RefusedReferences) { r.referencesRefused(g.id, rr) }}
	if r.cfg.forwardsNACKs() {
		// Clients' rejections go to the control plane (docs/architecture.md,
		// "Forwarded NACKs"). g.feed is set below, before any client can
		// have the cache (Join hands it out under Relay.mu).
		opts.OnRejected = func(ev cache.Rejection) { g.feed.Rejected(ev) }
	}
	g.cache = cache.New(opts)
	if saved != nil {
		g.cache.Import(saved)
	}
	feed, err := r.groupFeed(g, asked)
	if err != nil {
		cancel()
		return nil, err
	}
	g.feed = feed
	r.zeroGroupSeries(g.id)
	r.goRun(func() { feed.Run(ctx) })
	r.groups[key] = g
	r.groupsG.Set(int64(len(r.groups)))
	r.log.Info("group started", "group", g.id, "key", xds.Clip(key), "upstream_node", xds.Clip(g.nodes[0].GetId()))
	return g, nil
}

// groupFeed is what fills g's cache: the source's feed, or with a fleet a
// switch between the control plane and the group's owner (fleet.go),
// which a peer asks for if asked.
func (r *Relay) groupFeed(g *group, asked bool) (upstream.Feed, error) {
	if r.fleet == nil {
		return r.source.Feed(upstream.Group{ID: g.id, Node: g.nodes[0], Nodes: g.nodes, Cache: g.cache})
	}
	sw, err := r.newSwitch(g)
	if err != nil {
		return nil, err
	}
	g.sw, g.peerNode = sw, r.peerNode(g)
	sw.Want(r.pathFor(g, asked))
	return sw, nil
}

// sweep ends retention periods and, once a group has no clients and
// retains nothing, closes its upstream stream.
func (r *Relay) sweep() {
	every := min(max(r.cfg.Cache.Retention/4, 10*time.Millisecond), time.Second)
	if r.cfg.Rollout.Canary > 0 {
		every = min(every, max(r.cfg.Rollout.Bake/4, 10*time.Millisecond)) // bakes end on time
	}
	if r.cfg.Guard.WipeHold > 0 {
		every = min(every, max(r.cfg.Guard.WipeHold/4, 10*time.Millisecond)) // and wipe holds
	}
	if r.cfg.Consistency.MaxWait > 0 {
		every = min(every, max(r.cfg.Consistency.MaxWait/4, 10*time.Millisecond)) // and reference waits
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-t.C:
		}
		r.sweepOnce()
	}
}

// sweepOnce sweeps every group's cache with no lock held: Sweep marks
// watchers and calls OnGuard and OnRollout, and no lock is held across a
// callback (docs/architecture.md, "Locks"). Then, under Relay.mu, a group
// that has no client, wants and holds nothing (asked again: a client may
// have come and gone meanwhile) and whose load reports are over ends; what
// its store could not deliver is dropped after unlocking (OnDropped).
func (r *Relay) sweepOnce() {
	groups := r.snapshotGroups()
	empty := make(map[*group]bool, len(groups))
	for _, g := range groups {
		empty[g] = g.cache.Sweep()
	}
	var ended []*group
	r.mu.Lock()
	for key, g := range r.groups {
		loadsOver := r.sweepLoadsLocked(g)
		if empty[g] && g.clients == 0 && loadsOver && g.cache.Empty() {
			delete(r.groups, key)
			ended = append(ended, g)
		}
	}
	r.groupsG.Set(int64(len(r.groups)))
	r.mu.Unlock()
	for _, g := range ended {
		endLoads(g)
		// Not waited for: the group's goroutine ends on its own, and
		// Shutdown waits for it with a bound.
		g.cancel()
		r.log.Info("group ended", "group", g.id)
	}
}

// registerGroupMetrics sets, at each scrape, the gauges computed from the
// groups: how old each cache is (since its last upstream response) and how
// many resources it holds.
func (r *Relay) registerGroupMetrics() {
	age := r.metrics.Gauge("xdsrelay_cache_age_seconds", "Seconds since the group's last upstream response (-1 before the first); without the group label, the oldest.", "group").Max()
	size := r.metrics.Gauge("xdsrelay_cache_resources", "Resources cached for the group.", "group")
	evicted := r.metrics.Counter("xdsrelay_cache_evictions_total", "Unwatched resources dropped to keep the group's cache within cache.max_resources.", "group")
	typeSize := r.metrics.Gauge("xdsrelay_cache_type_resources", "Resources of the type cached for the group.", "group", "type")
	typeBytes := r.metrics.Gauge("xdsrelay_cache_type_bytes", "Encoded bytes of the type's resources cached for the group (held once, whatever the number of clients).", "group", "type")
	typeAge := r.metrics.Gauge("xdsrelay_cache_type_age_seconds", "Seconds since the latest upstream response that changed the type in the group's cache (-1 before the first); without the group label, the oldest.", "group", "type").Max()
	var mu lockorder.Mutex[groupScrapeMu]
	var last [][2]string // (group, type) pairs; guarded by mu: scrapes may overlap
	r.metrics.OnScrape(func() {
		mu.Lock()
		defer mu.Unlock()
		seen := map[[2]string]bool{}
		files := r.files()
		for _, g := range r.snapshotGroups() {
			s := g.feed.Status()
			if r.routes != nil || files || r.fleet != nil {
				// With several upstreams: 1 while every stream the group
				// has is up. With resource files: 1, and no reconnects.
				// With a fleet: 1 while the path it is drawn from is up.
				r.upm.Streams.With(g.id).Set(boolGauge(s.Connected))
			}
			if files {
				r.upm.Reconnects.ZeroEach(g.id)
			}
			age.With(g.id).Set(secondsSince(s.LastResponse))
			size.With(g.id).Set(int64(g.cache.Len()))
			evicted.With(g.id).Set(int64(g.cache.Evictions()))
			seen[[2]string{g.id, ""}] = true
			for typeURL, st := range g.cache.Stats() {
				short := xds.ShortName(typeURL)
				typeSize.With(g.id, short).Set(int64(st.Resources))
				typeBytes.With(g.id, short).Set(int64(st.Bytes))
				typeAge.With(g.id, short).Set(secondsSince(st.Received))
				seen[[2]string{g.id, short}] = true
			}
		}
		for _, k := range last {
			if seen[k] {
				continue
			}
			if k[1] == "" {
				if r.routes != nil || files || r.fleet != nil {
					r.upm.Streams.Delete(k[0])
				}
				if files {
					r.upm.Reconnects.Delete(k[0])
				}
				age.Delete(k[0])
				size.Delete(k[0])
				evicted.Delete(k[0])
			} else {
				typeSize.Delete(k[0], k[1])
				typeBytes.Delete(k[0], k[1])
				typeAge.Delete(k[0], k[1])
			}
		}
		last = slices.Collect(maps.Keys(seen))
	})
}

// registerConvergenceMetrics sets, at each scrape, how many clients are
// behind or rejecting, each client counted once per type, from the counts
// the streams keep as they send, are answered and are marked
// (cache/clients.go): the scrape visits the groups' types, never streams
// nor resources.
func (r *Relay) registerConvergenceMetrics() {
	behind := r.metrics.Gauge("xdsrelay_clients_behind", "Clients (streams) of the type owed a change not sent yet (a held rollout, a slow client), each counted once however many resources it holds, in every group; a client rejecting a resource is counted in xdsrelay_clients_rejecting instead.", "type")
	rejecting := r.metrics.Gauge("xdsrelay_clients_rejecting", "Clients (streams) of the type that rejected (NACKed) a resource they hold, each counted once however many resources it rejected, in every group.", "type")
	shorts := make([]string, 0, len(xds.Types))
	for _, t := range xds.Types {
		shorts = append(shorts, xds.ShortName(t))
	}
	behind.ZeroEach(shorts...)
	rejecting.ZeroEach(shorts...)
	var mu lockorder.Mutex[convergenceScrapeMu]
	shown := map[string]bool{} // every type given a series; guarded by mu: scrapes may overlap
	for _, short := range shorts {
		shown[short] = true
	}
	r.metrics.OnScrape(func() {
		mu.Lock()
		defer mu.Unlock()
		sums := map[string][2]int64{}
		for _, g := range r.snapshotGroups() {
			for _, s := range g.cache.ClientSummary() {
				short := xds.ShortName(s.Type)
				v := sums[short]
				sums[short] = [2]int64{v[0] + int64(s.Behind), v[1] + int64(s.Rejected)}
				shown[short] = true
			}
		}
		for short := range shown {
			behind.With(short).Set(sums[short][0]) // 0 for a type no one holds now
			rejecting.With(short).Set(sums[short][1])
		}
	})
}

// registerCertMetrics sets, at each scrape, how long each configured
// certificate has left, as reloaded from its files.
func (r *Relay) registerCertMetrics() {
	left := r.metrics.Gauge("xdsrelay_certificate_expiry_seconds", "Seconds until the certificate the relay presents expires (negative once expired), by side: upstream, downstream, admin.", "side")
	r.metrics.OnScrape(func() {
		for side, rl := range r.certs {
			if notAfter, ok := rl.NotAfter(); ok {
				left.With(side).Set(int64(time.Until(notAfter).Seconds()))
			}
		}
	})
}

// secondsSince is the age of t in whole seconds, -1 for the zero time.
func secondsSince(t time.Time) int64 {
	if t.IsZero() {
		return -1
	}
	return int64(time.Since(t).Seconds())
}

// registerServerMetrics sets, at each scrape, which server of each upstream
// the groups' streams use (gRFC A71): 1 for a server some group's stream
// uses, 0 for the others; 1 for a directory of resource files.
func (r *Relay) registerServerMetrics() {
	inUse := r.metrics.Gauge("xdsrelay_upstream_server", "1 for the server of the upstream that groups' streams use (or are trying), 0 for its other servers (gRFC A71 fallback); a directory of resource files is its upstream's one server, at 1.", "upstream", "server")
	all := append([]UpstreamConfig{r.cfg.Upstream.UpstreamConfig}, r.cfg.Upstreams...)
	r.metrics.OnScrape(func() {
		used := map[[2]string]bool{}
		for _, g := range r.snapshotGroups() {
			for _, u := range upstreamsOf(g.feed.Status()) {
				used[[2]string{u.Upstream, u.Server}] = true
			}
		}
		for _, u := range all {
			if strings.HasPrefix(u.Address, FilePrefix) {
				inUse.With(u.Name, u.Address).Set(1) // the directory: its one server, always in use
				continue
			}
			for _, addr := range u.Servers() {
				v := int64(0)
				if used[[2]string{u.Name, addr}] {
					v = 1
				}
				inUse.With(u.Name, addr).Set(v)
			}
		}
	})
}

func boolGauge(b bool) int64 {
	if b {
		return 1
	}
	return 0
}
