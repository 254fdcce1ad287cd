package loadtest

import (
	"context"
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
// when the churn says, NACKing one response in NACKEvery.
type soakClients struct {
	// Read-only after newSoakClients.
	cfg   *Config
	x     *xdsClients
	st    *soakTracker
	pool  []string // the names subscribed among, as the updates rotate over them
	width int      // names each client subscribes to
	kicks []soakKicks
}

// soakKicks wake client i: capacity 1, sent without blocking.
type soakKicks struct {
	reconnect   chan struct{}
	resubscribe chan struct{}
}

func newSoakClients(cfg *Config, x *xdsClients, st *soakTracker) *soakClients {
	pool := newCatalog(cfg, x.coding).rotation
	c := &soakClients{cfg: cfg, x: x, st: st, pool: pool, width: max(1, len(pool)/2),
		kicks: make([]soakKicks, cfg.Clients)}
	for i := range c.kicks {
		c.kicks[i] = soakKicks{reconnect: make(chan struct{}, 1), resubscribe: make(chan struct{}, 1)}
	}
	return c
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
// owns it.
type soakClient struct {
	*soakClients
	i          int
	first      int         // subscribed to pool[first..first+width), wrapping
	since      []time.Time // per name of pool: subscribed since, on the current stream
	seen       []int       // per name of pool: the newest update received
	configured bool
}

// run runs client i until ctx ends: a stream at a time, the next one at
// once after a reconnect, after envoyBackoff after a failure.
func (c *soakClients) run(ctx context.Context, i int) {
	cl := &soakClient{soakClients: c, i: i, first: i % len(c.pool),
		since: make([]time.Time, len(c.pool)), seen: make([]int, len(c.pool))}
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
	s, err := c.open(sctx, conn)
	if err != nil {
		return false, err
	}
	names, now := c.names(), time.Now()
	for j := range c.width {
		c.since[(c.first+j)%len(c.pool)] = now
	}
	if err := s.subscribe(c.x.node(c.i), names); err != nil {
		return false, err
	}
	resps, recvErr, done := c.receive(sctx, s)
	defer func() {
		cancel()
		<-done
	}()
	return c.serve(ctx, s, resps, recvErr)
}

// serve handles the responses and kicks of one stream.
func (c *soakClient) serve(ctx context.Context, s soakStream, resps <-chan soakResponse, recvErr <-chan error) (got bool, err error) {
	for {
		select {
		case <-ctx.Done():
			return got, nil
		case <-c.kicks[c.i].reconnect:
			return got, nil
		case <-c.kicks[c.i].resubscribe:
			if err := c.resubscribe(s); err != nil {
				return got, err
			}
		case r := <-resps:
			got = true
			c.record(r, time.Now())
			if err := s.ack(r, c.st.nack(c.cfg.Soak.NACKEvery)); err != nil {
				return got, err
			}
		case err := <-recvErr:
			return got, err
		}
	}
}

// receive reads s on a goroutine of its own until the stream ends, which
// closes done.
func (c *soakClient) receive(ctx context.Context, s soakStream) (<-chan soakResponse, <-chan error, <-chan struct{}) {
	resps, errc, done := make(chan soakResponse), make(chan error, 1), make(chan struct{})
	go func() {
		defer close(done)
		for {
			r, err := s.recv()
			if err != nil {
				errc <- err
				return
			}
			select {
			case resps <- r:
			case <-ctx.Done():
				return
			}
		}
	}()
	return resps, errc, done
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
	c.since[add] = time.Now()
	c.st.resubscribes.Add(1)
	return s.resubscribe(c.pool[add], c.pool[drop], c.names())
}

// record notes the first config, and the receipt at t of every update the
// response carries that the client had not had yet.
func (c *soakClient) record(r soakResponse, t time.Time) {
	if !c.configured {
		c.configured = true
		c.st.configured()
	}
	for _, a := range r.resources {
		seq := c.st.unwrap(c.x.coding.seqOf(a))
		if seq <= 0 {
			continue
		}
		turn := (seq - 1) % len(c.pool)
		if seq <= c.seen[turn] {
			continue
		}
		c.seen[turn] = seq
		c.st.receipt(seq, t, c.since[turn])
	}
}

// open opens the client's stream: incremental for even clients.
func (c *soakClient) open(ctx context.Context, conn *grpc.ClientConn) (soakStream, error) {
	typeURL := c.x.coding.kind.typeURL
	if c.i%2 == 0 {
		s, err := openDelta(ctx, conn, c.cfg.Type, c.cfg.ADS)
		if err != nil {
			return nil, err
		}
		return &deltaSoak{s: s, typeURL: typeURL}, nil
	}
	s, err := openSotW(ctx, conn, c.cfg.Type, c.cfg.ADS)
	if err != nil {
		return nil, err
	}
	return &sotwSoak{s: s, typeURL: typeURL}, nil
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
	version   string // SotW
	nonce     string
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
	r := soakResponse{nonce: resp.GetNonce(), resources: make([]*anypb.Any, 0, len(resp.GetResources()))}
	for _, res := range resp.GetResources() {
		r.resources = append(r.resources, res.GetResource())
	}
	return r, nil
}

// sotwSoak follows "ACK/NACK and resource type instance version": every
// request carries the whole resource_names, the last accepted version and
// the last nonce; a NACK keeps the version it had.
type sotwSoak struct {
	s       sotwStream
	typeURL string
	// Owned by the client's goroutine.
	names    []string
	accepted string // version_info last ACKed
	nonce    string // of the last response
}

func (w *sotwSoak) subscribe(node *corepb.Node, names []string) error {
	w.names = names
	return w.s.Send(&discoverypb.DiscoveryRequest{Node: node, TypeUrl: w.typeURL, ResourceNames: names})
}

func (w *sotwSoak) resubscribe(_, _ string, names []string) error {
	w.names = names
	return w.s.Send(&discoverypb.DiscoveryRequest{TypeUrl: w.typeURL, VersionInfo: w.accepted,
		ResponseNonce: w.nonce, ResourceNames: names})
}

func (w *sotwSoak) ack(r soakResponse, nack bool) error {
	w.nonce = r.nonce
	req := &discoverypb.DiscoveryRequest{TypeUrl: w.typeURL, ResponseNonce: r.nonce, ResourceNames: w.names}
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
	return soakResponse{resources: resp.GetResources(), version: resp.GetVersionInfo(), nonce: resp.GetNonce()}, nil
}
