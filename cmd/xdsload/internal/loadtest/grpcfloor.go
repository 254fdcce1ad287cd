package loadtest

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	clustersvc "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointsvc "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	listenersvc "github.com/envoyproxy/go-control-plane/envoy/service/listener/v3"
	routesvc "github.com/envoyproxy/go-control-plane/envoy/service/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// grpcFloor is the gRPC floor: a bare grpc-go server on the xDS services
// the clients use (ADS and the per-type service of the type) that writes
// each stream, for its first config and for each update, one response
// encoded ahead of time: the bytes the relay would send. The resources are
// encoded once per update as the relay encodes what it receives
// (xds.Encode); a stream's response is then only a small header with its
// nonce in front of those shared bytes, written as they are (xds.Codec).
//
// It keeps no cache and no protocol state: it reads a stream's first
// request only to learn that the stream has subscribed, and the later ones
// (ACKs) only to drain them; it sends every stream the resources the tool's
// clients subscribe to (Config.Names, or all), whatever the request names.
// What is left is what any xDS server on grpc-go pays: the transport, a
// goroutine per stream, a header and a write per response.
type grpcFloor struct {
	// Read-only after startGRPCFloor.
	catalog *catalog
	typeURL string
	delta   bool // it serves delta streams; else SotW ones
	full    bool // a SotW update carries every subscribed resource (LDS, CDS)
	addr    string
	grpc    *grpc.Server
	done    chan struct{} // closed when Serve has returned

	mu sync.Mutex
	// Guarded by mu. The byte slices, once built, are shared by the sends
	// in flight and never written again.
	streams map[*floorStream]struct{}
	current []*cache.Resource // catalog.rotation[j] as of version, encoded
	version uint64
	all     []byte // current's fields concatenated; nil until needed again
}

// floorStream is one stream of the gRPC floor.
type floorStream struct {
	// Read-only after serve creates it.
	grpc.ServerStream
	floor *grpcFloor

	// mu owns the stream's send side: held across a send, by the handler
	// for the first response, then by the publisher for each update.
	mu     sync.Mutex
	nonce  uint64 // guarded by mu
	closed bool   // guarded by mu: the handler is returning, no more sends
}

// floorServerOptions are the relay's downstream server options (relay.New)
// that shape what a stream costs, so that the floor pays in gRPC what the
// relay pays and nothing more:
//   - the pass-through codec (downstream.ServerOptions): a response is
//     written as the bytes it already is;
//   - SharedWriteBuffer, an 8 KiB read and a 32 KiB write buffer: an idle
//     connection's buffers, much of its RSS;
//   - static 64 KiB stream and connection windows: no BDP ping (and ping
//     ack) after every ACK a client sends;
//   - no bound on the streams of a connection, as the load tool's relay
//     has none (MaxStreamsPerConnection 0) and --streams-per-conn
//     multiplexes clients onto connections.
//
// Left out as they change nothing here: keepalive enforcement and the
// request size bound (the clients neither ping nor send large requests),
// tracing (off in the load tool's relay) and TLS (the clients dial
// insecure). WaitForHandlers makes stop wait for every stream's handler.
func floorServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ForceServerCodecV2(xds.Codec{}),
		grpc.SharedWriteBuffer(true),
		grpc.ReadBufferSize(8 << 10),
		grpc.WriteBufferSize(32 << 10),
		grpc.StaticStreamWindowSize(64 << 10),
		grpc.StaticConnWindowSize(64 << 10),
		grpc.MaxConcurrentStreams(math.MaxUint32),
		grpc.WaitForHandlers(true),
	}
}

// typeServices are the per-type services the floor serves, by --type.
var typeServices = map[string]*grpc.ServiceDesc{
	"eds": &endpointsvc.EndpointDiscoveryService_ServiceDesc,
	"cds": &clustersvc.ClusterDiscoveryService_ServiceDesc,
	"lds": &listenersvc.ListenerDiscoveryService_ServiceDesc,
	"rds": &routesvc.RouteDiscoveryService_ServiceDesc,
}

// startGRPCFloor encodes the subscribed resources as of before any update
// and serves them on a free loopback port.
func startGRPCFloor(cfg *Config, coding seqCoding) (*grpcFloor, error) {
	c := newCatalog(cfg, coding)
	f := &grpcFloor{catalog: c, typeURL: c.typeURL(), delta: cfg.Variant == VariantDelta,
		full: xds.FullState(c.typeURL()), streams: map[*floorStream]struct{}{}, version: 1, done: make(chan struct{})}
	for _, name := range c.rotation {
		r, err := encodeResource(name, c.resource(c.index[name], 0))
		if err != nil {
			return nil, err
		}
		f.current = append(f.current, r)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("grpc floor: %w", err)
	}
	f.addr = ln.Addr().String()
	f.grpc = grpc.NewServer(floorServerOptions()...)
	for _, d := range []*grpc.ServiceDesc{&discoverypb.AggregatedDiscoveryService_ServiceDesc, typeServices[cfg.Type]} {
		f.grpc.RegisterService(f.service(d), f)
	}
	go func() {
		defer close(f.done)
		_ = f.grpc.Serve(ln)
	}()
	return f, nil
}

// service is d with every stream served by the floor and no unary (Fetch)
// method: polling is refused as unimplemented.
func (f *grpcFloor) service(d *grpc.ServiceDesc) *grpc.ServiceDesc {
	out := &grpc.ServiceDesc{ServiceName: d.ServiceName, HandlerType: (*any)(nil), Metadata: d.Metadata}
	for _, sd := range d.Streams {
		delta := strings.HasPrefix(sd.StreamName, "Delta")
		sd.Handler = func(_ any, ss grpc.ServerStream) error { return f.serve(ss, delta) }
		out.Streams = append(out.Streams, sd)
	}
	return out
}

// encodeResource encodes res once, as the relay encodes what it receives:
// the delta Resource field and the SotW Any field, its version a hash of
// its bytes.
func encodeResource(name string, res types.Resource) (*cache.Resource, error) {
	a, err := anypb.New(res)
	if err != nil {
		return nil, fmt.Errorf("grpc floor: %w", err)
	}
	r, err := xds.Encode(name, "", a, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("grpc floor: %w", err)
	}
	return r, nil
}

// serve is a stream's handler: it waits for the subscription, sends the
// current state, then drains the client's ACKs until the stream ends.
func (f *grpcFloor) serve(ss grpc.ServerStream, delta bool) error {
	if delta != f.delta {
		return status.Errorf(codes.Unimplemented, "grpc floor: it serves %s streams only (--variant)", variantName(f.delta))
	}
	var req any = &discoverypb.DiscoveryRequest{}
	if delta {
		req = &discoverypb.DeltaDiscoveryRequest{}
	}
	if err := ss.RecvMsg(req); err != nil {
		return recvError(err)
	}
	s := &floorStream{ServerStream: ss, floor: f}
	defer f.leave(s)
	if err := f.join(s); err != nil {
		return err
	}
	for {
		if err := ss.RecvMsg(req); err != nil {
			return recvError(err)
		}
	}
}

func variantName(delta bool) string {
	if delta {
		return VariantDelta
	}
	return VariantSotW
}

// recvError is a handler's result once Recv failed: nil for a client that
// closed its side.
func recvError(err error) error {
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// join registers s for the updates and sends it every subscribed resource
// as of now. s's send side is taken before the publisher can see s, so
// that no update goes out ahead of this first response.
func (f *grpcFloor) join(s *floorStream) error {
	f.mu.Lock()
	f.streams[s] = struct{}{}
	version, body := f.version, f.allLocked()
	s.mu.Lock()
	f.mu.Unlock()
	defer s.mu.Unlock()
	return s.sendLocked(version, body)
}

// leave unregisters s and closes its send side: once the handler returns,
// gRPC's stream must not be written.
func (f *grpcFloor) leave(s *floorStream) {
	f.mu.Lock()
	delete(f.streams, s)
	f.mu.Unlock()
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
}

// field is how a response carries r: the delta Resource or the SotW Any.
func (f *grpcFloor) field(r *cache.Resource) []byte {
	if f.delta {
		return r.Wire
	}
	return r.Any
}

// allLocked is every subscribed resource's field, concatenated once per
// version: a new stream's first response, and every SotW LDS and CDS
// response ("Grouping Resources into Responses": they carry the full
// state).
func (f *grpcFloor) allLocked() []byte {
	if f.all == nil {
		n := 0
		for _, r := range f.current {
			n += len(f.field(r))
		}
		f.all = make([]byte, 0, n)
		for _, r := range f.current {
			f.all = append(f.all, f.field(r)...)
		}
	}
	return f.all
}

// publish encodes the resource that update seq replaces and writes every
// stream one response: the changed resource (delta, and SotW EDS and RDS),
// or every subscribed one (SotW LDS and CDS), as the relay does. The
// writes go out from as many goroutines as there are CPUs. Calls must not
// overlap.
func (f *grpcFloor) publish(seq int) (time.Time, error) {
	turn, _, res := f.catalog.update(seq)
	t := time.Now() // the resource is built; encoding it is the server's work
	r, err := encodeResource(f.catalog.rotation[turn], res)
	if err != nil {
		return t, err
	}
	f.mu.Lock()
	f.current[turn], f.all = r, nil
	f.version++
	version, body := f.version, f.field(r)
	if f.full && !f.delta {
		body = f.allLocked()
	}
	streams := slices.Collect(maps.Keys(f.streams))
	f.mu.Unlock()
	if err := inParallel(len(streams), func(j int) error { return streams[j].send(version, body) }); err != nil {
		return t, fmt.Errorf("grpc floor: %w", err)
	}
	return t, nil
}

// send writes s one response of version carrying body.
func (s *floorStream) send(version uint64, body []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sendLocked(version, body)
}

// sendLocked assembles the response: a header with version, the type and
// the stream's next nonce, then body, written without re-encoding.
func (s *floorStream) sendLocked(version uint64, body []byte) error {
	if s.closed {
		return nil
	}
	s.nonce++
	f, nonce, fields := s.floor, strconv.FormatUint(s.nonce, 10), [][]byte{body}
	if f.delta {
		return s.SendMsg(xds.DeltaFields(version, f.typeURL, nonce, fields, nil))
	}
	return s.SendMsg(xds.SotWFields(version, f.typeURL, nonce, fields))
}

// stop closes every stream and waits for the handlers and the server.
func (f *grpcFloor) stop() {
	f.grpc.Stop()
	<-f.done
}
