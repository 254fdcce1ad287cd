package loadtest

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	clustersvc "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointsvc "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	listenersvc "github.com/envoyproxy/go-control-plane/envoy/service/listener/v3"
	routesvc "github.com/envoyproxy/go-control-plane/envoy/service/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
)

// clusterHash keys snapshots by node.cluster.
type clusterHash struct{}

// ID implements cachev3.NodeHash.
func (clusterHash) ID(node *corepb.Node) string { return node.GetCluster() }

// controlPlane is a go-control-plane server that serves the resources of
// one kind and publishes numbered updates to them, one resource at a time.
type controlPlane struct {
	// Read-only after startControlPlane.
	addr      string
	catalog   *catalog
	nodeGroup string // the node.cluster that snapshots are keyed by
	snapshots cachev3.SnapshotCache
	linear    *cachev3.LinearCache
	grpc      *grpc.Server
	cancel    context.CancelFunc
	done      chan struct{}

	// Owned by the publishing goroutine.
	resources []types.Resource // resource i is catalog.names[i]
}

// startControlPlane serves cfg.Resources resources of cfg.Type on
// cfg.ServeCP from the cache cfg.CPCache names, on the aggregated and the
// per-type services.
func startControlPlane(cfg *Config, coding seqCoding) (*controlPlane, error) {
	cp := &controlPlane{catalog: newCatalog(cfg, coding), nodeGroup: cfg.NodeCluster, done: make(chan struct{})}
	for i := range cp.catalog.names {
		cp.resources = append(cp.resources, cp.catalog.resource(i, 0))
	}
	cache, err := cp.newCache(cfg.CPCache)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.ServeCP)
	if err != nil {
		return nil, fmt.Errorf("control plane: %w", err)
	}
	cp.addr = ln.Addr().String()
	cp.serve(ln, cache)
	return cp, nil
}

// newCache makes the cache and fills it with the initial resources.
func (cp *controlPlane) newCache(kind string) (cachev3.Cache, error) {
	if kind == CacheLinear {
		initial := make(map[string]types.Resource, len(cp.resources))
		for i, n := range cp.catalog.names {
			initial[n] = cp.resources[i]
		}
		cp.linear = cachev3.NewLinearCache(cp.catalog.typeURL(), cachev3.WithInitialResources(initial))
		return cp.linear, nil
	}
	cp.snapshots = cachev3.NewSnapshotCache(false, clusterHash{}, nil)
	return cp.snapshots, cp.setSnapshot(0)
}

func (cp *controlPlane) setSnapshot(seq int) error {
	snap, err := cachev3.NewSnapshot(strconv.Itoa(seq), map[string][]types.Resource{cp.catalog.typeURL(): cp.resources})
	if err != nil {
		return fmt.Errorf("control plane: %w", err)
	}
	return cp.snapshots.SetSnapshot(context.Background(), cp.nodeGroup, snap)
}

func (cp *controlPlane) serve(ln net.Listener, cache cachev3.Cache) {
	ctx, cancel := context.WithCancel(context.Background())
	cp.cancel = cancel
	srv := serverv3.NewServer(ctx, cache, nil)
	cp.grpc = grpc.NewServer()
	discoverypb.RegisterAggregatedDiscoveryServiceServer(cp.grpc, srv)
	endpointsvc.RegisterEndpointDiscoveryServiceServer(cp.grpc, srv)
	clustersvc.RegisterClusterDiscoveryServiceServer(cp.grpc, srv)
	listenersvc.RegisterListenerDiscoveryServiceServer(cp.grpc, srv)
	routesvc.RegisterRouteDiscoveryServiceServer(cp.grpc, srv)
	go func() {
		defer close(cp.done)
		_ = cp.grpc.Serve(ln)
	}()
}

// publish replaces one resource with a version that carries seq, and
// returns the moment it handed it to the cache. Calls must not overlap.
func (cp *controlPlane) publish(seq int) (time.Time, error) {
	turn, i, res := cp.catalog.update(seq)
	if cp.linear != nil {
		t := time.Now()
		return t, cp.linear.UpdateResource(cp.catalog.rotation[turn], res)
	}
	cp.resources[i] = res
	t := time.Now()
	return t, cp.setSnapshot(seq)
}

// stop closes every stream and waits for the server to end.
func (cp *controlPlane) stop() {
	cp.grpc.Stop()
	cp.cancel()
	<-cp.done
}
