package loadtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync/atomic"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	clustersvc "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointsvc "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	listenersvc "github.com/envoyproxy/go-control-plane/envoy/service/listener/v3"
	routesvc "github.com/envoyproxy/go-control-plane/envoy/service/route/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"
	"google.golang.org/protobuf/types/known/anypb"
)

// Clients use Envoy's default HTTP/2 flow-control windows for xDS
// connections (initial_stream_window_size 256 MiB, initial_connection_
// window_size 1 MiB), static as Envoy's are: no BDP pings with every
// response, which gRPC's dynamic windows would add, so that the server is
// loaded by xDS and not by flow-control chatter, as a fleet of Envoys loads
// it.
const (
	envoyStreamWindow = 256 << 20
	envoyConnWindow   = 1 << 20
)

// maxMessage bounds a response: state-of-the-world responses get large.
const maxMessage = 256 << 20

type (
	sotwStream  = grpc.BidiStreamingClient[discoverypb.DiscoveryRequest, discoverypb.DiscoveryResponse]
	deltaStream = grpc.BidiStreamingClient[discoverypb.DeltaDiscoveryRequest, discoverypb.DeltaDiscoveryResponse]
)

// xdsClients runs xDS clients against cfg.Target, cfg.StreamsPerConn
// streams to a gRPC connection.
type xdsClients struct {
	// Read-only after newXDSClients.
	cfg    *Config
	coding seqCoding
	pool   *connPool
	codec  grpc.CallOption // the streams' codec: markCodec

	bytes byteCounter
}

// newXDSClients makes the clients of cfg; cfg.Target is where they dial.
func newXDSClients(cfg *Config, coding seqCoding) *xdsClients {
	x := &xdsClients{cfg: cfg, coding: coding, codec: grpc.ForceCodecV2(newMarkCodec(coding))}
	x.pool = newConnPool(cfg.Target, cfg.Clients, cfg.StreamsPerConn, &x.bytes)
	return x
}

func (x *xdsClients) bytesReceived() int64 { return x.bytes.n.Load() }

func (x *xdsClients) connections() int { return x.pool.connections() }

func (x *xdsClients) node(i int) *corepb.Node {
	return &corepb.Node{Id: "xdsload-" + strconv.Itoa(i), Cluster: x.cfg.NodeCluster}
}

// streamContext is the context of a stream that ends with ctx but carries
// no deadline (no grpc-timeout): xDS streams are long-lived, and Envoy's
// carry none either. Cancelling it resets the stream.
func streamContext(ctx context.Context) (context.Context, context.CancelFunc) {
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, cancel)
	return sctx, func() {
		stop()
		cancel()
	}
}

// run runs client i until ctx ends or its stream fails: it subscribes,
// records what each response brings and ACKs it.
// With Config.RelayLimits it retries a stream the relay refuses; without,
// it opens again a stream the server closed after it answered
// (reopenAnswered).
func (x *xdsClients) run(ctx context.Context, i int, tr *tracker) error {
	if x.cfg.RelayLimits {
		return retryRefused(ctx, i, tr, func() error { return x.stream(ctx, i, tr) })
	}
	return reopenAnswered(ctx, i, tr, func() error { return x.stream(ctx, i, tr) })
}

// stream runs client i on one stream until ctx ends or the stream fails.
func (x *xdsClients) stream(ctx context.Context, i int, tr *tracker) error {
	return x.onStream(ctx, i,
		func(s deltaStream) error { return x.delta(s, x.node(i), i, tr) },
		func(s sotwStream) error { return x.sotw(s, x.node(i), i, tr) })
}

// cycle is one churn cycle of client i: it opens a stream (on a connection
// of its own, dialed now, unless streams share connections), subscribes,
// waits for the first response and resets the stream.
func (x *xdsClients) cycle(ctx context.Context, i int) error {
	return x.onStream(ctx, i,
		func(s deltaStream) error { return firstResponse(s, x.deltaSubscribe(x.node(i))) },
		func(s sotwStream) error { return firstResponse(s, x.sotwSubscribe(x.node(i))) })
}

// onStream opens client i's stream, of the configured variant, on the
// client's connection, and runs delta or sotw on it; the stream ends when
// that returns.
func (x *xdsClients) onStream(ctx context.Context, i int, delta func(deltaStream) error, sotw func(sotwStream) error) error {
	conn, err := x.pool.acquire(i)
	if err != nil {
		return err
	}
	defer x.pool.release(i)
	sctx, cancel := streamContext(ctx)
	defer cancel()
	if x.cfg.Variant == VariantDelta {
		s, err := openDelta(sctx, conn, x.cfg.Type, x.cfg.ADS, x.codec)
		if err != nil {
			return err
		}
		return delta(s)
	}
	s, err := openSotW(sctx, conn, x.cfg.Type, x.cfg.ADS, x.codec)
	if err != nil {
		return err
	}
	return sotw(s)
}

// firstResponse sends req on s and waits for the first response.
func firstResponse[Req, Resp any](s grpc.BidiStreamingClient[Req, Resp], req *Req) error {
	if err := s.Send(req); err != nil {
		return sendError(s, err)
	}
	_, err := s.Recv()
	return err
}

// sendError is what a failed Send on s means: io.EOF says the server ended
// the stream, and Recv tells with which status (a refusal, say). Only the
// goroutine that receives on s may call it.
func sendError[Req, Resp any](s grpc.BidiStreamingClient[Req, Resp], err error) error {
	if !errors.Is(err, io.EOF) {
		return err
	}
	if _, rerr := s.Recv(); rerr != nil {
		return rerr
	}
	return err
}

// hold keeps client i's connection until release, so that its churn
// cycles open streams on it and not connections; without shared
// connections it holds nothing.
func (x *xdsClients) hold(i int) (release func(), err error) {
	if x.cfg.StreamsPerConn == 1 {
		return func() {}, nil
	}
	if _, err := x.pool.acquire(i); err != nil {
		return nil, err
	}
	return func() { x.pool.release(i) }, nil
}

func (x *xdsClients) sotwSubscribe(node *corepb.Node) *discoverypb.DiscoveryRequest {
	return &discoverypb.DiscoveryRequest{Node: node, TypeUrl: x.coding.kind.typeURL, ResourceNames: x.cfg.Names}
}

func (x *xdsClients) deltaSubscribe(node *corepb.Node) *discoverypb.DeltaDiscoveryRequest {
	return &discoverypb.DeltaDiscoveryRequest{Node: node, TypeUrl: x.coding.kind.typeURL, ResourceNamesSubscribe: x.cfg.Names}
}

// sotw follows "ACK/NACK and resource type instance version": each ACK
// carries the response's version_info and nonce, and the same names.
func (x *xdsClients) sotw(s sotwStream, node *corepb.Node, i int, tr *tracker) error {
	if err := s.Send(x.sotwSubscribe(node)); err != nil {
		return sendError(s, err)
	}
	x.established(i, tr)
	for {
		resp, err := s.Recv()
		if err != nil {
			return err
		}
		x.observe(i, tr, resp.GetResources(), time.Now())
		err = s.Send(&discoverypb.DiscoveryRequest{
			TypeUrl: x.coding.kind.typeURL, VersionInfo: resp.GetVersionInfo(),
			ResponseNonce: resp.GetNonce(), ResourceNames: x.cfg.Names,
		})
		if err != nil {
			return sendError(s, err)
		}
	}
}

// delta follows "Incremental xDS": names subscribed in the first request
// (none: wildcard), each response ACKed by its nonce.
func (x *xdsClients) delta(s deltaStream, node *corepb.Node, i int, tr *tracker) error {
	if err := s.Send(x.deltaSubscribe(node)); err != nil {
		return sendError(s, err)
	}
	x.established(i, tr)
	for {
		resp, err := s.Recv()
		if err != nil {
			return err
		}
		now := time.Now()
		resources := make([]*anypb.Any, 0, len(resp.GetResources()))
		for _, r := range resp.GetResources() {
			resources = append(resources, r.GetResource())
		}
		x.observe(i, tr, resources, now)
		if err := s.Send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: x.coding.kind.typeURL, ResponseNonce: resp.GetNonce()}); err != nil {
			return sendError(s, err)
		}
	}
}

// established records that client i's stream is open and subscribed;
// with Config.RelayLimits that waits for its first response (tracker.observe),
// since the relay refuses a stream after reading its request.
func (x *xdsClients) established(i int, tr *tracker) {
	if !x.cfg.RelayLimits {
		tr.established(i)
	}
}

// observe records that client i received resources at t: their newest
// update, and whether its first config came from elsewhere.
func (x *xdsClients) observe(i int, tr *tracker, resources []*anypb.Any, t time.Time) {
	newest, foreign := x.scan(resources)
	if foreign {
		tr.foreignFirst(i)
	}
	tr.observe(i, newest, t)
}

// scan returns the highest sequence number among resources, 0 if none has
// one, and whether one of the type carries no mark of this run: a resource
// this run never published (from a relay's restored cache, say).
func (x *xdsClients) scan(resources []*anypb.Any) (newest int, foreign bool) {
	for _, a := range resources {
		s := x.coding.seqOf(a)
		newest = max(newest, s)
		foreign = foreign || (s < 0 && a.GetTypeUrl() == x.coding.kind.typeURL)
	}
	return newest, foreign
}

func openSotW(ctx context.Context, conn *grpc.ClientConn, typ string, ads bool, opts ...grpc.CallOption) (sotwStream, error) {
	if ads {
		return discoverypb.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx, opts...)
	}
	switch typ {
	case "eds":
		return endpointsvc.NewEndpointDiscoveryServiceClient(conn).StreamEndpoints(ctx, opts...)
	case "cds":
		return clustersvc.NewClusterDiscoveryServiceClient(conn).StreamClusters(ctx, opts...)
	case "lds":
		return listenersvc.NewListenerDiscoveryServiceClient(conn).StreamListeners(ctx, opts...)
	case "rds":
		return routesvc.NewRouteDiscoveryServiceClient(conn).StreamRoutes(ctx, opts...)
	}
	return nil, fmt.Errorf("unknown type %q", typ)
}

// openDelta is openSotW's switch over the incremental methods: gRPC's
// generated clients have a method per service and variant.
func openDelta(ctx context.Context, conn *grpc.ClientConn, typ string, ads bool, opts ...grpc.CallOption) (deltaStream, error) {
	if ads {
		return discoverypb.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx, opts...)
	}
	switch typ {
	case "eds":
		return endpointsvc.NewEndpointDiscoveryServiceClient(conn).DeltaEndpoints(ctx, opts...)
	case "cds":
		return clustersvc.NewClusterDiscoveryServiceClient(conn).DeltaClusters(ctx, opts...)
	case "lds":
		return listenersvc.NewListenerDiscoveryServiceClient(conn).DeltaListeners(ctx, opts...)
	case "rds":
		return routesvc.NewRouteDiscoveryServiceClient(conn).DeltaRoutes(ctx, opts...)
	}
	return nil, fmt.Errorf("unknown type %q", typ)
}

// byteCounter counts the bytes of every message received, gRPC framing
// included, on every connection it is installed on.
type byteCounter struct{ n atomic.Int64 }

var _ stats.Handler = (*byteCounter)(nil)

func (b *byteCounter) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (b *byteCounter) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}
func (b *byteCounter) HandleConn(context.Context, stats.ConnStats) {}

func (b *byteCounter) HandleRPC(_ context.Context, s stats.RPCStats) {
	if p, ok := s.(*stats.InPayload); ok {
		b.n.Add(int64(p.WireLength))
	}
}
