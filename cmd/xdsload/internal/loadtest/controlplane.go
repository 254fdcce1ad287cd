package loadtest

import (
	"cmp"
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
	lrspb "github.com/envoyproxy/go-control-plane/envoy/service/load_stats/v3"
	routesvc "github.com/envoyproxy/go-control-plane/envoy/service/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
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
	nodeGroup string     // the node.cluster that snapshots are keyed by
	groups    []string   // with a fleet run's groups (Config.Fleet.Groups), every node.cluster served; nodeGroup alone otherwise
	protocol  string     // what it speaks (Config.CPProtocol)
	lrs       *lrsServer // the load reporting server, on the same port
	counts    cpCounts   // its streams, connections and responses
	snapshots cachev3.SnapshotCache
	linear    *cachev3.LinearCache
	cache     cachev3.Cache // snapshots or linear

	// Owned by the publishing goroutine, which also pauses and resumes
	// the server (a soak's restarts): nil grpc while paused.
	resources []types.Resource // resource i is catalog.names[i]
	grpc      *grpc.Server
	cancel    context.CancelFunc
	done      chan struct{}
}

// startControlPlane serves cfg.Resources resources of cfg.Type on
// cfg.ServeCP from the cache cfg.CPCache names, on the aggregated and the
// per-type services.
func startControlPlane(cfg *Config, coding seqCoding) (*controlPlane, error) {
	cp := &controlPlane{catalog: newCatalog(cfg, coding), nodeGroup: cfg.NodeCluster, protocol: cfg.CPProtocol, lrs: newLRSServer(cmp.Or(cfg.LRSInterval, time.Second)),
		groups: fleetGroups(cfg)}
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
	cp.addr, cp.cache = ln.Addr().String(), cache
	cp.serve(ln)
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

// setSnapshot publishes the resources as of seq to every group served: each
// a snapshot of its own, as a control plane computes each group's.
func (cp *controlPlane) setSnapshot(seq int) error {
	for _, g := range cp.groups {
		if err := cp.setGroupSnapshot(g, seq); err != nil {
			return err
		}
	}
	return nil
}

// setGroupSnapshot publishes the resources as of seq to group g.
func (cp *controlPlane) setGroupSnapshot(g string, seq int) error {
	snap, err := cachev3.NewSnapshot(strconv.Itoa(seq), map[string][]types.Resource{cp.catalog.typeURL(): cp.resources})
	if err != nil {
		return fmt.Errorf("control plane: %w", err)
	}
	return cp.snapshots.SetSnapshot(context.Background(), g, snap)
}

// fleetGroups are the node.cluster values a control plane serves: a fleet
// run's groups g0 to gN-1, or the one of every client.
func fleetGroups(cfg *Config) []string {
	if cfg.Fleet.Groups == 0 {
		return []string{cfg.NodeCluster}
	}
	out := make([]string, cfg.Fleet.Groups)
	for i := range out {
		out[i] = groupName(i)
	}
	return out
}

// groupName is a fleet run's group i, its clients' node.cluster.
func groupName(i int) string { return "g" + strconv.Itoa(i) }

func (cp *controlPlane) serve(ln net.Listener) {
	ctx, cancel := context.WithCancel(context.Background())
	cp.cancel, cp.done = cancel, make(chan struct{})
	srv := serverv3.NewServer(ctx, cp.cache, cp.counts.callbacks())
	// The relay pings its upstream every 30s (upstream.keepalive.time),
	// every 10s in a soak with faults: allowed, or the server would send
	// it away as too_many_pings.
	cp.grpc = grpc.NewServer(grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.StatsHandler(connCounter{&cp.counts}))
	if d := testcp.Dialect(cp.protocol); d != testcp.DialectDelta {
		testcp.Register(cp.grpc, d, srv) // state of the world only (--cp-protocol)
	} else {
		discoverypb.RegisterAggregatedDiscoveryServiceServer(cp.grpc, srv)
		endpointsvc.RegisterEndpointDiscoveryServiceServer(cp.grpc, srv)
		clustersvc.RegisterClusterDiscoveryServiceServer(cp.grpc, srv)
		listenersvc.RegisterListenerDiscoveryServiceServer(cp.grpc, srv)
		routesvc.RegisterRouteDiscoveryServiceServer(cp.grpc, srv)
	}
	lrspb.RegisterLoadReportingServiceServer(cp.grpc, cp.lrs)
	done := cp.done
	go func() {
		defer close(done)
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
	if len(cp.groups) > 1 {
		// A fleet run's groups: update seq is one group's change, in turn
		// (updateGroup), as a control plane changes one service's config.
		g := cp.groups[updateGroup(seq, len(cp.groups))]
		return t, cp.setGroupSnapshot(g, seq)
	}
	return t, cp.setSnapshot(seq)
}

// updateGroup is the group (its index) a fleet run's update seq changes
// when each group has a snapshot of its own.
func updateGroup(seq, groups int) int { return (seq - 1) % groups }

// stop closes every stream and waits for the server to end; a paused
// control plane has nothing to stop.
func (cp *controlPlane) stop() {
	if cp.grpc == nil {
		return
	}
	cp.grpc.Stop()
	cp.cancel()
	<-cp.done
	cp.grpc = nil
}

// pause stops serving, as a control plane that goes down: every stream
// and connection is closed and the address refuses connections. The cache
// keeps its resources, and publish still changes them.
func (cp *controlPlane) pause() error {
	cp.stop()
	return nil
}

// resume serves again, on the same address, the resources the cache holds
// now: a control plane come back.
func (cp *controlPlane) resume() error {
	if cp.grpc != nil {
		return nil
	}
	ln, err := net.Listen("tcp", cp.addr)
	if err != nil {
		return fmt.Errorf("control plane: back on %s: %w", cp.addr, err)
	}
	cp.serve(ln)
	return nil
}
