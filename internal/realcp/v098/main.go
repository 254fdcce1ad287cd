// Command v098 runs go-control-plane v0.9.8's own server (serverv3.NewServer
// over cachev3.NewSnapshotCache(true, ...), unmodified) on a local port, for
// the relay's tests of control planes nobody here wrote
// (internal/realcp). v0.9.8 is the last release that speaks only state of
// the world: it answers every delta method with errors.New("not
// implemented"), which gRPC sends as Unknown. It needs grpc v1.27 and
// protobuf v1.23, so it is a module of its own, built and run as a process.
//
// Flags choose the server's shape: -shape ads (the library's ADS and
// per-type services, as registered by its example), per-type (the per-type
// services only, no ADS, as Contour and Cilium), or polite (as ads, with
// delta answered Unimplemented). It prints "listening ADDR" once serving,
// then a line per event: "open METHOD" and "end METHOD CODE" for each
// stream, "request TYPEURL N" for each SotW request (N names), "set KEY
// VERSION" once a snapshot is set. It reads snapshots from stdin, one JSON
// object a line: {"key": "...", "version": "...", "resources": [base64 of a
// google.protobuf.Any, ...]}, keyed by -key (node.cluster or node.id). It
// stops when stdin closes.
package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"sync"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	clusterservice "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointservice "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	listenerservice "github.com/envoyproxy/go-control-plane/envoy/service/listener/v3"
	routeservice "github.com/envoyproxy/go-control-plane/envoy/service/route/v3"
	secretservice "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resource "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "address to listen on")
	shape := flag.String("shape", "ads", "ads, per-type or polite")
	key := flag.String("key", "cluster", "the node field snapshots are keyed by: cluster or id")
	flag.Parse()

	var hash cachev3.NodeHash = clusterHash{}
	if *key == "id" {
		hash = cachev3.IDHash{}
	}
	snapshots := cachev3.NewSnapshotCache(true, hash, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := serverv3.NewServer(ctx, snapshots, callbacks{out})

	g := grpc.NewServer(grpc.StreamInterceptor(func(s interface{}, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		out.say("open %s", info.FullMethod)
		err := h(s, ss)
		out.say("end %s %s", info.FullMethod, status.Code(err))
		return err
	}))
	switch *shape {
	case "ads":
		register(g, srv, true)
	case "per-type":
		register(g, srv, false)
	case "polite":
		register(g, polite{srv}, true)
	default:
		log.Fatalf("-shape %q: want ads, per-type or polite", *shape)
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	go func() {
		if err := g.Serve(ln); err != nil {
			log.Fatal(err)
		}
	}()
	out.say("listening %s", ln.Addr())

	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 64<<20)
	for in.Scan() {
		if err := set(snapshots, in.Bytes()); err != nil {
			log.Fatal(err)
		}
	}
	g.Stop()
}

// out is where events are printed.
var out = &events{w: bufio.NewWriter(os.Stdout)}

// events prints one line per event, whole, flushed at once.
type events struct {
	mu sync.Mutex
	w  *bufio.Writer
}

func (e *events) say(format string, args ...interface{}) {
	e.mu.Lock()
	defer e.mu.Unlock()
	fmt.Fprintf(e.w, format+"\n", args...)
	e.w.Flush()
}

// callbacks print each SotW request: its type and how many names.
type callbacks struct{ out *events }

func (callbacks) OnStreamOpen(context.Context, int64, string) error { return nil }
func (callbacks) OnStreamClosed(int64)                              {}
func (c callbacks) OnStreamRequest(_ int64, r *discoverygrpc.DiscoveryRequest) error {
	c.out.say("request %s %d", r.GetTypeUrl(), len(r.GetResourceNames()))
	return nil
}
func (callbacks) OnStreamResponse(int64, *discoverygrpc.DiscoveryRequest, *discoverygrpc.DiscoveryResponse) {
}
func (callbacks) OnFetchRequest(context.Context, *discoverygrpc.DiscoveryRequest) error             { return nil }
func (callbacks) OnFetchResponse(*discoverygrpc.DiscoveryRequest, *discoverygrpc.DiscoveryResponse) {}

// register registers srv's per-type services on g, and ADS if ads.
func register(g *grpc.Server, srv serverv3.Server, ads bool) {
	if ads {
		discoverygrpc.RegisterAggregatedDiscoveryServiceServer(g, srv)
	}
	endpointservice.RegisterEndpointDiscoveryServiceServer(g, srv)
	clusterservice.RegisterClusterDiscoveryServiceServer(g, srv)
	routeservice.RegisterRouteDiscoveryServiceServer(g, srv)
	listenerservice.RegisterListenerDiscoveryServiceServer(g, srv)
	secretservice.RegisterSecretDiscoveryServiceServer(g, srv)
}

// polite is the library's server, but for delta ADS, which it refuses as
// the spec says a server that lacks a method should: Unimplemented.
type polite struct{ serverv3.Server }

func (polite) DeltaAggregatedResources(discoverygrpc.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
	return status.Error(codes.Unimplemented, "delta xDS is not served")
}

// clusterHash keys snapshots by node.cluster.
type clusterHash struct{}

func (clusterHash) ID(n *core.Node) string { return n.GetCluster() }

// snapshot is one line of stdin.
type snapshot struct {
	Key       string   `json:"key"`
	Version   string   `json:"version"`
	Resources []string `json:"resources"`
}

// set decodes a line of stdin and sets its snapshot.
func set(c cachev3.SnapshotCache, line []byte) error {
	var s snapshot
	if err := json.Unmarshal(line, &s); err != nil {
		return fmt.Errorf("snapshot line: %v", err)
	}
	byType := map[string][]types.Resource{}
	for _, r := range s.Resources {
		b, err := base64.StdEncoding.DecodeString(r)
		if err != nil {
			return err
		}
		a := &anypb.Any{}
		if err := proto.Unmarshal(b, a); err != nil {
			return err
		}
		mt, err := protoregistry.GlobalTypes.FindMessageByURL(a.GetTypeUrl())
		if err != nil {
			return fmt.Errorf("resource of type %s: %v", a.GetTypeUrl(), err)
		}
		m := mt.New().Interface()
		if err := proto.Unmarshal(a.GetValue(), m); err != nil {
			return err
		}
		r, ok := m.(types.Resource) // generated messages are both
		if !ok {
			return fmt.Errorf("resource of type %s is not a resource", a.GetTypeUrl())
		}
		byType[a.GetTypeUrl()] = append(byType[a.GetTypeUrl()], r)
	}
	snap := cachev3.NewSnapshot(s.Version, byType[resource.EndpointType], byType[resource.ClusterType],
		byType[resource.RouteType], byType[resource.ListenerType], byType[resource.RuntimeType], byType[resource.SecretType])
	if err := c.SetSnapshot(s.Key, snap); err != nil {
		return err
	}
	out.say("set %s %s", s.Key, s.Version)
	return nil
}
