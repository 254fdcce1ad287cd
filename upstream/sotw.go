package upstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	clusterservice "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointservice "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	extensionservice "github.com/envoyproxy/go-control-plane/envoy/service/extension/v3"
	listenerservice "github.com/envoyproxy/go-control-plane/envoy/service/listener/v3"
	routeservice "github.com/envoyproxy/go-control-plane/envoy/service/route/v3"
	runtimeservice "github.com/envoyproxy/go-control-plane/envoy/service/runtime/v3"
	secretservice "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// perTypeMethods are the per-type state-of-the-world services' stream
// methods, by type URL ("Variants of the xDS Transport Protocol"). VHDS
// and LEDS have none: they are incremental only.
var perTypeMethods = map[string]string{
	resourcev3.ClusterType:         clusterservice.ClusterDiscoveryService_StreamClusters_FullMethodName,
	resourcev3.EndpointType:        endpointservice.EndpointDiscoveryService_StreamEndpoints_FullMethodName,
	resourcev3.ListenerType:        listenerservice.ListenerDiscoveryService_StreamListeners_FullMethodName,
	resourcev3.RouteType:           routeservice.RouteDiscoveryService_StreamRoutes_FullMethodName,
	resourcev3.ScopedRouteType:     routeservice.ScopedRoutesDiscoveryService_StreamScopedRoutes_FullMethodName,
	resourcev3.SecretType:          secretservice.SecretDiscoveryService_StreamSecrets_FullMethodName,
	resourcev3.RuntimeType:         runtimeservice.RuntimeDiscoveryService_StreamRuntime_FullMethodName,
	resourcev3.ExtensionConfigType: extensionservice.ExtensionConfigDiscoveryService_StreamExtensionConfigs_FullMethodName,
}

var sotwDesc = &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}

// errNoSotWService is why a type with no state-of-the-world service
// (VHDS, LEDS) cannot be asked of a per-type control plane.
var errNoSotWService = errors.New("not served by the control plane's per-type state-of-the-world services")

// sotwStream speaks state of the world to one server, over ADS or over
// the per-type services (one stream per type, opened at the type's first
// request), as Envoy's SotW gRPC mux does (grpc_mux_impl.cc): each
// request of a type carries the whole name list, the version last
// accepted and the nonce last answered ("ACK/NACK and resource type
// instance version"). It gives the session the responses as Received
// (xds.SotWReceived); what absence means is the session's.
//
// A new stream asks with an empty version_info, not the last version
// seen: the relay keeps no resume in SotW, and wants each type's whole
// state to learn what was removed meanwhile; a server that skipped
// "resources the client had already seen" would leave a removal unknown
// (spec "Basic Protocol Overview" allows either).
type sotwStream struct {
	// Read-only after openSotW.
	ctx     context.Context
	conn    grpc.ClientConnInterface
	perType bool
	node    *corepb.Node
	debug   func(*discoverypb.DiscoveryRequest)
	// unserved reports a type whose per-type service the server refused.
	unserved func(typeURL string) bool

	// Owned by the session's owner, the only caller of request, ack and
	// wait.
	ads     grpc.ClientStream            // the one stream over ADS
	streams map[string]grpc.ClientStream // per type, over the per-type services
	types   map[string]*sotwType
	readers sync.WaitGroup // the per-type streams' receivers

	merged chan sotwRecv // per type: the receivers' responses, in arrival order
}

// sotwType is one type's request state on the stream.
type sotwType struct {
	acked     string // version_info of the last response accepted
	nonce     string // of the last response answered
	named     bool   // a request with names has been sent: no legacy wildcard since
	requested bool   // a request has been sent
}

type sotwRecv struct {
	r   xds.Received
	err error
}

// openSotW opens a state-of-the-world stream to conn: the ADS stream at
// once, the per-type streams at their first request.
func openSotW(ctx context.Context, conn grpc.ClientConnInterface, perType bool, node *corepb.Node,
	debug func(*discoverypb.DiscoveryRequest), unserved func(string) bool) (*sotwStream, error) {
	s := &sotwStream{ctx: ctx, conn: conn, perType: perType, node: node, debug: debug, unserved: unserved,
		streams: map[string]grpc.ClientStream{}, types: map[string]*sotwType{}}
	if perType {
		s.merged = make(chan sotwRecv)
		return s, nil
	}
	st, err := conn.NewStream(ctx, sotwDesc, discoverypb.AggregatedDiscoveryService_StreamAggregatedResources_FullMethodName,
		grpc.ForceCodecV2(xds.Codec{}))
	if err != nil {
		return nil, err
	}
	s.ads = st
	return s, nil
}

// Context is the stream's.
func (s *sotwStream) Context() context.Context { return s.ctx }

// RecvMsg receives the next response of any type into m, a *xds.Received.
func (s *sotwStream) RecvMsg(m any) error {
	out := m.(*xds.Received)
	if !s.perType {
		var r xds.SotWReceived
		if err := s.ads.RecvMsg(&r); err != nil {
			return err
		}
		*out = r.Received
		return nil
	}
	select {
	case got := <-s.merged:
		if got.err != nil {
			return got.err
		}
		*out = got.r
		return nil
	case <-s.ctx.Done():
		return s.ctx.Err()
	}
}

// request sends typeURL's subscription: the whole list, the wildcard as
// the legacy form (see list). A type never requested with nothing to ask
// is not sent.
func (s *sotwStream) request(typeURL string, wildcard bool, names []string) error {
	t := s.types[typeURL]
	if t == nil {
		if !wildcard && len(names) == 0 {
			return nil
		}
		t = &sotwType{}
		s.types[typeURL] = t
	}
	list, err := t.list(typeURL, wildcard, names)
	if err != nil {
		return err
	}
	return s.send(typeURL, &discoverypb.DiscoveryRequest{VersionInfo: t.acked, ResourceNames: list, TypeUrl: typeURL,
		ResponseNonce: t.nonce})
}

// list is the resource_names of a request of the type. Under the
// wildcard it is the legacy wildcard, no names at all: the wildcard
// already asks for every resource the server has, and every SotW control
// plane known answers the legacy form, where go-control-plane's snapshot
// cache takes an explicit "*" for a name (with ADS, "*" alone is never
// answered; "*" beside x is answered with x alone). Names wanted beside
// the wildcard that the server's wildcard does not cover are left to the
// does-not-exist timer, as any missing name. The legacy form means the
// wildcard only while nothing was named for the type on the stream ("How
// the client specifies what resources to return"): once names were sent,
// the wildcard needs a new stream (reopenError).
func (t *sotwType) list(typeURL string, wildcard bool, names []string) ([]string, error) {
	switch {
	case wildcard && t.named:
		return nil, &reopenError{typeURL: typeURL}
	case wildcard:
		return nil, nil
	}
	t.named = t.named || len(names) > 0
	return names, nil
}

// reopenError ends a stream whose type, named on it before, is now
// wanted under the wildcard: the stream is opened again at once (not a
// failure, no backoff), so that its first request of the type can carry
// the legacy wildcard. delta: the stream was delta (wildcardAfterNames).
type reopenError struct {
	typeURL string
	delta   bool
}

func (e *reopenError) Error() string {
	return fmt.Sprintf("upstream: %s wanted under the wildcard after names: the %s stream is opened again to ask with the legacy wildcard",
		xds.ShortName(e.typeURL), e.protocol())
}

func (e *reopenError) protocol() string {
	if e.delta {
		return "delta"
	}
	return "state-of-the-world"
}

// ack ACKs a response of typeURL (detail nil), accepting its version, or
// NACKs it, keeping the version accepted before; either way with the
// whole list again, as Envoy does.
func (s *sotwStream) ack(typeURL, nonce, version string, detail *rpcstatus.Status, wildcard bool, names []string) error {
	t := s.types[typeURL]
	if t == nil {
		t = &sotwType{}
		s.types[typeURL] = t
	}
	t.nonce = nonce
	if detail == nil {
		t.acked = version
	}
	list, err := t.list(typeURL, wildcard, names)
	if err != nil {
		return err
	}
	return s.send(typeURL, &discoverypb.DiscoveryRequest{VersionInfo: t.acked, ResourceNames: list, TypeUrl: typeURL,
		ResponseNonce: nonce, ErrorDetail: detail})
}

// answered reports whether a response of typeURL has been answered on
// the stream: there is one to NACK (forward).
func (s *sotwStream) answered(typeURL string) bool {
	t := s.types[typeURL]
	return t != nil && t.nonce != ""
}

// forward NACKs the last response of typeURL for the relay's clients
// (forward.go): the request last sent for the type, with detail. Its
// version_info is the version the relay accepted and serves, so that a
// server that compares versions (go-control-plane's snapshot cache) has
// nothing new to send, and its names are the whole list, so that
// nothing is unsubscribed.
func (s *sotwStream) forward(typeURL string, detail *rpcstatus.Status, wildcard bool, names []string) error {
	t := s.types[typeURL]
	list, err := t.list(typeURL, wildcard, names)
	if err != nil {
		return err
	}
	return s.send(typeURL, &discoverypb.DiscoveryRequest{VersionInfo: t.acked, ResourceNames: list, TypeUrl: typeURL,
		ResponseNonce: t.nonce, ErrorDetail: detail})
}

// send sends req on typeURL's stream, with the node on each stream's
// first request ("Basic Protocol Overview").
func (s *sotwStream) send(typeURL string, req *discoverypb.DiscoveryRequest) error {
	st, first, err := s.streamOf(typeURL)
	if err != nil {
		return err
	}
	if first {
		req.Node = s.node
	}
	s.types[typeURL].requested = true
	if err := st.SendMsg(req); err != nil {
		if s.perType && errors.Is(err, io.EOF) {
			// That type's stream has ended: its reader tells how
			// (refused, or the error that ends the session).
			return nil
		}
		return fmt.Errorf("upstream: send: %w", err)
	}
	if s.debug != nil {
		s.debug(req)
	}
	return nil
}

// streamOf is typeURL's stream, opened if it is a per-type one not yet
// open; first reports whether nothing was sent on it yet.
func (s *sotwStream) streamOf(typeURL string) (grpc.ClientStream, bool, error) {
	if !s.perType {
		first := true
		for _, t := range s.types {
			first = first && !t.requested
		}
		return s.ads, first, nil
	}
	if st, ok := s.streams[typeURL]; ok {
		return st, false, nil
	}
	method, ok := perTypeMethods[typeURL]
	if !ok || s.unserved(typeURL) {
		return nil, false, fmt.Errorf("upstream: %s is %w", xds.ShortName(typeURL), errNoSotWService)
	}
	st, err := s.conn.NewStream(s.ctx, sotwDesc, method, grpc.ForceCodecV2(xds.Codec{}))
	if err != nil {
		return nil, false, fmt.Errorf("upstream: open %s: %w", method, err)
	}
	s.streams[typeURL] = st
	s.readers.Add(1)
	go s.read(typeURL, st)
	return st, true, nil
}

// read passes one per-type stream's responses on, until it fails or the
// stream's context ends; its error, the first, ends the session. A
// service the server refuses (UNIMPLEMENTED, or the type refused in the
// server's words: refusal.go) is passed on as Unserved, not as an error:
// the server's other services may answer.
func (s *sotwStream) read(typeURL string, st grpc.ClientStream) {
	defer s.readers.Done()
	for {
		var r xds.SotWReceived
		err := st.RecvMsg(&r)
		switch {
		case status.Code(err) == codes.Unimplemented || typeRefused(err, func(t string) bool { return t == typeURL }) != "":
			r.Received, err = xds.Received{TypeURL: typeURL, Unserved: err}, nil
			select {
			case s.merged <- sotwRecv{r: r.Received}:
			case <-s.ctx.Done():
			}
			return
		case err != nil:
			err = &typeStreamError{typeURL: typeURL, err: err}
		}
		select {
		case s.merged <- sotwRecv{r: r.Received, err: err}:
		case <-s.ctx.Done():
			return
		}
		if err != nil {
			return
		}
	}
}

// typeStreamError is why one per-type stream ended.
type typeStreamError struct {
	typeURL string
	err     error
}

func (e *typeStreamError) Error() string {
	return fmt.Sprintf("%s stream: %v", xds.ShortName(e.typeURL), e.err)
}

func (e *typeStreamError) Unwrap() error { return e.err }

// refusedAll reports whether every type requested on the stream has
// been refused (unserved reports it).
func (s *sotwStream) refusedAll() bool {
	for typeURL, t := range s.types {
		if t.requested && !s.unserved(typeURL) {
			return false
		}
	}
	return true
}

// wait waits for the per-type receivers, once the stream's context is
// done.
func (s *sotwStream) wait() { s.readers.Wait() }

// requestSize is the size of typeURL's request with names, the node
// counted whether or not it goes on it: what a SotW request cannot split
// (no name may be left out of the list). Under the wildcard it carries no
// names (see list). The version and nonce it echoes are the control
// plane's, of any length: counted as they are.
func (s *sotwStream) requestSize(typeURL string, wildcard bool, names []string) int {
	var acked, nonce string
	if t := s.types[typeURL]; t != nil {
		acked, nonce = t.acked, t.nonce
	}
	n := proto.Size(&discoverypb.DiscoveryRequest{TypeUrl: typeURL, Node: s.node, VersionInfo: acked, ResponseNonce: nonce})
	if wildcard {
		return n
	}
	for _, name := range names {
		n += nameSize(name)
	}
	return n
}
