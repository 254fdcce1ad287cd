package downstream

import (
	"context"
	"iter"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"slices"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/authz"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// absent marks, in what a delta client was sent, a name it was told does not
// exist. No version is the empty string with a NUL in it.
const absent = "\x00"

// byType is a stream's per-type records, never removed: an inlineMap (a
// stream subscribes to one type or a few) that remembers the record looked
// up last. A stream mostly sends and is answered for one type, and its type
// URLs are the relay's own copies (xds.Canonical), so finding it is a
// comparison of pointers.
type byType[T any] struct {
	recs     inlineMap[*T]
	lastType string
	last     *T
}

// get returns the record of typeURL, nil if none.
func (b *byType[T]) get(typeURL string) *T {
	if b.last != nil && b.lastType == typeURL {
		return b.last
	}
	t := b.recs.value(typeURL)
	if t != nil {
		b.lastType, b.last = typeURL, t
	}
	return t
}

// put adds the record of typeURL, a type it does not hold yet.
func (b *byType[T]) put(typeURL string, t *T) { b.recs.set(typeURL, t) }

// all yields every type's record.
func (b *byType[T]) all() iter.Seq2[string, *T] { return b.recs.all() }

// only returns the record of the stream's one type; nil unless it has
// exactly one.
func (b *byType[T]) only() *T {
	if b.recs.len() != 1 {
		return nil
	}
	for _, t := range b.all() {
		return t
	}
	return nil
}

// nonces hands out a stream's response nonces: fresh for every response,
// valid only on the stream ("Basic Protocol Overview").
type nonces uint64

func (n *nonces) next() string {
	*n++
	return strconv.FormatUint(uint64(*n), 10)
}

// peek is the number of the nonce next will hand out.
func (n nonces) peek() uint64 { return uint64(n) + 1 }

// diff returns what is in b and not in a, sorted.
func diff[V any](a, b *inlineMap[V]) []string {
	var out []string
	for k := range b.all() {
		if !a.has(k) {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

func set(names []string) inlineMap[uint32] {
	var m inlineMap[uint32]
	for _, n := range names {
		m.set(n, 0)
	}
	return m
}

// noName is the empty resource name. A name is an opaque string, and no
// resource is named "": it is an explicit name that never exists, never the
// wildcard, and never subscribed upstream, where it could only come back as
// not found ("How the client specifies what resources to return": the
// server supplies the requested resources if they exist).
const noName = ""

// watchable returns names without noName, leaving names untouched.
func watchable(names []string) []string {
	if !slices.Contains(names, noName) {
		return names
	}
	out := make([]string, 0, len(names)-1)
	for _, n := range names {
		if n != noName {
			out = append(out, n)
		}
	}
	return out
}

// checkNode rejects a request whose node differs from the first request's:
// "The node identifier should always be identical if present more than once
// on the stream" ("Basic Protocol Overview").
func checkNode(first, n *corepb.Node) error {
	if n != nil && n != first && !proto.Equal(n, first) {
		return status.Errorf(codes.InvalidArgument, "xdsrelay: node changed mid-stream (from %q to %q)", first.GetId(), n.GetId())
	}
	return nil
}

// Client features that change what a client is sent ("TTL").
const (
	featureResourceTTL    = "xds.config.supports-resource-ttl"
	featureResourceInSotW = "xds.config.supports-resource-in-sotw"
)

func hasFeature(n *corepb.Node, feature string) bool {
	return slices.Contains(n.GetClientFeatures(), feature)
}

// flusher is what differs between the protocols' flushes: sending what
// changed of one type, and sending again the endpoints the stream holds of
// names (warming.go). When hold is set, flushDirty may keep back a
// response that only removes and return it as later, for flushAll to send
// after the other types' changes (order.go).
type flusher interface {
	flushDirty(d *cache.Dirty, hold bool) (later func() error, err error)
	resendEndpoints(names []string) error
}

// flushAll sends what changed, make before break (order.go): each type's
// additions and changes in the spec's order, each Cluster followed by the
// endpoints that warm it (warming.go), then what the flushes held back,
// removals, in the reverse order; first, on a per-type EDS stream, the
// endpoints the connection's CDS stream asks for. SotW and incremental
// streams flush this way, through f.
func (b *streamBase) flushAll(f flusher) error {
	if names := b.inbox.take(); len(names) > 0 {
		if err := f.resendEndpoints(names); err != nil {
			return err
		}
	}
	dirty := ordered(b.unheld(b.watch.Take()))
	defer b.watch.Recycle(dirty)
	b.held = b.heldArr[:0]
	defer b.dropHeld()
	b.flushing = f
	err := b.flushTypes(dirty, false)
	b.flushing = nil // the removals send what the flush read
	if err != nil {
		return err
	}
	return b.sendHeld(f)
}

// flushTypes sends what changed of each of dirty, in order, each followed
// by what it warms; what they hold back joins b.held. The last type holds
// nothing back unless more follows it (followed: a response a lower type
// went before, order.go).
func (b *streamBase) flushTypes(dirty cache.DirtySet, followed bool) error {
	f := b.flushing
	for i, d := range dirty {
		if b.heldBack(d) { // behind a Cluster that warms (warmorder.go)
			continue
		}
		if between := b.srv.between; between != nil {
			between(d.TypeURL)
		}
		later, err := f.flushDirty(d, followed || i < len(dirty)-1)
		if err != nil {
			return err
		}
		if later != nil {
			b.held = append(b.held, heldSend{rank: xds.Rank(d.TypeURL), send: later})
		}
		if err := b.flushWarm(f); err != nil {
			return err
		}
	}
	return nil
}

// heartbeats are d's heartbeats, for a client that takes TTLs; nil for one
// that does not (they only refresh TTLs, which it ignores).
func heartbeats(d *cache.Dirty, ttl bool) *cache.NameSet {
	if !ttl {
		return nil
	}
	return &d.Heartbeats
}

// protocol is what differs between a SotW and an incremental stream.
type protocol[Req any] interface {
	handle(*Req) error // a request from the client
	flush() error      // send what changed
	base() *streamBase
	// awaitsAnswer reports, after the first request, whether the stream
	// names resources of one type and nothing else: the client waits for
	// them before it asks for anything more (see pump.awaitFirst).
	awaitsAnswer() bool
	// awaitsWildcard reports, after the first request, whether the
	// stream's one subscription is a wildcard of one type, which the client
	// waits for as well (Envoy asks for Listeners once its Clusters are
	// in).
	awaitsWildcard() bool
}

// streamBase is what SotW and incremental streams share.
//
// Who guards what: the first group is read-only once the stream is open;
// everything else belongs to the stream's protocol, which runs on one
// goroutine at a time (the handler or a send worker) under its pump's mu
// (sendpool.go), as do sotwStream's and deltaStream's own fields and their
// per-type records. What other goroutines read is behind locks of its own:
// status (CSDS and the admin endpoint), watch (the cache marks it), inbox
// (the connection's CDS stream fills it) and conn's warmMu.
type streamBase struct {
	// Read-only once the stream is open.
	srv     *Server
	send    func(any) error // the stream's SendMsg, guarded against stuck clients
	fixed   string          // the per-type service's type; "" on ADS
	variant string          // for the log
	cache   *cache.Cache
	watch   *cache.Watch
	node    *corepb.Node  // from the first request
	status  *streamStatus // what CSDS and the admin endpoint read; its own mu
	opened  time.Time     // for the push latency
	grant   *authz.Grant  // what the client's certificate lets it ask for (authz.go); nil: anything
	conn    *sendConn     // the client connection's queue in the send pool

	// The protocol's, under the pump's mu.
	nonces  nonces
	names   int                             // names subscribed, across types (see watchNames)
	sent    map[string]sentVersion          // by type, for the rollout's verdicts; nil unless it rolls out
	refused map[string]*cache.ResourceError // names asked for and refused by grant, with their errors
	// The flush under way (order.go): its flusher while it sends the
	// types' additions, nil otherwise; the responses it holds back, for
	// after them, in heldArr's array while they fit.
	flushing flusher
	held     []heldSend
	heldArr  [2]heldSend
	// Warming (warming.go): the endpoints of the Clusters a flush just
	// sent; on a per-type CDS stream, those waiting for the client's ACK of
	// the response warmNonce; on a per-type EDS stream, what the
	// connection's CDS stream asks it to send again (its own mu).
	warming   []string
	warmOnAck *cache.NameSet // nil until a per-type CDS stream sends a Cluster to warm
	warmNonce uint64
	inbox     *warmInbox
	// On ADS, Listeners and Routes kept back behind new Clusters that warm
	// (warmorder.go); nil until the stream sends one.
	hold *warmHold
	// The first answer (errors.go): spoke is set once a response was
	// sent; while endable, the handler returns a flush's error, and first
	// is closed once the stream has spoken or ended (see onlyErrors,
	// pump.awaitFirst).
	spoke   bool
	endable bool
	first   chan struct{}
	// The types the stream has asked for (order.go, warmorder.go), here
	// to share a word with holds.
	asked typeSet
	// Held first states (held.go): holds counts the types whose first
	// state the stream holds (atomic: the handler reads it without mu);
	// holdWake, while the handler waits on them, is closed by the next
	// flush.
	holds    int32
	holdWake chan struct{}
}

func (s *Server) newStreamBase(send func(any) error, fixed, variant string, c *cache.Cache, node *corepb.Node) streamBase {
	w := cache.NewWatch()
	w.SetRank(Rank(node.GetId()))
	opened := time.Now()
	return streamBase{srv: s, send: send, fixed: fixed, variant: variant, cache: c, watch: w, node: node,
		status: &streamStatus{node: node, variant: variant, cache: c, watch: w, push: &s.pushMetrics, opened: opened.UnixNano()}, opened: opened}
}

func (b *streamBase) base() *streamBase { return b }

// admit makes the checks every request gets (its type against the
// service, its node against the first request's) and counts it.
func (b *streamBase) admit(typeURL string, node *corepb.Node) (resolved, short string, err error) {
	if resolved, err = resolveType(typeURL, b.fixed); err != nil {
		return "", "", err
	}
	if err := checkNode(b.node, node); err != nil {
		return "", "", err
	}
	short = xds.ShortName(resolved)
	b.srv.requests.With(short).Inc()
	return resolved, short, nil
}

// answered records a request's answer to the responses up to nonce: a NACK
// if it carries error_detail, else, if it carries a nonce, an ACK ("ACK/NACK
// and resource type instance version").
func (b *streamBase) answered(typeURL, short, nonce, version string, d *rpcstatus.Status) {
	switch {
	case d != nil:
		defer b.forwarded(typeURL, d) // after the nonce's answer, which it may refine
	case nonce != "":
		b.srv.acks.With(short).Inc()
	}
	var covered Answered
	if nonce != "" {
		switch {
		case b.fixed == resourcev3.ClusterType:
			b.ackedClusters(nonce, d != nil)
		case b.fixed == "" && typeURL == resourcev3.ClusterType:
			b.answeredClusters(nonce)
		}
		covered = b.status.answered(typeURL, nonce, version, d != nil, d.GetMessage(), time.Now())
		if b.sent != nil {
			b.verdict(typeURL, nonce, d != nil, d.GetMessage())
		}
	}
	if d != nil {
		b.nacked(short, nonce, d.GetMessage(), rejectedAttrs(covered, version)...)
	}
}

// rejectedAttrs say, in a NACK's log line, what the client rejected: the
// first resource of the responses it answered, at the version it was
// sent, and how many; and the version_info it kept (a SotW client's last
// accepted, sent with its NACK).
func rejectedAttrs(c Answered, kept string) []any {
	var attrs []any
	if c.Resources > 0 {
		attrs = append(attrs, "rejected", xds.Clip(c.First)+" at "+xds.Clip(c.AtVersion), "resources", c.Resources)
	}
	if kept != "" {
		attrs = append(attrs, "kept_version", xds.Clip(kept))
	}
	return attrs
}

// nacked counts and logs a client's NACK of a response. The log lines are
// limited as those of streams that end with an error are (endLogRate), so
// that a fleet rejecting a push cannot flood the log; every NACK is counted.
func (b *streamBase) nacked(short, nonce, message string, attrs ...any) {
	b.srv.nacks.With(short).Inc()
	ok, suppressed := b.srv.nackLog.take()
	if !ok {
		return
	}
	if suppressed > 0 {
		b.srv.log.Warn("warnings about clients' NACKs were suppressed by the rate limit", "suppressed", suppressed)
	}
	b.srv.log.Warn("client rejected a response", append([]any{"node", xds.Clip(b.node.GetId()), "variant", b.variant,
		"type", short, "nonce", xds.Clip(nonce), "error", xds.Clip(message)}, attrs...)...)
}

// request is what serve reads of a request: the node and the type.
type request interface {
	GetNode() *corepb.Node
	GetTypeUrl() string
}

// serve runs one stream (see run) and logs how it ended.
func serve[Req any, Resp any, PReq interface {
	*Req
	request
}](s *Server, st grpc.BidiStreamingServer[Req, Resp], fixed, variant string, open func(*cache.Cache, PReq, func(any) error) protocol[Req]) error {
	end := streamEnd{variant: variant, typ: fixed}
	release, err := s.admitStream()
	if err == nil {
		err = run(s, st, &end, open)
		release()
	}
	err = s.edge(err)
	s.ended(st.Context(), end, err)
	return err
}

// firstAnswer holds the handler for the stream's first answer, as long as
// its first request allows: AnswerWait for names of one type, WildcardWait
// for a wildcard of one type, nothing otherwise (see pump.awaitFirst).
// From then on no flush ends the stream; it returns the error one ended
// it with meanwhile, if one did.
func (s *Server) firstAnswer(ctx context.Context, pm *pump, names, wildcard bool) error {
	wait := time.Duration(0)
	switch {
	case names:
		wait = s.answerWait
	case wildcard:
		wait = s.wildWait
	}
	if err := pm.awaitFirst(ctx, wait); err != nil {
		return err
	}
	return pm.canEnd(false)
}

// run runs one stream: its first request places it in a group, then the
// handler's goroutine reads and handles requests while the send pool flushes
// what the cache marks (see pump). It notes in end the node and the type of
// each request.
func run[Req any, Resp any, PReq interface {
	*Req
	request
}](s *Server, st grpc.BidiStreamingServer[Req, Resp], end *streamEnd, open func(*cache.Cache, PReq, func(any) error) protocol[Req]) error {
	ctx := st.Context()
	opened := time.Now()
	// Until its first request a stream is ended by Drain through s.drain,
	// with errDraining; from then on by closing its connection.
	first, ls, err := startStream(ctx, s, st.Recv)
	if first == nil {
		return err
	}
	defer s.live.remove(ls)
	end.node = PReq(first).GetNode()
	end.see(PReq(first).GetTypeUrl())
	who := grpcClient(ctx, end.variant)
	grant, err := s.authorize(who, end.node)
	if err != nil {
		return err
	}
	c, release, err := s.join(end.node, who)
	if err != nil {
		return err
	}
	defer release()
	s.streams.With(end.variant).Inc()
	defer s.streams.With(end.variant).Dec()
	g := s.guard(ctx, st.SendMsg, end.variant, opened)
	p := open(c, PReq(first), g.send)
	b := p.base()
	b.grant = grant
	if s.flushFirst != nil && s.flushFirst(end.node, who.caller()) {
		b.watch.SetFirst(true) // before the first request registers it
	}
	if s.peer != nil && s.peer(end.node, who.caller()) {
		b.watch.SetPeer(true)
	}
	pm := &pump{pool: s.sends, conn: s.sends.conn(ls.addr), flush: p.flush, guard: g, stream: b}
	g.conn = pm.conn
	defer s.sends.release(pm.conn)
	b.watch.OnReady(pm.ready)
	defer c.Release(b.watch)
	// From here a CDS stream of the connection may mark the watch (warming.go).
	defer b.linkConn(pm.conn)()
	s.registry.add(b.status)
	defer s.registry.remove(b.status)
	defer b.status.left() // its counts go with it (convergence.go)
	defer b.endHold()     // once no flush runs (warmorder.go)
	defer pm.end()
	pm.canEnd(true) // the first request's flush ends the stream by returning
	if err := handle(pm, p, first); err != nil {
		return err
	}
	if err := s.firstAnswer(ctx, pm, p.awaitsAnswer(), p.awaitsWildcard()); err != nil {
		return err
	}
	return serveRequests[Req, Resp, PReq](ctx, st, end, pm, p)
}

// serveRequests reads and handles the stream's requests after the first,
// until it ends; after each, while the stream holds a type's first state,
// the handler waits for it (held.go).
func serveRequests[Req any, Resp any, PReq interface {
	*Req
	request
}](ctx context.Context, st grpc.BidiStreamingServer[Req, Resp], end *streamEnd, pm *pump, p protocol[Req]) error {
	h, _ := any(p).(holder)
	if err := pm.awaitHeld(ctx, h); err != nil {
		return err
	}
	// The later requests are decoded into one message: proto.Unmarshal
	// resets it first, and handle keeps nothing of it but what it copies or
	// the fields' own values, so a request costs no allocation of its own.
	req := PReq(new(Req))
	for {
		if err := st.RecvMsg(req); err != nil {
			if ferr := pm.failure(); ferr != nil {
				return ferr
			}
			return recvError(err)
		}
		end.see(PReq(req).GetTypeUrl())
		if err := handle(pm, p, req); err != nil {
			return err
		}
		if err := pm.awaitHeld(ctx, h); err != nil {
			return err
		}
	}
}
