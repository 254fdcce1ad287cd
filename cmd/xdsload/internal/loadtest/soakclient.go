package loadtest

import (
	"context"
	"errors"
	"io"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/anypb"
)

// soakClients are a soak's clients: even ones incremental, odd ones
// state-of-the-world, each subscribed to half the names (a window over
// them that a resubscription moves by one), reconnecting and resubscribing
// when the churn says, NACKing one response in nackEvery. A rolling
// restart runs the same clients without churn or NACKs.
type soakClients struct {
	// Read-only after newSoakClients.
	cfg       *Config
	x         *xdsClients
	st        *soakTracker
	pool      []string       // the names subscribed among, as the updates rotate over them
	index     map[string]int // name → its place in pool
	width     int            // names each client subscribes to
	nackEvery int            // 0: never
	kicks     []soakKicks
	obs       streamObserver // nil: none
}

// streamObserver hears of the clients' streams: one that ended (with
// err; nil if the client ended it) and the first response on one opened
// at opened.
type streamObserver interface {
	ended(i int, err error, t time.Time)
	answered(i int, opened, t time.Time)
}

// soakPool returns the names a soak's clients subscribe among, and how
// many each subscribes to: half of them.
func soakPool(cfg *Config, coding seqCoding) (pool []string, width int) {
	pool = newCatalog(cfg, coding).rotation
	return pool, max(1, len(pool)/2)
}

func newSoakClients(cfg *Config, x *xdsClients, st *soakTracker, nackEvery int) *soakClients {
	pool, width := soakPool(cfg, x.coding)
	c := &soakClients{cfg: cfg, x: x, st: st, pool: pool, width: width, nackEvery: nackEvery,
		index: make(map[string]int, len(pool)), kicks: make([]soakKicks, cfg.Clients)}
	for j, n := range pool {
		c.index[n] = j
	}
	for i := range c.kicks {
		c.kicks[i] = soakKicks{reconnect: make(chan struct{}, 1), resubscribe: make(chan struct{}, 1)}
	}
	return c
}

// soakKicks wake client i: capacity 1, sent without blocking.
type soakKicks struct {
	reconnect   chan struct{}
	resubscribe chan struct{}
}

// kick has client i reconnect, or else change its subscriptions.
func (c *soakClients) kick(i int, reconnect bool) {
	ch := c.kicks[i].resubscribe
	if reconnect {
		ch = c.kicks[i].reconnect
	}
	select {
	case ch <- struct{}{}:
	default:
	}
}

// soakClient is one client's state across its streams; its goroutine
// owns it. What it holds now, the end of a soak reads in the tracker.
type soakClient struct {
	*soakClients
	i          int
	first      int         // subscribed to pool[first..first+width), wrapping
	since      []time.Time // per name of pool: subscribed since, on the current stream
	seen       []int       // per name of pool: the newest update received
	got        []bool      // per name of pool: received on the current stream since subscribed
	configured bool
}

// run runs client i until ctx ends: a stream at a time, the next one at
// once after a reconnect, after envoyBackoff after a failure.
func (c *soakClients) run(ctx context.Context, i int) {
	cl := &soakClient{soakClients: c, i: i, first: i % len(c.pool), since: make([]time.Time, len(c.pool)),
		seen: make([]int, len(c.pool)), got: make([]bool, len(c.pool))}
	c.st.setFirst(i, cl.first)
	for n := 0; ctx.Err() == nil; {
		got, err := cl.session(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err == nil:
			c.st.reconnects.Add(1)
			n = 0
			continue
		case got:
			n = 0
		}
		if c.obs != nil {
			c.obs.ended(i, err, time.Now())
		}
		c.st.streamError(i, err)
		if pause(ctx, backoffDelay(envoyBackoff, n)) != nil {
			return
		}
		n++
	}
}

// session runs one stream until ctx ends (nil), the client is kicked to
// reconnect (nil) or the stream fails. got tells whether a response came.
func (c *soakClient) session(ctx context.Context) (got bool, err error) {
	select { // a kick that came between streams is for the stream before
	case <-c.kicks[c.i].reconnect:
	default:
	}
	conn, err := c.x.pool.acquire(c.i)
	if err != nil {
		return false, err
	}
	defer c.x.pool.release(c.i)
	sctx, cancel := streamContext(ctx)
	defer cancel()
	opened := time.Now()
	s, err := c.open(sctx, conn)
	if err != nil {
		return false, err
	}
	names, now := c.names(), time.Now()
	clear(c.got)
	for j := range c.width {
		c.since[(c.first+j)%len(c.pool)] = now
	}
	if err := s.subscribe(c.x.node(c.i), names); err != nil {
		return false, err
	}
	resps, recvErr, done := receive(sctx, s.recv)
	defer func() {
		cancel()
		<-done
	}()
	return c.serve(ctx, s, resps, recvErr, opened)
}

// serve handles the responses and kicks of one stream, opened at opened.
func (c *soakClient) serve(ctx context.Context, s soakStream, resps <-chan soakResponse, recvErr <-chan error, opened time.Time) (got bool, err error) {
	for {
		select {
		case <-ctx.Done():
			return got, nil
		case <-c.kicks[c.i].reconnect:
			return got, nil
		case <-c.kicks[c.i].resubscribe:
			if err := c.resubscribe(s); err != nil {
				return got, c.sendError(err, resps, recvErr)
			}
		case r := <-resps:
			now := time.Now()
			if !got && c.obs != nil {
				c.obs.answered(c.i, opened, now)
			}
			got = true
			c.record(r, now)
			if err := s.ack(r, c.st.nack(c.nackEvery)); err != nil {
				return got, c.sendError(err, resps, recvErr)
			}
		case err := <-recvErr:
			return got, err
		}
	}
}

// sendError is what a failed send means: io.EOF says the stream has
// ended, and its receiving goroutine tells how (the responses it still
// reads are recorded).
func (c *soakClient) sendError(err error, resps <-chan soakResponse, recvErr <-chan error) error {
	if !errors.Is(err, io.EOF) {
		return err
	}
	for {
		select {
		case r := <-resps:
			c.record(r, time.Now())
		case err := <-recvErr:
			return err
		}
	}
}

// receive calls recv on a goroutine of its own, passing on what it reads,
// until it fails (its error goes to errc) or ctx ends; done is closed once
// the goroutine has returned.
func receive[T any](ctx context.Context, recv func() (T, error)) (resps <-chan T, errc <-chan error, done <-chan struct{}) {
	rc, ec, dc := make(chan T), make(chan error, 1), make(chan struct{})
	go func() {
		defer close(dc)
		for {
			r, err := recv()
			if err != nil {
				ec <- err
				return
			}
			select {
			case rc <- r:
			case <-ctx.Done():
				return
			}
		}
	}()
	return rc, ec, dc
}

// names are the names the client subscribes to now.
func (c *soakClient) names() []string {
	names := make([]string, c.width)
	for j := range names {
		names[j] = c.pool[(c.first+j)%len(c.pool)]
	}
	return names
}

// resubscribe moves the client's window over the names by one: the first
// name unsubscribed, the next one past the window subscribed.
func (c *soakClient) resubscribe(s soakStream) error {
	drop, add := c.first%len(c.pool), (c.first+c.width)%len(c.pool)
	c.first++
	c.st.setFirst(c.i, c.first)
	c.since[add], c.got[add] = time.Now(), false
	c.st.resubscribes.Add(1)
	return s.resubscribe(c.pool[add], c.pool[drop], c.names())
}

// subscribed reports whether pool[j] is in the client's window.
func (c *soakClient) subscribed(j int) bool {
	return (j-c.first%len(c.pool)+len(c.pool))%len(c.pool) < c.width
}

// record notes the first config; for every resource of the pool the
// response carries, the update it carries as what the client holds, and
// the receipt at t of an update the client had not had yet; and every
// removal it tells of a subscribed name, which the control plane always
// serves.
func (c *soakClient) record(r soakResponse, t time.Time) {
	if !c.configured {
		c.configured = true
		c.st.configured()
	}
	var present []bool
	if r.full {
		present = make([]bool, len(c.pool))
	}
	for k, a := range r.resources {
		j, ok := c.index[r.names[k]]
		v := c.st.version(c.x.coding, a)
		if !ok || v < 0 {
			continue
		}
		if present != nil {
			present[j] = true
		}
		c.got[j] = true
		c.st.holds(c.i, j, v)
		if v > c.seen[j] {
			c.seen[j] = v
			c.st.receipt(v, t, c.since[j])
		}
	}
	for _, name := range r.removed {
		c.removed(name, "in removed_resources")
	}
	for _, name := range r.notFound {
		c.removed(name, "NOT_FOUND in resource_errors")
	}
	for j := range present {
		// "Deleting Resources": a Listener or Cluster missing from a SotW
		// response is removed. One not received yet on this stream may be
		// missing from a response to the request before it was asked.
		if c.got[j] && !present[j] && c.subscribed(j) {
			c.removed(c.pool[j], "left out of a full-state response")
		}
	}
}

// removed records that the client was told name, if it subscribes to it,
// was removed (how says in which way): the control plane serves every
// name of the pool, so it is a spurious removal.
func (c *soakClient) removed(name, how string) {
	j, ok := c.index[name]
	if !ok || !c.subscribed(j) {
		return
	}
	c.got[j] = false
	c.st.removal(c.i, j, name, how)
}

// open opens the client's stream: incremental for even clients.
func (c *soakClient) open(ctx context.Context, conn *grpc.ClientConn) (soakStream, error) {
	kd := c.x.coding.kind
	if c.i%2 == 0 {
		s, err := openDelta(ctx, conn, c.cfg.Type, c.cfg.ADS)
		if err != nil {
			return nil, err
		}
		return &deltaSoak{s: s, typeURL: kd.typeURL}, nil
	}
	s, err := openSotW(ctx, conn, c.cfg.Type, c.cfg.ADS)
	if err != nil {
		return nil, err
	}
	return &sotwSoak{s: s, kind: kd}, nil
}

// soakStream is a soak client's stream, of either variant. The client's
// goroutine sends; the receiving goroutine only receives.
type soakStream interface {
	subscribe(node *corepb.Node, names []string) error
	resubscribe(add, drop string, names []string) error
	ack(r soakResponse, nack bool) error
	recv() (soakResponse, error)
}

// soakResponse is what a soak client reads from a response.
type soakResponse struct {
	resources []*anypb.Any
	names     []string // of each resource
	removed   []string // delta: removed_resources
	notFound  []string // names whose resource_errors say NOT_FOUND
	full      bool     // SotW Listener or Cluster: every subscribed name is in it
	version   string   // SotW
	nonce     string
}

// notFound returns the names that errs report NOT_FOUND ("Knowing When a
// Requested Resource Does Not Exist", gRFC A88's resource_errors).
func notFound(errs []*discoverypb.ResourceError) []string {
	var names []string
	for _, e := range errs {
		if codes.Code(e.GetErrorDetail().GetCode()) == codes.NotFound {
			names = append(names, e.GetResourceName().GetName())
		}
	}
	return names
}

// soakNACK is the error_detail of a soak client's NACK.
var soakNACK = &statuspb.Status{Code: int32(codes.InvalidArgument), Message: "xdsload soak: a NACK, now and then"}

// deltaSoak follows "Incremental xDS": names subscribed and unsubscribed
// by difference, each response ACKed or NACKed by its nonce.
type deltaSoak struct {
	s       deltaStream
	typeURL string
}

func (d *deltaSoak) subscribe(node *corepb.Node, names []string) error {
	return d.s.Send(&discoverypb.DeltaDiscoveryRequest{Node: node, TypeUrl: d.typeURL, ResourceNamesSubscribe: names})
}

func (d *deltaSoak) resubscribe(add, drop string, _ []string) error {
	return d.s.Send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: d.typeURL,
		ResourceNamesSubscribe: []string{add}, ResourceNamesUnsubscribe: []string{drop}})
}

func (d *deltaSoak) ack(r soakResponse, nack bool) error {
	req := &discoverypb.DeltaDiscoveryRequest{TypeUrl: d.typeURL, ResponseNonce: r.nonce}
	if nack {
		req.ErrorDetail = soakNACK
	}
	return d.s.Send(req)
}

func (d *deltaSoak) recv() (soakResponse, error) {
	resp, err := d.s.Recv()
	if err != nil {
		return soakResponse{}, err
	}
	r := soakResponse{nonce: resp.GetNonce(), resources: make([]*anypb.Any, 0, len(resp.GetResources())),
		removed: resp.GetRemovedResources(), notFound: notFound(resp.GetResourceErrors())}
	for _, res := range resp.GetResources() {
		r.resources = append(r.resources, res.GetResource())
		r.names = append(r.names, res.GetName())
	}
	for _, n := range resp.GetRemovedResourceNames() {
		r.removed = append(r.removed, n.GetName())
	}
	return r, nil
}

// sotwSoak follows "ACK/NACK and resource type instance version": every
// request carries the whole resource_names, the last accepted version and
// the last nonce; a NACK keeps the version it had.
type sotwSoak struct {
	s    sotwStream
	kind kind
	// Owned by the client's goroutine.
	names    []string
	accepted string // version_info last ACKed
	nonce    string // of the last response
}

func (w *sotwSoak) subscribe(node *corepb.Node, names []string) error {
	w.names = names
	return w.s.Send(&discoverypb.DiscoveryRequest{Node: node, TypeUrl: w.kind.typeURL, ResourceNames: names})
}

func (w *sotwSoak) resubscribe(_, _ string, names []string) error {
	w.names = names
	return w.s.Send(&discoverypb.DiscoveryRequest{TypeUrl: w.kind.typeURL, VersionInfo: w.accepted,
		ResponseNonce: w.nonce, ResourceNames: names})
}

func (w *sotwSoak) ack(r soakResponse, nack bool) error {
	w.nonce = r.nonce
	req := &discoverypb.DiscoveryRequest{TypeUrl: w.kind.typeURL, ResponseNonce: r.nonce, ResourceNames: w.names}
	if nack {
		req.ErrorDetail = soakNACK
	} else {
		w.accepted = r.version
	}
	req.VersionInfo = w.accepted
	return w.s.Send(req)
}

func (w *sotwSoak) recv() (soakResponse, error) {
	resp, err := w.s.Recv()
	if err != nil {
		return soakResponse{}, err
	}
	r := soakResponse{resources: resp.GetResources(), version: resp.GetVersionInfo(), nonce: resp.GetNonce(),
		notFound: notFound(resp.GetResourceErrors()), full: w.kind.full, names: make([]string, len(resp.GetResources()))}
	for k, a := range r.resources {
		r.names[k] = w.kind.nameOf(a)
	}
	return r, nil
}
