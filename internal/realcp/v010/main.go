// Command v010 runs go-control-plane v0.10.3's own server
// (serverv3.NewServer over cachev3.NewSnapshotCache(true, ...), unmodified)
// on a local port, for the relay's tests of control planes nobody here
// wrote (internal/realcp). v0.10 is the line that added delta xDS
// (2021–2022, still embedded in control planes and in the
// envoyproxy/xds-test-harness target). Its delta server takes the wildcard
// from the legacy form alone: a stream's first request of a type with no
// names is a wildcard subscription, and "*" is a resource name like any
// other, so an explicit "*" is never answered. It needs grpc v1.45 and
// protobuf v1.28 beside a go-control-plane that is not the relay's, so it
// is a module of its own, built and run as a process.
//
// It prints "listening ADDR" once serving, then a line per event: "open
// METHOD" and "end METHOD CODE" for each stream; "request TYPEURL N" for
// each SotW request (N names); "delta TYPEURL subscribe=A,B unsubscribe=C
// versions=N" for each delta request; "delta-response TYPEURL N removed=M"
// for each delta response; "set KEY VERSION" once a snapshot is set. It
// reads snapshots from stdin, one JSON object a line: {"key": "...",
// "version": "...", "resources": [base64 of a google.protobuf.Any, ...]},
// keyed by -key (node.cluster or node.id). It stops when stdin closes.
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
	"strings"
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
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "address to listen on")
	key := flag.String("key", "cluster", "the node field snapshots are keyed by: cluster or id")
	flag.Parse()

	var hash cachev3.NodeHash = clusterHash{}
	if *key == "id" {
		hash = cachev3.IDHash{}
	}
	snapshots := cachev3.NewSnapshotCache(true, hash, quiet{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := serverv3.NewServer(ctx, snapshots, callbacks())

	g := grpc.NewServer(grpc.StreamInterceptor(func(s interface{}, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		out.say("open %s", info.FullMethod)
		err := h(s, ss)
		out.say("end %s %s", info.FullMethod, status.Code(err))
		return err
	}))
	// As the library's example registers them.
	discoverygrpc.RegisterAggregatedDiscoveryServiceServer(g, srv)
	endpointservice.RegisterEndpointDiscoveryServiceServer(g, srv)
	clusterservice.RegisterClusterDiscoveryServiceServer(g, srv)
	routeservice.RegisterRouteDiscoveryServiceServer(g, srv)
	listenerservice.RegisterListenerDiscoveryServiceServer(g, srv)
	secretservice.RegisterSecretDiscoveryServiceServer(g, srv)

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

// callbacks print each request, and each delta response.
func callbacks() serverv3.CallbackFuncs {
	return serverv3.CallbackFuncs{
		StreamRequestFunc: func(_ int64, r *discoverygrpc.DiscoveryRequest) error {
			out.say("request %s %d", r.GetTypeUrl(), len(r.GetResourceNames()))
			return nil
		},
		StreamDeltaRequestFunc: func(_ int64, r *discoverygrpc.DeltaDiscoveryRequest) error {
			out.say("delta %s subscribe=%s unsubscribe=%s versions=%d", r.GetTypeUrl(),
				strings.Join(r.GetResourceNamesSubscribe(), ","), strings.Join(r.GetResourceNamesUnsubscribe(), ","),
				len(r.GetInitialResourceVersions()))
			return nil
		},
		StreamDeltaResponseFunc: func(_ int64, _ *discoverygrpc.DeltaDiscoveryRequest, r *discoverygrpc.DeltaDiscoveryResponse) {
			out.say("delta-response %s %d removed=%d", r.GetTypeUrl(), len(r.GetResources()), len(r.GetRemovedResources()))
		},
	}
}

// quiet drops the cache's log lines: stdout carries the events, and the
// cache logs every watch at Info.
type quiet struct{}

func (quiet) Debugf(string, ...interface{}) {}
func (quiet) Infof(string, ...interface{})  {}
func (quiet) Warnf(format string, args ...interface{}) {
	log.Printf("warn: "+format, args...)
}
func (quiet) Errorf(format string, args ...interface{}) {
	log.Printf("error: "+format, args...)
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
	byType := map[resource.Type][]types.Resource{}
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
	snap, err := cachev3.NewSnapshot(s.Version, byType)
	if err != nil {
		return err
	}
	if err := c.SetSnapshot(context.Background(), s.Key, snap); err != nil {
		return err
	}
	out.say("set %s %s", s.Key, s.Version)
	return nil
}
