package upstream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/protobuf/proto"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/lockorder"
	"github.com/xdsrelay/xdsrelay/internal/metrics"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// Metrics are the upstream families, shared by every group's client.
type Metrics struct {
	Streams    *metrics.Vec          // gauge, by group: 1 while the stream is up
	Responses  *metrics.Vec          // counter, by type
	NACKs      *metrics.Vec          // counter, by type: responses the relay rejected
	Apply      *metrics.HistogramVec // by type: seconds to apply a response to the cache
	Reconnects *metrics.Vec          // counter, by group: streams that ended and are opened again, a connection's failed attempt once
	Fallbacks  *metrics.Vec          // counter, by upstream: moves to a lower-priority server (gRFC A71)
	// Protocol is a gauge, by upstream, server and protocol: 1 for what
	// each server was found to speak.
	Protocol *metrics.Vec
	// ListTooLarge is a counter, by type: names not subscribed because a
	// state-of-the-world request with them would exceed
	// upstream.max_request_bytes.
	ListTooLarge *metrics.Vec
	// WildcardReopens is a counter, by type: SotW streams opened again
	// for the legacy wildcard (sotwType.list).
	WildcardReopens *metrics.Vec
	// DeltaWildcardReopens is a counter, by type: delta streams opened
	// again for the legacy wildcard (session.wildcardAfterNames).
	DeltaWildcardReopens *metrics.Vec
	// Stalls is a counter, by upstream: streams ended because a response
	// stopped half-way for upstream.stall_timeout (stall.go).
	Stalls *metrics.Vec
	// ForwardedNACKs is a counter, by type and outcome: versions clients
	// rejected, told the control plane (sent) or not (dropped: past the
	// bounds of forward.go).
	ForwardedNACKs *metrics.Vec
	// StaleRemoved is a counter, by type: names a new SotW stream's
	// wildcard did not send within cache.retention, removed
	// (sotw_sweep.go).
	StaleRemoved *metrics.Vec
	// UnservedTypes is a gauge, by upstream, server and type: 1 for each
	// type a server was found not to serve (refusal.go).
	UnservedTypes *metrics.Vec
	// UnservedNames is a counter, by type: names a stream did not ask of
	// its server because the server does not serve their type.
	UnservedNames *metrics.Vec
}

// NewMetrics registers the upstream families on r.
func NewMetrics(r *metrics.Registry) *Metrics {
	return &Metrics{
		Streams:   r.Gauge("xdsrelay_upstream_connected", "1 while the group's upstream stream (delta or state of the world) is up.", "group"),
		Responses: r.Counter("xdsrelay_upstream_responses_total", "Responses received from the control plane.", "type"),
		NACKs:     r.Counter("xdsrelay_upstream_nacks_total", "Upstream responses the relay rejected (NACKed).", "type"),
		Apply: r.Histogram("xdsrelay_upstream_apply_seconds", "Time to apply one control-plane response to the group's cache.",
			metrics.LatencyBuckets, "type"),
		Reconnects: r.Counter("xdsrelay_upstream_reconnects_total", "Times the group's upstream stream ended and is being opened again (with backoff); a failed connection attempt counts once, however many streams failed on it.", "group"),
		Fallbacks:  r.Counter("xdsrelay_upstream_fallbacks_total", "Times a group's stream moved to a lower-priority server of the upstream, the higher ones being unreachable with something wanted not cached (gRFC A71).", "upstream"),
		Protocol: r.Gauge("xdsrelay_upstream_protocol", "1 for the protocol each control-plane server answered in (upstream.protocol): delta, sotw or sotw-per-type; 0 for the others, and for each while nothing answered (a directory of resource files speaks none).",
			"upstream", "server", "protocol"),
		ListTooLarge: r.Counter("xdsrelay_upstream_sotw_names_refused_total",
			"Names not subscribed upstream because a state-of-the-world request with them would exceed upstream.max_request_bytes (SotW requests cannot be split).", "type").
			ZeroEach(xds.TypeLabels()...),
		WildcardReopens: r.Counter("xdsrelay_upstream_sotw_wildcard_reopens_total",
			"State-of-the-world streams opened again because the wildcard came to a type they had named names of: only a new stream can ask with the legacy wildcard (no names).", "type").
			ZeroEach(xds.TypeLabels()...),
		DeltaWildcardReopens: r.Counter("xdsrelay_upstream_delta_wildcard_reopens_total",
			"Delta streams opened again because the wildcard came to a type they had asked for by name first: a control plane that takes \"*\" for a name (go-control-plane v0.10) knows the wildcard only as a new stream's first request of the type with no names.", "type").
			ZeroEach(xds.TypeLabels()...),
		Stalls: r.Counter("xdsrelay_upstream_stalls_total",
			"Upstream streams ended and opened again because a response stopped half-way for upstream.stall_timeout, the connection alive.", "upstream"),
		ForwardedNACKs: r.Counter("xdsrelay_upstream_forwarded_nacks_total",
			"Versions of resources that clients rejected, by outcome: sent (told the control plane in a NACK of its response, once per version, coalesced per type) or dropped (past the bounds on what waits to be told). Off with upstream.forward_nacks: false.", "type", "outcome").
			Zero(metrics.Cross(xds.TypeLabels(), []string{"sent", "dropped"})...),
		StaleRemoved: r.Counter("xdsrelay_upstream_sotw_stale_removed_total",
			"Names of a type other than Listener and Cluster, held under the wildcard, that a new state-of-the-world stream to the control plane did not send within cache.retention of asking: the server no longer has them, and they are removed.", "type").
			ZeroEach(xds.TypeLabels()...),
		UnservedTypes: r.Gauge("xdsrelay_upstream_unserved_types",
			"1 for each type a control-plane server was found not to serve (it ended a stream that asked for it, in its own words: a one-type cache's \"does not match cache type\", a per-type service it lacks), 0 for the others: the type is not asked of that server again until a stream to it fails without an answer.",
			"upstream", "server", "type"),
		UnservedNames: r.Counter("xdsrelay_upstream_unserved_names_total",
			"Names not asked of a control-plane server, on each stream that left them out, because the server does not serve their type (xdsrelay_upstream_unserved_types): names clients asked for, which get UNAVAILABLE, and names resources point at, which are not fetched.", "type").
			ZeroEach(xds.TypeLabels()...),
	}
}

// Options configure a Client, or an ADS source (NewADS), which makes one
// Client per group with the group's fields filled from its Group.
type Options struct {
	// The control plane's, shared by its groups' clients.

	// Servers are the control plane's servers in priority order (gRFC
	// A71); Conn alone stands for one server.
	Servers []Server
	Conn    grpc.ClientConnInterface // the control plane, if Servers is empty
	Metrics *Metrics                 // required
	Logger  *slog.Logger             // slog.Default() if nil
	Backoff backoff.Config           // backoff.DefaultConfig if zero
	// FallbackRecheck is how often, while on a fallback server, the
	// higher-priority servers are tried; DefaultFallbackRecheck if 0.
	FallbackRecheck time.Duration
	// NotFoundTimeout is how long a subscribed name may go unanswered
	// before it is taken not to exist, on a stream known to be alive; 0
	// disables the timer.
	NotFoundTimeout time.Duration
	// ProbeTimeout bounds the probe of a stream's connection that the
	// timer sends when the stream has shown no sign of life since the
	// names were asked (notfound.go); DefaultProbeTimeout if 0.
	ProbeTimeout time.Duration
	// StallTimeout is how long a response partly received (watched by
	// the servers' Frames) may make no progress before its stream is
	// ended as stalled (stall.go); DefaultStallTimeout if 0, never if
	// negative.
	StallTimeout time.Duration
	// MaxRequestBytes bounds every request sent upstream: subscriptions
	// and resumes larger than this are split. DefaultMaxRequestBytes if 0.
	MaxRequestBytes int
	// Protocol is what the servers are spoken to in (upstream.protocol);
	// auto, found per server, if empty.
	Protocol Protocol
	found    *found // what each server speaks: shared by an ADS source's clients

	// The group's (see Group).

	Node  *corepb.Node // presented upstream; required
	Cache *cache.Cache // the group's cache; required
	Group string       // the group id (relay.GroupID), for logs and metrics
	// Upstream names the control plane in logs and metrics;
	// DefaultUpstream if empty.
	Upstream string
	// Peers says the servers are members of the relay's fleet, not a
	// control plane: a stream's end is logged at debug (the fleet logs a
	// member that goes, once: fleet.Members), and logs name a peer.
	Peers bool
	// Interest is the union of interests the client subscribes to: the
	// cache's whole interest if nil, or a router's share of it.
	Interest Interest
	// Owns reports whether a name of a type is this upstream's to serve:
	// a response's resources and removals of other names are dropped, and
	// resumes carry only these names. Every name is, if nil.
	Owns func(typeURL, name string) bool
	// Rejections is the inbox of the versions clients rejected, to
	// forward (forward.go); the client makes its own if nil.
	Rejections *Rejections
	// ForwardNACKs tells the control plane of the versions clients
	// rejected (forward.go, upstream.forward_nacks); what Rejections
	// holds is dropped, uncounted, if false.
	ForwardNACKs bool
	// ForwardInterval is the least time between two forwarded NACKs of
	// one type (forward.go); ForwardInterval if 0.
	ForwardInterval time.Duration
	// Prove makes every stream's resume leave one cached name of each
	// type out of its initial versions, as a fallback probe's does: a
	// server with nothing new would answer nothing, and this one name it
	// must send (for a Switch, whose new path takes over once it answers).
	Prove bool
	// Fresh makes every stream subscribe without initial_resource_versions:
	// the server sends all it has of what is asked. For a server that
	// counts a client as holding only what it sent it (a relay's
	// convergence counts), at the cost of sending again what the cache
	// holds, which the cache drops unchanged.
	Fresh bool
}

// Server is one server of a control plane.
type Server struct {
	Name string // its address, for logs, metrics and /debug
	Conn grpc.ClientConnInterface
	// Frames watches Conn's HTTP/2 frames (WatchFrames): what is partly
	// received. nil: the stream's liveness is its responses and probes
	// alone, and no stream is found stalled.
	Frames *Frames
	// Attempts follows Conn's attempts to connect (TrackAttempts): each
	// failed one is then reported once, and retried after gRPC's next. A
	// stream's every failure is reported, on the client's backoff, if nil.
	Attempts *Attempts
}

// DefaultFallbackRecheck is how often higher-priority servers are tried
// while on a fallback server, unless Options say otherwise.
const DefaultFallbackRecheck = 30 * time.Second

// DefaultProbeTimeout bounds a probe of a stream's connection, unless
// Options say otherwise: gRPC's keepalive timeout's order.
const DefaultProbeTimeout = 10 * time.Second

// Interest is what a client reads of the names it is to subscribe to. The
// group's *cache.Cache is one; a router's view of one upstream's share is
// another.
type Interest interface {
	InterestChanged() <-chan struct{}
	InterestChanges() (changes map[string]map[string]bool, all bool)
	Interest() map[string]cache.Interest
	TypeInterest(typeURL string) cache.Interest
}

// Client is one group's upstream: a delta-ADS stream to one of the control
// plane's servers, re-established with exponential backoff whenever it
// fails, moved to a lower-priority server and back by gRFC A71's rules.
type Client struct {
	// Read-only after New.
	opts    Options
	servers []server
	log     *slog.Logger

	mu     lockorder.Mutex[clientMu]
	status Status // guarded by mu

	// Owned by Run.
	fwd      forwarding // the rejections to forward (forward.go); its inbox is safe for concurrent use
	reach    reach
	reported []reportedAttempt // by server: the connection attempt a failure on it was last reported for
	lastEnd  string            // the error the last stream ended with (repeats)
	missed   missedMemo        // missing's last answer
}

// missedMemo is missing's answer, for as long as neither the cache nor
// the interest changes.
type missedMemo struct {
	gen     [2]uint64 // the cache's and the interest's generations
	set     bool
	missing bool
}

type server struct {
	name     string
	conn     grpc.ClientConnInterface
	ads      discoverypb.AggregatedDiscoveryServiceClient
	frames   *Frames
	attempts *Attempts // nil if the connection's attempts are not followed
}

// reportedAttempt is the connection's failed attempts when a stream's
// failure was last reported; set only if the connection was failing then.
type reportedAttempt struct {
	failed uint64
	set    bool
}

// Status is what the admin endpoint shows of a group's upstream.
type Status struct {
	Connected    bool      // the stream is open and subscribed
	LastResponse time.Time // of the last response received; zero if none yet
	LastError    string    // why the last stream ended
	Invalid      string    // what the source holds but does not serve, and why (resource files); empty if nothing
	Upstream     string    // the upstream's name (DefaultUpstream for the only one)
	Server       string    // the server in use, or being tried
	// Protocol is what the server in use answered in (delta, sotw,
	// sotw-per-type); empty until it answers.
	Protocol string
	// Refused is what the server refused on the last stream, in its
	// words, and what is tried next (refusal.go); empty once a stream
	// answers.
	Refused string
	// Unheard says that the server has answered nothing on the stream a
	// whole cache.not_found_timeout after it was asked, with the node id
	// presented (notfound.go, unheard); empty once it answers.
	Unheard string
	// Unserved is the types the server in use was found not to serve
	// (refusal.go), by short name.
	Unserved []string
	// Upstreams is, for a group served by several upstreams, each one's
	// status (those with a stream open, in configuration order); the
	// fields above then sum them up.
	Upstreams []Status
}

// Status returns the upstream's current status.
func (c *Client) Status() Status {
	c.mu.Lock()
	s := c.status
	c.mu.Unlock()
	s.Unserved = c.opts.found.unservedOf(s.Server)
	return s
}

func (c *Client) setStatus(f func(*Status)) {
	c.mu.Lock()
	f(&c.status)
	c.mu.Unlock()
}

// New returns a client; Run starts it.
func New(opts Options) (*Client, error) {
	if len(opts.Servers) == 0 && opts.Conn != nil {
		opts.Servers = []Server{{Conn: opts.Conn}}
	}
	switch {
	case len(opts.Servers) == 0:
		return nil, errors.New("upstream: Options.Servers (or Conn) is required")
	case opts.Node == nil:
		return nil, errors.New("upstream: Options.Node is required")
	case opts.Cache == nil:
		return nil, errors.New("upstream: Options.Cache is required")
	case opts.Metrics == nil:
		return nil, errors.New("upstream: Options.Metrics is required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Backoff == (backoff.Config{}) {
		opts.Backoff = backoff.DefaultConfig
	}
	if opts.MaxRequestBytes <= 0 {
		opts.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if opts.FallbackRecheck <= 0 {
		opts.FallbackRecheck = DefaultFallbackRecheck
	}
	if opts.ProbeTimeout <= 0 {
		opts.ProbeTimeout = DefaultProbeTimeout
	}
	if opts.StallTimeout == 0 {
		opts.StallTimeout = DefaultStallTimeout
	}
	if opts.Upstream == "" {
		opts.Upstream = DefaultUpstream
	}
	if opts.ForwardInterval <= 0 {
		opts.ForwardInterval = ForwardInterval
	}
	if opts.Interest == nil {
		opts.Interest = opts.Cache
	}
	opts.Node = proto.Clone(opts.Node).(*corepb.Node)
	if opts.found == nil {
		opts.found = newFound(opts.Protocol, opts.Upstream, opts.Peers, serverNames(opts.Servers), opts.Metrics, opts.Logger)
	}
	c := &Client{
		opts: opts,
		log:  opts.Logger.With("component", "upstream", "group", opts.Group, "upstream", opts.Upstream),
	}
	for _, s := range opts.Servers {
		if s.Conn == nil {
			return nil, fmt.Errorf("upstream: server %q has no connection", s.Name)
		}
		c.servers = append(c.servers, server{name: s.Name, conn: s.Conn, ads: discoverypb.NewAggregatedDiscoveryServiceClient(s.Conn),
			frames: s.Frames, attempts: s.Attempts})
	}
	c.reported = make([]reportedAttempt, len(c.servers))
	c.fwd = newForwarding(opts.Rejections)
	c.status = Status{Upstream: opts.Upstream, Server: c.servers[0].name}
	return c, nil
}

func serverNames(servers []Server) []string {
	out := make([]string, len(servers))
	for i, s := range servers {
		out[i] = s.Name
	}
	return out
}

// routed reports whether the client is one of a router's upstreams: the
// group's series (connected, reconnects) are then the router's, summing up
// its upstreams; the client only adds its reconnects.
func (c *Client) routed() bool { return c.opts.Owns != nil }

// owns reports whether name of typeURL is this upstream's.
func (c *Client) owns(typeURL, name string) bool {
	return c.opts.Owns == nil || c.opts.Owns(typeURL, name)
}

// Run keeps a stream up until ctx is done, on the first server that
// answers by gRFC A71's rules: a server is left for the next only when it
// is unreachable and something wanted is not cached; while on a lower
// server, the higher ones are tried every FallbackRecheck, and one that
// answers takes over (see loop). A server's refusal is an answer
// (refusal.go): what it refused is learned, and the next stream is opened
// at once without it.
func (c *Client) Run(ctx context.Context) {
	if !c.routed() {
		defer c.opts.Metrics.Streams.Delete(c.opts.Group)
		defer c.opts.Metrics.Reconnects.Delete(c.opts.Group)
	}
	cur := 0
	var next *session // a higher server's session that answered, taking over
	for attempt := 0; ; attempt++ {
		s, healthy, takeover, err := c.stream(ctx, cur, next)
		next = nil
		switch {
		case takeover != nil:
			c.log.Info("higher-priority server reachable again; moved back to it (gRFC A71)",
				"from", c.servers[cur].name, "to", c.servers[takeover.server].name)
			cur, next, attempt = takeover.server, takeover, -1
			continue
		case ctx.Err() != nil:
			c.ended(ctx, cur, healthy, err, "")
			return
		case c.reopened(s, err):
			attempt = -1
			continue
		}
		again, refusedAll := c.refusal(s, healthy, err)
		if again {
			continue
		}
		if s != nil {
			s.withdraw() // the stream failed: its silence may have been the network's
		}
		repeat := c.repeats(s, err)
		c.ended(ctx, cur, healthy, err, refusedAll)
		switch {
		case refusedAll != "":
			c.refusedEvery(cur, refusedAll)
		case healthy && !repeat:
			attempt = 0 // the stream had worked: start the backoff again
		case !healthy:
			c.unreached(cur)
		}
		cur = c.wait(ctx, cur, healthy, attempt)
		c.awaitAttempt(ctx, cur)
	}
}

// stream runs one stream on server cur, or next (a higher server's
// session taking over, already open and subscribed), until it ends;
// healthy reports whether the control plane answered on it. s is nil if
// the stream could not be opened.
func (c *Client) stream(ctx context.Context, cur int, next *session) (s *session, healthy bool, takeover *session, err error) {
	s = next
	if s == nil {
		c.setStatus(func(st *Status) { st.Server = c.servers[cur].name })
		if s, err = c.open(ctx, cur); err == nil {
			err = s.why(s.syncAll())
		}
		if err != nil {
			s.close()
			return s, false, nil, err
		}
		c.up(s)
	}
	healthy, takeover, err = c.loop(ctx, s)
	err = s.why(err)
	s.close()
	return s, healthy, takeover, err
}

// repeats reports whether a stream of s ended as the one before it did,
// with the same error, and soon: the backoff then keeps growing even if
// the stream answered (a server that answers, then ends every stream the
// same way, is not hammered every upstream.reconnect.base_delay). A stream
// that lived longer than the backoff's cap starts it again whatever its
// error: ended by a max connection age, say.
func (c *Client) repeats(s *session, err error) bool {
	why := fmt.Sprint(err)
	same := why == c.lastEnd
	c.lastEnd = why
	return same && s != nil && time.Since(s.opened) < c.opts.Backoff.MaxDelay
}

// reopened reports whether s ended to be opened again at once: a type
// named on it is now wanted under the wildcard, which only a new stream
// can ask in the legacy form (sotwType.list, session.wildcardAfterNames).
// It is counted and logged, once per such change; the stream was alive,
// so what its timer judged stands (no withdraw), and no backoff is due.
func (c *Client) reopened(s *session, err error) bool {
	var re *reopenError
	if !errors.As(err, &re) {
		return false
	}
	count := c.opts.Metrics.WildcardReopens
	if re.delta {
		count = c.opts.Metrics.DeltaWildcardReopens
	}
	count.With(xds.ShortName(re.typeURL)).Inc()
	c.log.Info("the wildcard came to a type named on the "+re.protocol()+" stream; opening the stream again to ask with the legacy wildcard",
		"type", xds.ShortName(re.typeURL), "server", c.servers[s.server].name)
	return true
}

// ended records why a stream ended. A failure that only repeats the
// connection's attempt already reported is not counted or logged again
// (see repeated). refusedAll, if set, is what the server refused: every
// protocol the relay may speak to it (refusal).
func (c *Client) ended(ctx context.Context, cur int, healthy bool, err error, refusedAll string) {
	if !c.routed() {
		c.opts.Metrics.Streams.With(c.opts.Group).Set(0)
	}
	why := Explain(fmt.Sprint(err))
	c.setStatus(func(s *Status) { s.Connected, s.LastError, s.Refused = false, why, refusedAll })
	if ctx.Err() != nil {
		return
	}
	if c.repeated(cur, healthy) {
		c.log.Debug("upstream stream failed again on the connection attempt already reported", "server", c.servers[cur].name, "error", err)
		return
	}
	c.opts.Metrics.Reconnects.With(c.opts.Group).Inc()
	if refusedAll != "" {
		c.log.Error("control plane server refused the protocol; asking again after the backoff", "server", c.servers[cur].name,
			"refused", refusedAll, "upstream.protocol", c.opts.found.configured)
		return
	}
	attrs := []any{"server", c.servers[cur].name, "error", err, "answered", healthy}
	if kind := Silent(why); kind != "" {
		attrs = append(attrs, "why", kind)
	}
	if c.opts.Peers {
		c.log.Debug("fleet peer stream ended; reconnecting", attrs...)
		return
	}
	c.log.Warn("upstream stream ended; reconnecting", attrs...)
}

// repeated reports whether a stream on server i that ended unanswered
// only repeats the failure already reported: its connection is in
// TRANSIENT_FAILURE and has failed no attempt since, so the stream failed
// at once with that attempt's error. Otherwise the failure is marked
// reported.
func (c *Client) repeated(i int, healthy bool) bool {
	failed, failing, _, tracked := c.servers[i].attempts.now()
	last := &c.reported[i]
	if !healthy && tracked && failing && last.set && last.failed == failed {
		return true
	}
	*last = reportedAttempt{failed: failed, set: tracked && failing}
	return false
}

// awaitAttempt waits, before a stream is opened on server i again, until
// its connection has something new to say: an attempt failed since the
// failure reported, or the connection left TRANSIENT_FAILURE. gRPC's
// backoff and upstream.connect_timeout pace the attempts; a stream opened
// sooner would fail at once with the error already reported. A client
// that asks for something meanwhile is answered as during wait: told
// UNAVAILABLE once every server failed, and with several servers, the
// wait ends so that the next may be tried for what is not cached. The
// wait is bounded by the backoff's cap: a stream opened then on the same
// attempt is a repeat, not reported (see repeated).
func (c *Client) awaitAttempt(ctx context.Context, i int) {
	var interest <-chan struct{}
	if len(c.servers) > 1 || c.reach.down {
		interest = c.opts.Interest.InterestChanged()
	}
	bound := time.NewTimer(c.opts.Backoff.MaxDelay)
	defer bound.Stop()
	for {
		failed, failing, next, tracked := c.servers[i].attempts.now()
		if last := c.reported[i]; !tracked || !failing || !last.set || last.failed != failed {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-bound.C:
			return
		case <-next:
		case <-interest:
			if c.reach.down {
				c.markUnavailable()
			}
			if len(c.servers) > 1 && c.missing() {
				return
			}
		}
	}
}

// wait waits out the backoff after a stream on server cur ended, and
// returns the server to try next (gRFC A71): the same one if it had
// answered; if not, the next one when something wanted is not cached, else
// the first (everything is served from the cache meanwhile, and the higher
// servers are tried again). A client that asks for something not cached
// during the wait moves the stream on at once.
func (c *Client) wait(ctx context.Context, cur int, healthy bool, attempt int) int {
	delay := backoffDelay(c.opts.Backoff, attempt)
	t := time.NewTimer(delay)
	defer t.Stop()
	var interest <-chan struct{}
	if !healthy && (len(c.servers) > 1 || c.reach.down) {
		interest = c.opts.Interest.InterestChanged()
	}
	for {
		select {
		case <-ctx.Done():
			return cur
		case <-t.C:
			return c.nextServer(cur, healthy)
		case <-interest:
			// A new session syncs the whole interest: the signal is not lost.
			if c.reach.down {
				c.markUnavailable() // what clients ask meanwhile
			}
			if len(c.servers) > 1 && c.missing() {
				return c.nextServer(cur, healthy)
			}
		}
	}
}

// unreached records that server cur failed without answering: what was
// found of it is forgotten (it may be another server when it is reached
// again), and once every server has failed, what is wanted and not cached
// is UNAVAILABLE (see reach).
func (c *Client) unreached(cur int) {
	c.opts.found.forget(c.servers[cur].name)
	if c.reach.fail(cur, len(c.servers), "") {
		c.markUnavailable()
	}
}

// nextServer is the server to try after cur (see wait).
func (c *Client) nextServer(cur int, healthy bool) int {
	switch {
	case healthy || len(c.servers) == 1:
		return cur
	case !c.missing():
		return 0
	case cur+1 < len(c.servers):
		c.opts.Metrics.Fallbacks.With(c.opts.Upstream).Inc()
		c.log.Warn("server unreachable and resources wanted are not cached; falling back (gRFC A71)",
			"from", c.servers[cur].name, "to", c.servers[cur+1].name)
		return cur + 1
	default:
		return 0
	}
}

// missing reports whether the group wants something of this upstream that
// the cache does not hold: a named resource neither present nor known not
// to exist, or a wildcard not yet answered. A name fetched only because
// resources point at it (cache.Lookup.Referenced) is not wanted yet: a
// Cluster's endpoints that the control plane does not have move no stream.
// The interest is read again only once the cache or the interest changed
// (their generations): a stream that fails over and over while nothing
// changes costs no walk of the group per failure.
func (c *Client) missing() bool {
	gen := [2]uint64{c.opts.Cache.Generation()}
	if g, ok := c.opts.Interest.(interface{ Generation() uint64 }); ok {
		gen[1] = g.Generation()
	}
	if c.missed.set && c.missed.gen == gen {
		return c.missed.missing
	}
	m := missing(c.opts.Interest, c.opts.Cache)
	c.missed = missedMemo{gen: gen, set: true, missing: m}
	return m
}

// missing reports whether interest wants something c does not hold (see
// Client.missing), read from the whole interest.
func missing(interest Interest, c *cache.Cache) bool {
	for typeURL, in := range interest.Interest() {
		if in.Wildcard && !c.Synced(typeURL) {
			return true
		}
		for _, l := range c.Get(typeURL, in.Names) {
			if l.Resource == nil && !l.Absent && !l.Referenced && !l.Waiting {
				return true
			}
		}
	}
	return false
}

// backoffDelay is gRPC's connection backoff: exponential with jitter,
// capped (gRPC's connection backoff protocol,
// https://github.com/grpc/grpc/blob/master/doc/connection-backoff.md, with
// grpc/backoff's parameters).
func backoffDelay(cfg backoff.Config, retries int) time.Duration {
	if retries == 0 {
		return cfg.BaseDelay
	}
	d, limit := float64(cfg.BaseDelay), float64(cfg.MaxDelay)
	for d < limit && retries > 0 {
		d *= cfg.Multiplier
		retries--
	}
	d = min(d, limit)
	d *= 1 + cfg.Jitter*(rand.Float64()*2-1)
	return time.Duration(max(d, 0))
}

// open opens a stream to server i, in the protocol it speaks (or is to be
// tried in: see found). Nothing is sent yet.
func (c *Client) open(ctx context.Context, i int) (*session, error) {
	ctx, cancel := context.WithCancel(ctx)
	p := c.opts.found.of(c.servers[i].name)
	s := &session{c: c, server: i, protocol: p, ctx: ctx, cancel: cancel, subs: make(map[string]*subscription),
		notFound: notFound{timeout: c.opts.NotFoundTimeout}, opened: time.Now(), probing: c.opts.Prove}
	var err error
	var st interface{ RecvMsg(any) error }
	if p.sotw() {
		name := c.servers[i].name
		s.sotw, err = openSotW(ctx, c.servers[i].conn, p == ProtocolSotWPerType, c.opts.Node, c.debugSotWRequest,
			func(typeURL string) bool { _, ok := c.opts.found.isUnserved(name, typeURL); return ok })
		st = s.sotw
	} else {
		// The codec decodes responses by hand (xds.Received), out of
		// gRPC's received frames.
		s.st, err = c.servers[i].ads.DeltaAggregatedResources(ctx, grpc.ForceCodecV2(xds.Codec{}))
		st = s.st
	}
	if err != nil {
		cancel()
		return nil, fmt.Errorf("upstream: open %s stream to %s: %w", p, c.servers[i].name, err)
	}
	s.resps, s.errc = receive(ctx, st)
	return s, nil
}

// loop runs s until its stream ends or ctx is done. healthy reports
// whether the control plane answered on it. On a fallback server, it tries
// the higher ones every FallbackRecheck; one whose stream answers is
// returned as takeover, make-before-break: s kept serving meanwhile, and
// the cache keeps what s gave until the takeover's answers replace it.
// It is one piece: one select over everything a session waits on (its
// responses, the group's interest, forwarded rejections and their pace,
// the does-not-exist timer, the wildcard's sweep, the fallback recheck),
// each case a line or two that hands off to a method.
func (c *Client) loop(ctx context.Context, s *session) (healthy bool, takeover *session, err error) {
	var recheck <-chan time.Time
	if s.server > 0 {
		t := time.NewTicker(c.opts.FallbackRecheck)
		defer t.Stop()
		recheck = t.C
	}
	var p *probe
	defer func() { p.stop() }()
	defer c.fwd.stop()
	stall := s.stallCheck()
	if stall != nil {
		defer stall.Stop()
	}
	if s.pending != nil {
		// Taking over: the subscriptions are brought up to date, then the
		// response that proved the server is applied.
		r := s.pending
		s.pending = nil
		if err := s.syncAll(); err != nil {
			return false, nil, err
		}
		if err := c.received(s, r, &healthy); err != nil {
			return healthy, nil, err
		}
	}
	for {
		select {
		case r := <-s.resps:
			if r == nil {
				return healthy, nil, fmt.Errorf("upstream: %w", <-s.errc)
			}
			if r.Unserved != nil {
				if err := s.unservedType(r.TypeURL, r.Unserved); err != nil {
					return healthy, nil, err
				}
				continue
			}
			if err := c.received(s, r, &healthy); err != nil {
				return healthy, nil, err
			}
		case <-c.opts.Interest.InterestChanged():
			if err := s.sync(); err != nil {
				return healthy, nil, err
			}
		case <-c.fwd.in.ready:
			if err := s.forward(time.Now()); err != nil {
				return healthy, nil, err
			}
		case <-c.fwd.due():
			if err := s.forward(time.Now()); err != nil {
				return healthy, nil, err
			}
		case now := <-s.notFound.C():
			s.timedOut(now)
		case now := <-s.sweeps.C():
			s.swept(now)
		case alive := <-s.probe.done():
			s.probed(alive)
		case now := <-tick(stall):
			if err := s.stalled(now); err != nil {
				return healthy, nil, err
			}
		case <-recheck:
			if p == nil {
				p = c.startProbe(ctx, s.server)
			}
		case up := <-p.done():
			p = nil // its result is taken: nothing to stop
			if up != nil {
				return healthy, up, nil
			}
		case <-ctx.Done():
			return healthy, nil, ctx.Err()
		}
	}
}

// up records a stream opened and subscribed: the control plane is
// reachable, even before it answers (a resume it has nothing new for is
// answered with nothing).
func (c *Client) up(s *session) {
	if !c.routed() {
		c.opts.Metrics.Streams.With(c.opts.Group).Set(1)
	}
	c.setStatus(func(st *Status) {
		st.Connected, st.Server = true, c.servers[s.server].name
		if st.Protocol != string(s.protocol) {
			st.Protocol = "" // what it answers in is not known yet
		}
	})
}

// received handles one response of s; healthy is set at the first.
func (c *Client) received(s *session, r *xds.Received, healthy *bool) error {
	if !*healthy {
		*healthy = true
		c.reach.answered()
		c.opts.found.answered(c.servers[s.server].name, s.protocol)
		if !c.routed() {
			c.opts.Metrics.Streams.With(c.opts.Group).Set(1)
		}
	}
	c.setStatus(func(st *Status) {
		st.Connected, st.LastResponse, st.Server, st.Protocol = true, time.Now(), c.servers[s.server].name, string(s.protocol)
		if st.Refused != "" {
			// The last stream ended refused, and this one, in what was
			// tried next, answers: that refusal was an answer, not an
			// error (docs/architecture.md, invariant 20).
			st.LastError = ""
		}
		st.Refused, st.Unheard = "", ""
	})
	if err := s.handle(r); err != nil {
		return err
	}
	if len(c.fwd.queued[xds.Canonical(r.TypeURL)]) > 0 {
		return s.forward(time.Now()) // what waited for a response of the type to NACK
	}
	return nil
}

// receive turns the stream's RecvMsg into a channel of responses (decoded
// by xds.Codec), closed when receiving ends. Why it ended is then written
// to errc on every path (a Recv error, or the context's end) and errc is
// closed, so that every wait on errc is answered, the first with the error.
func receive(ctx context.Context, st interface{ RecvMsg(any) error }) (<-chan *xds.Received, <-chan error) {
	resps := make(chan *xds.Received)
	errc := make(chan error, 1)
	go func() {
		var err error
		defer func() {
			close(resps)
			errc <- err
			close(errc)
		}()
		for {
			r := new(xds.Received)
			if err = st.RecvMsg(r); err != nil {
				return
			}
			select {
			case resps <- r:
			case <-ctx.Done():
				err = ctx.Err()
				return
			}
		}
	}()
	return resps, errc
}
