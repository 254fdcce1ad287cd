package downstream

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"runtime"
	"sync"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/authz"
	"github.com/xdsrelay/xdsrelay/internal/lockorder"
	"github.com/xdsrelay/xdsrelay/internal/metrics"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// Groups places a client in its group. The relay implements it; the
// downstream package only needs the group's cache.
type Groups interface {
	// Join returns the cache of the group the node belongs to and a
	// function to call when the stream ends. A *LimitError refuses the
	// client at a limit (limits.max_groups). from is who joins.
	Join(node *corepb.Node, from Caller) (c *cache.Cache, release func(), err error)
}

// Caller is who opens a stream or a poll, as the edge knows it, for the
// groups to judge what of its node to believe: the variant (the stream
// variants, "lrs", "fetch", "rest"), the identities of its verified client
// certificate (none without one) and its address, as CloseConnection takes
// it.
type Caller struct {
	Variant    string
	Identities []string
	Addr       string
}

// Options configure a Server.
type Options struct {
	Groups  Groups            // required
	Metrics *metrics.Registry // required
	Logger  *slog.Logger      // slog.Default() if nil
	// PollTimeout is how long a REST-JSON or gRPC Fetch poll is held when
	// nothing changes; 30s if zero.
	PollTimeout time.Duration
	// SendTimeout is how long a send may stay blocked (the client reads
	// nothing) before the client's connection is closed; 30s if zero.
	SendTimeout time.Duration
	// Authorizer, if set, decides which nodes a client may claim by its
	// certificate (downstream.authorization.rules); nil admits every node.
	Authorizer *authz.Authorizer
	// Limits are the bounds on streams, names and REST-JSON requests.
	Limits Limits
	// AnswerWait bounds how long a stream whose first request names what
	// its client waits for is held for its first answer, so that an answer
	// of errors only can end the stream (see pump.awaitFirst); 0 holds
	// none. The relay sets cache.not_found_timeout, at most 2 s.
	AnswerWait time.Duration
	// WildcardWait is AnswerWait for a stream whose first request is a
	// wildcard of one type: long enough for the relay to learn that its
	// control plane cannot be reached, so that the stream can be ended
	// with UNAVAILABLE (see streamBase.wildcardUnreachable); 0 holds none.
	// The relay sets upstream.connect_timeout and 2 s.
	WildcardWait time.Duration
	// HeldWait bounds how long a SotW stream holds a Listener or Cluster
	// type's first state for a name its client may hold and the relay
	// cannot send: then the stream ends with UNAVAILABLE (held.go,
	// invariant 21). The relay sets upstream.connect_timeout (the
	// longest); 10s if zero.
	HeldWait time.Duration
	// FlushFirst, if set, says of a stream as it joins (its node, who
	// opened it) whether its watch is woken before the others at each
	// change (cache.Watch.SetFirst): a relay below fans out to many
	// clients of its own, and is flushed first.
	FlushFirst func(node *corepb.Node, from Caller) bool
	// Peer, if set, says of a stream as it joins whether it is a fleet
	// peer's: its watch is counted apart from the clients
	// (cache.Watch.SetPeer).
	Peer func(node *corepb.Node, from Caller) bool
	// Loads configure the load reporting service (LRS); not served if
	// Loads.Groups is nil.
	Loads LoadOptions

	// betweenTypes, set by the package's tests only, is called by a flush
	// before each type it sends, with that type: a test changes the cache
	// at that instant. Nil in use.
	betweenTypes func(next string)
}

// Server implements the xDS services on top of the groups' caches.
type Server struct {
	discoverypb.UnimplementedAggregatedDiscoveryServiceServer

	// Read-only after New.
	groups      Groups
	authz       *authz.Authorizer // nil: no authorization
	log         *slog.Logger
	drain       chan struct{} // closed by Drain
	pollTimeout time.Duration
	sendTimeout time.Duration
	answerWait  time.Duration
	wildWait    time.Duration // Options.WildcardWait
	heldWait    time.Duration // Options.HeldWait
	flushFirst  func(*corepb.Node, Caller) bool
	peer        func(*corepb.Node, Caller) bool
	limits      Limits
	admission   *admission
	deadlines   *deadlines // limits.first_request_timeout; nil for none
	loads       LoadOptions
	between     func(next string) // Options.betweenTypes; nil in use

	drainOnce sync.Once
	conns     connSet   // connections accepted by Listen
	endLog    *bucket   // limits warnings about streams ended with an error
	nackLog   *bucket   // limits warnings about clients' NACKs
	registry  registry  // live streams, for CSDS and the admin endpoint
	live      liveSet   // live streams, for Drain
	sends     *sendPool // flushes what the caches mark

	pushMetrics
	streams  *metrics.Vec
	requests *metrics.Vec
	nacks    *metrics.Vec
	acks     *metrics.Vec
	denied   *metrics.Vec
	stuck    *metrics.Value
	pending  *metrics.Value // streams waiting for their first request
	refusals *metrics.Vec
	// resourceErrors counts per-resource errors sent, by type and code.
	resourceErrors *metrics.Vec
	heldEnds       *metrics.Vec // streams ended by a held first state (held.go), by type
}

// New returns a server; register it on a grpc.Server with Register.
func New(opts Options) (*Server, error) {
	if opts.Groups == nil {
		return nil, errors.New("downstream: Options.Groups is required")
	}
	if opts.Metrics == nil {
		return nil, errors.New("downstream: Options.Metrics is required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.PollTimeout <= 0 {
		opts.PollTimeout = defaultPollTimeout
	}
	if opts.SendTimeout <= 0 {
		opts.SendTimeout = 30 * time.Second
	}
	if opts.HeldWait <= 0 {
		opts.HeldWait = heldWaitDefault
	}
	m := opts.Metrics
	return &Server{
		groups:      opts.Groups,
		authz:       opts.Authorizer,
		log:         opts.Logger.With("component", "downstream"),
		drain:       make(chan struct{}),
		pollTimeout: opts.PollTimeout,
		sendTimeout: opts.SendTimeout,
		answerWait:  opts.AnswerWait,
		wildWait:    opts.WildcardWait,
		heldWait:    opts.HeldWait,
		flushFirst:  opts.FlushFirst,
		peer:        opts.Peer,
		between:     opts.betweenTypes,
		limits:      opts.Limits,
		loads:       opts.Loads.defaults(),
		admission:   newAdmission(opts.Limits),
		endLog:      newBucket(endLogRate, endLogBurst),
		nackLog:     newBucket(endLogRate, endLogBurst),
		sends:       newSendPool(runtime.GOMAXPROCS(0)),
		deadlines:   newFirstDeadlines(opts.Limits.FirstRequestTimeout),
		stuck:       m.Counter("xdsrelay_downstream_stuck_total", "Client connections closed because a send to them stayed blocked (the client read nothing) for downstream.send_timeout.").With(),
		streams:     m.Gauge("xdsrelay_downstream_streams", "Open downstream xDS streams.", "variant").ZeroEach(streamVariants...),
		pushMetrics: newPushMetrics(m),
		requests:    m.Counter("xdsrelay_downstream_requests_total", "Requests received from downstream clients.", "type").ZeroEach(xds.TypeLabels()...),
		nacks:       m.Counter("xdsrelay_downstream_nacks_total", "Responses rejected (NACKed) by downstream clients.", "type").ZeroEach(xds.TypeLabels()...),
		acks:        m.Counter("xdsrelay_downstream_acks_total", "Requests that accept (ACK) a response: they carry its nonce and no error_detail.", "type").ZeroEach(xds.TypeLabels()...),
		denied: m.Counter("xdsrelay_downstream_denied_total", "Clients refused by downstream.authorization.rules (PERMISSION_DENIED, or 403 over REST-JSON); reason identity: no rule matches the certificate, node: a rule matches it but not the node claimed.", "variant", "reason").
			Zero(metrics.Cross(deniedVariants, []string{authz.ReasonIdentity, authz.ReasonNode})...),
		pending:  m.Gauge("xdsrelay_downstream_pending_streams", "Open downstream xDS streams that have not sent their first request (ended after limits.first_request_timeout).").With(),
		refusals: m.Counter("xdsrelay_limit_refusals_total", "Streams, requests and polls refused at a limit, by the limits.* key.", "limit").ZeroEach(LimitLabels...),
		resourceErrors: m.Counter("xdsrelay_resource_errors_total", "Per-resource errors sent to clients (gRFC A88 resource_errors), the control plane's and the relay's own (NOT_FOUND: an authority no upstream serves, a name the control plane did not send in time on a stream shown alive, or one no resource file defines; PERMISSION_DENIED: an authority the client's certificate may not ask for; UNAVAILABLE: every server that could serve it unreachable, a connected server silent past the timer, or not received yet beside a SotW Listener or Cluster state sent without it), by type and code.", "type", "code").
			Zero(metrics.Cross(xds.TypeLabels(), ownErrorCodes)...),
		heldEnds: m.Counter("xdsrelay_downstream_held_ends_total", "SotW streams ended with UNAVAILABLE because the relay could not send a Listener or Cluster state without leaving out a name the client may hold and the relay does not have (an error is never absence), within upstream.connect_timeout of the client's first request of the type, by type.", "type").
			ZeroEach(xds.TypeLabels()...),
	}, nil
}

// ownErrorCodes are the codes of the per-resource errors the relay makes
// itself (gRFC A88): each type's series of xdsrelay_resource_errors_total
// with them exists at 0 from the start. The control plane's codes are
// counted as they come.
var ownErrorCodes = []string{xds.CodeName(int32(codes.NotFound)), xds.CodeName(int32(codes.Unavailable)),
	xds.CodeName(int32(codes.PermissionDenied))}

// ServerOptions are the grpc.ServerOptions the downstream server needs: the
// codec that writes pre-encoded responses.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.ForceServerCodecV2(xds.Codec{})}
}

// CloseConnection closes the client connection from addr (a Caller's
// Addr), reporting whether there was one: its streams end with
// UNAVAILABLE and its client reconnects, as Drain does for every
// connection. gRPC gives a server no GOAWAY of one connection alone.
func (s *Server) CloseConnection(addr string) bool { return s.conns.close(addr) }

// Drain asks every stream and poll to end with UNAVAILABLE, so that clients
// reconnect (to another replica) while the process shuts down.
func (s *Server) Drain() {
	s.drainOnce.Do(func() {
		close(s.drain)
		s.endStreams()
	})
}

// recvError is the handler's result once Recv has failed: nil for a client
// that closed its side, else the error.
func recvError(err error) error {
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// resolveType checks a request's type URL against the stream's service.
func resolveType(typeURL, fixed string) (string, error) {
	switch {
	case fixed != "" && typeURL == "":
		return fixed, nil
	case fixed != "" && typeURL != fixed:
		return "", status.Errorf(codes.InvalidArgument, "xdsrelay: type_url %q on a stream for %s", typeURL, fixed)
	case typeURL == "":
		return "", status.Error(codes.InvalidArgument, "xdsrelay: type_url is required on an ADS stream")
	case !xds.Known(typeURL):
		return "", status.Errorf(codes.InvalidArgument, "xdsrelay: unknown resource type %q", typeURL)
	}
	return xds.Canonical(typeURL), nil
}

// join places the stream's node in its group ("Basic Protocol Overview": the
// node is read from the first request only).
func (s *Server) join(node *corepb.Node, who client) (*cache.Cache, func(), error) {
	if node == nil {
		return nil, nil, status.Error(codes.InvalidArgument, "xdsrelay: the first request on a stream must carry the node")
	}
	c, release, err := s.groups.Join(node, who.caller())
	if err != nil {
		return nil, nil, joinError(err)
	}
	return c, release, nil
}

var errDraining = status.Error(codes.Unavailable, "xdsrelay: shutting down, reconnect")

// sendGuard is a send that cannot block the stream forever: if a send stays
// blocked for the send timeout (the client reads nothing), the client's
// connection is closed, which ends the blocked send and the stream
// (docs/architecture.md, invariant 5 "Slow clients hurt only themselves").
// Closing the connection rather than
// the stream is what gRPC allows, and a client that reads nothing has
// stalled its whole connection anyway. After slowSend the send pool is told,
// so that the blocked worker is replaced. The send pool's watchdog does the
// watching: a send shows itself in its worker's slot, or, on the handler's
// goroutine, in the guard's own slot while it lasts. The guard also
// observes the stream's first response
// (xdsrelay_downstream_first_response_seconds).
type sendGuard struct {
	srv     *Server
	ctx     context.Context
	sendMsg func(any) error
	conn    *sendConn // the stream's connection in the send pool; set before the first send

	// Written by the goroutine that sends, one at a time (the pump's mu).
	slot     *sendSlot        // the worker's that flushes; nil on the handler's goroutine
	own      sendSlot         // the slot of a send on the handler's goroutine
	first    metrics.Observer // the time to the first response, by variant
	opened   time.Time        // when the stream opened
	answered bool             // a send succeeded: first was observed

	mu      lockorder.Mutex[sendGuardMu]
	sending bool
	worker  bool // the send runs on a send worker, not on the handler's goroutine
	slow    bool // the watchdog found this send slow (and told the pool, if worker)
	closed  bool // the connection was closed
	started time.Time
}

func (s *Server) guard(ctx context.Context, sendMsg func(any) error, variant string, opened time.Time) *sendGuard {
	return &sendGuard{srv: s, ctx: ctx, sendMsg: sendMsg, first: s.first.With(variant), opened: opened}
}

func (g *sendGuard) send(m any) error {
	g.mu.Lock()
	g.sending, g.slow, g.started, g.worker = true, false, time.Now(), g.slot != nil
	g.mu.Unlock()
	slot := g.slot
	if slot == nil {
		slot = &g.own
		g.srv.sends.watch(slot)
	}
	slot.g.Store(g)
	err := g.sendMsg(m)
	slot.g.Store(nil)
	if slot == &g.own {
		g.srv.sends.unwatch(slot)
	}
	g.mu.Lock()
	g.sending = false
	slow := g.slow && g.worker
	g.mu.Unlock()
	if slow {
		g.srv.sends.unblocked(g.conn)
	}
	if err == nil && !g.answered {
		g.answered = true
		g.first.Observe(time.Since(g.opened).Seconds())
	}
	return err
}

// check is the watchdog's look at a send in progress: first it is slow,
// then it is stuck.
func (g *sendGuard) check(now time.Time) {
	g.mu.Lock()
	if !g.sending || g.closed {
		g.mu.Unlock()
		return
	}
	blocked := now.Sub(g.started)
	switch {
	case blocked >= g.srv.sendTimeout:
		g.closed = true
		g.mu.Unlock()
		g.srv.closeStuck(g.ctx)
		return
	case blocked >= slowSend && !g.slow:
		g.slow = true
		if g.worker {
			// A worker is counted out of the pool and its connection's
			// other streams go to another. A send on the handler's
			// goroutine holds no worker and no place in the connection's
			// queue: telling the pool would count a blocked worker that
			// does not exist, and the connection would wait for it.
			g.srv.sends.slow(g.conn)
		}
	}
	g.mu.Unlock()
}

// closeStuck closes the connection of the stream whose context ctx is.
func (s *Server) closeStuck(ctx context.Context) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return
	}
	s.stuck.Inc()
	if !s.conns.close(p.Addr.String()) {
		s.log.Error("a client reads nothing but its connection is unknown: serve on Server.Listen", "peer", p.Addr)
		return
	}
	s.log.Warn("closed the connection of a client that reads nothing", "peer", p.Addr, "after", s.sendTimeout)
}
