// Package envoysim is an xDS client that behaves on the wire as Envoy's
// does for clusters and their endpoints, warming included, so that tests
// and the load tool can prove what an Envoy fleet sees without an Envoy
// binary.
//
// What it does as Envoy does (GrpcMuxImpl, NewGrpcMuxImpl, WatchMap and
// CdsApiImpl; envoy#13009, envoy#47302):
//   - Clusters are subscribed with the wildcard; a cluster whose content
//     differs from what it had is new or changed and starts warming. An EDS
//     cluster warms until a response carrying its ClusterLoadAssignment
//     (eds_cluster_config.service_name, or its name) arrives after the
//     Cluster did ("Resource warming"; docs/architecture.md, invariant
//     13), changed or not.
//   - SotW: after every CDS response it sends an EDS request with the names
//     its clusters need and the version and nonce of its last EDS ACK:
//     identical to that ACK when the names did not change. Then it ACKs CDS.
//   - Delta: after a CDS response it subscribes only EDS names it did not
//     watch and unsubscribes those no cluster needs: nothing when the names
//     did not change.
//   - ADS (one stream for both types), or per-type CDS and EDS streams on
//     one connection.
//
// It is a client for tests: it keeps what it was sent and when each
// cluster became usable, and never NACKs.
package envoysim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	clusterpb "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointpb "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	clustersvc "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointsvc "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/anypb"
)

// Options configure a Client.
type Options struct {
	Conn grpc.ClientConnInterface // the xDS server
	Node *corepb.Node             // sent on each stream's first request
	// Delta selects the incremental variant (Envoy's DELTA_GRPC), else
	// SotW (GRPC).
	Delta bool
	// PerType opens CDS and EDS streams of their own on the connection
	// instead of one ADS stream.
	PerType bool
	// OnCluster, if set, is called with a cluster's state each time it
	// changes (a new version arrives, or it finishes warming), on the
	// goroutine that read the response, before the response is ACKed; it
	// may read the Client, and should not block.
	OnCluster func(Cluster)
}

// Cluster is what the client knows of one cluster.
type Cluster struct {
	Name string
	// EDS is the ClusterLoadAssignment the cluster's endpoints come from;
	// empty for a cluster of another discovery type.
	EDS string
	// Updated is when the cluster's current version arrived; Warming
	// reports that its endpoints have not arrived since.
	Updated time.Time
	Warming bool
	// Usable is when the current version finished warming (Updated for a
	// cluster without EDS); zero while it warms.
	Usable time.Time
	// Endpoints is the last ClusterLoadAssignment of EDS received.
	Endpoints *endpointpb.ClusterLoadAssignment
}

// Client is one simulated Envoy.
type Client struct {
	opts   Options
	cancel context.CancelFunc
	done   chan struct{}
	err    error // why the streams ended; set before done is closed

	mu       sync.Mutex
	clusters map[string]*clusterState // guarded by mu
	changed  chan struct{}            // guarded by mu: closed and replaced at every change
	cdsSeen  int                      // guarded by mu: CDS responses received
	edsSeen  int                      // guarded by mu: EDS responses received
}

type clusterState struct {
	Cluster
	raw []byte // the Cluster as received, to tell a change
}

// Start opens the client's streams and sends its first requests.
func Start(ctx context.Context, opts Options) (*Client, error) {
	if opts.Conn == nil || opts.Node == nil {
		return nil, errors.New("envoysim: Conn and Node are required")
	}
	ctx, cancel := context.WithCancel(ctx)
	c := &Client{opts: opts, cancel: cancel, done: make(chan struct{}), clusters: map[string]*clusterState{},
		changed: make(chan struct{})}
	var run func() error
	var err error
	if opts.Delta {
		run, err = c.startDelta(ctx)
	} else {
		run, err = c.startSotW(ctx)
	}
	if err != nil {
		cancel()
		return nil, err
	}
	go func() {
		defer close(c.done)
		c.err = run()
	}()
	return c, nil
}

// Close ends the streams and waits for them.
func (c *Client) Close() error {
	c.cancel()
	<-c.done
	return c.err
}

// Done is closed when the client's streams have ended; Err says why.
func (c *Client) Done() <-chan struct{} { return c.done }

// Err is why the streams ended; call after Done.
func (c *Client) Err() error { return c.err }

// Clusters returns a copy of what the client knows of each cluster.
func (c *Client) Clusters() map[string]Cluster {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]Cluster, len(c.clusters))
	for n, cs := range c.clusters {
		out[n] = cs.Cluster
	}
	return out
}

// WaitFor waits until cond holds of the clusters, or ctx ends.
func (c *Client) WaitFor(ctx context.Context, cond func(map[string]Cluster) bool) error {
	for {
		c.mu.Lock()
		ch := c.changed
		c.mu.Unlock()
		if cond(c.Clusters()) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("envoysim: %w; clusters: %v", ctx.Err(), c.describe())
		case <-c.done:
			return fmt.Errorf("envoysim: streams ended: %v", c.err)
		case <-ch:
		}
	}
}

// Usable reports whether cluster name is known and warmed.
func Usable(name string) func(map[string]Cluster) bool {
	return func(cs map[string]Cluster) bool {
		cl, ok := cs[name]
		return ok && !cl.Warming
	}
}

func (c *Client) describe() string {
	var b bytes.Buffer
	for _, cl := range c.Clusters() {
		fmt.Fprintf(&b, "%s(eds=%q warming=%v) ", cl.Name, cl.EDS, cl.Warming)
	}
	return b.String()
}

// tell passes the clusters' new states to Options.OnCluster; the caller
// does not hold mu.
func (c *Client) tell(cls []Cluster) {
	if c.opts.OnCluster != nil {
		for _, cl := range cls {
			c.opts.OnCluster(cl)
		}
	}
}

// notifyLocked wakes the waiters.
func (c *Client) notifyLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// onClusters applies a CDS response: resources the clusters now are
// (SotW: all of them, delta: those that changed), removed the names gone.
// It returns the EDS names the clusters need, after telling the clusters
// that changed.
func (c *Client) onClusters(rs []*anypb.Any, removed []string, full bool) ([]string, error) {
	names, told, err := c.applyClusters(rs, removed, full)
	c.tell(told)
	return names, err
}

func (c *Client) applyClusters(rs []*anypb.Any, removed []string, full bool) (names []string, told []Cluster, err error) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cdsSeen++
	seen := map[string]bool{}
	for _, a := range rs {
		var cl clusterpb.Cluster
		if err := a.UnmarshalTo(&cl); err != nil {
			return nil, told, fmt.Errorf("envoysim: cluster: %w", err)
		}
		seen[cl.GetName()] = true
		old := c.clusters[cl.GetName()]
		if old != nil && bytes.Equal(old.raw, a.GetValue()) {
			continue // the same cluster: Envoy keeps it as it is
		}
		cs := &clusterState{Cluster: Cluster{Name: cl.GetName(), EDS: edsName(&cl), Updated: now}, raw: a.GetValue()}
		if cs.EDS == "" {
			cs.Usable = now
		} else {
			cs.Warming = true
		}
		c.clusters[cl.GetName()] = cs
		told = append(told, cs.Cluster)
	}
	for _, n := range removed {
		delete(c.clusters, n)
	}
	if full {
		maps.DeleteFunc(c.clusters, func(n string, _ *clusterState) bool { return !seen[n] })
	}
	c.notifyLocked()
	return c.edsNamesLocked(), told, nil
}

// edsNamesLocked is the set of EDS names the clusters need, sorted.
func (c *Client) edsNamesLocked() []string {
	set := map[string]bool{}
	for _, cs := range c.clusters {
		if cs.EDS != "" {
			set[cs.EDS] = true
		}
	}
	return slices.Sorted(maps.Keys(set))
}

// onEndpoints applies an EDS response: each ClusterLoadAssignment it
// carries finishes the warming of the clusters it belongs to, which are
// told.
func (c *Client) onEndpoints(rs []*anypb.Any) error {
	told, err := c.applyEndpoints(rs)
	c.tell(told)
	return err
}

func (c *Client) applyEndpoints(rs []*anypb.Any) (told []Cluster, err error) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.edsSeen++
	for _, a := range rs {
		cla := new(endpointpb.ClusterLoadAssignment)
		if err := a.UnmarshalTo(cla); err != nil {
			return told, fmt.Errorf("envoysim: endpoints: %w", err)
		}
		for _, cs := range c.clusters {
			if cs.EDS == cla.GetClusterName() {
				cs.Endpoints = cla
				if cs.Warming {
					cs.Warming, cs.Usable = false, now
					told = append(told, cs.Cluster)
				}
			}
		}
	}
	c.notifyLocked()
	return told, nil
}

// edsName is the ClusterLoadAssignment an EDS cluster's endpoints come from.
func edsName(cl *clusterpb.Cluster) string {
	if cl.GetType() != clusterpb.Cluster_EDS {
		return ""
	}
	if s := cl.GetEdsClusterConfig().GetServiceName(); s != "" {
		return s
	}
	return cl.GetName()
}

// sotw is a SotW stream of either service, for requests and responses.
type sotw = grpc.BidiStreamingClient[discoverypb.DiscoveryRequest, discoverypb.DiscoveryResponse]

// streams are a client's CDS and EDS streams of one variant: one and the
// same on ADS, or a per-type stream each on one connection.
type streams[Req, Resp any] struct {
	c        *Client
	cds, eds grpc.BidiStreamingClient[Req, Resp]
	setNode  func(*Req, *corepb.Node)
	node     map[grpc.BidiStreamingClient[Req, Resp]]bool // the node was sent on the stream; guarded by the state's mu
}

func newStreams[Req, Resp any](c *Client, cds, eds grpc.BidiStreamingClient[Req, Resp], setNode func(*Req, *corepb.Node)) streams[Req, Resp] {
	return streams[Req, Resp]{c: c, cds: cds, eds: eds, setNode: setNode, node: map[grpc.BidiStreamingClient[Req, Resp]]bool{}}
}

// send sends r on st, with the node if it is the stream's first request.
func (s *streams[Req, Resp]) send(st grpc.BidiStreamingClient[Req, Resp], r *Req) error {
	if !s.node[st] {
		s.setNode(r, s.c.opts.Node)
		s.node[st] = true
	}
	if err := st.Send(r); err != nil {
		return fmt.Errorf("envoysim: send: %w", err)
	}
	return nil
}

// run reads the responses of both streams into handle until one fails,
// then ends the other.
func (s *streams[Req, Resp]) run(handle func(*Resp) error) error {
	recv := func(st grpc.BidiStreamingClient[Req, Resp]) error {
		for {
			resp, err := st.Recv()
			if err != nil {
				return err
			}
			if err := handle(resp); err != nil {
				return err
			}
		}
	}
	if s.cds == s.eds {
		return recv(s.cds)
	}
	errc := make(chan error, 2)
	go func() { errc <- recv(s.cds) }()
	go func() { errc <- recv(s.eds) }()
	err := <-errc
	s.c.cancel() // ends the other stream
	return errors.Join(err, <-errc)
}

// startSotW opens the SotW streams and subscribes clusters with the
// wildcard.
func (c *Client) startSotW(ctx context.Context) (func() error, error) {
	var cds, eds sotw
	var err error
	if c.opts.PerType {
		if cds, err = clustersvc.NewClusterDiscoveryServiceClient(c.opts.Conn).StreamClusters(ctx); err == nil {
			eds, err = endpointsvc.NewEndpointDiscoveryServiceClient(c.opts.Conn).StreamEndpoints(ctx)
		}
	} else {
		cds, err = discoverypb.NewAggregatedDiscoveryServiceClient(c.opts.Conn).StreamAggregatedResources(ctx)
		eds = cds
	}
	if err != nil {
		return nil, fmt.Errorf("envoysim: open: %w", err)
	}
	s := &sotwState{streams: newStreams(c, cds, eds, func(r *discoverypb.DiscoveryRequest, n *corepb.Node) { r.Node = n })}
	if err := s.send(cds, &discoverypb.DiscoveryRequest{TypeUrl: resourcev3.ClusterType}); err != nil {
		return nil, err
	}
	return func() error { return s.run(s.handle) }, nil
}

// sotwState is the SotW client's protocol state, owned by run's goroutines
// one response at a time (mu).
type sotwState struct {
	streams[discoverypb.DiscoveryRequest, discoverypb.DiscoveryResponse]

	mu         sync.Mutex
	edsNames   []string // the EDS subscription
	edsVersion string   // of the last EDS response accepted
	edsNonce   string   // of the last EDS response
	edsStarted bool
}

func (s *sotwState) handle(resp *discoverypb.DiscoveryResponse) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch resp.GetTypeUrl() {
	case resourcev3.ClusterType:
		names, err := s.c.onClusters(resp.GetResources(), nil, true)
		if err != nil {
			return err
		}
		// The cluster manager's EDS watches change under a paused EDS
		// subscription; resumed, it sends its request, identical to the
		// last when the names did not change. Then CDS is ACKed.
		if len(names) > 0 || s.edsStarted {
			s.edsStarted, s.edsNames = true, names
			if err := s.send(s.eds, &discoverypb.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: names,
				VersionInfo: s.edsVersion, ResponseNonce: s.edsNonce}); err != nil {
				return err
			}
		}
		return s.send(s.cds, &discoverypb.DiscoveryRequest{TypeUrl: resourcev3.ClusterType,
			VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()})
	case resourcev3.EndpointType:
		if err := s.c.onEndpoints(resp.GetResources()); err != nil {
			return err
		}
		s.edsVersion, s.edsNonce = resp.GetVersionInfo(), resp.GetNonce()
		return s.send(s.eds, &discoverypb.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: s.edsNames,
			VersionInfo: s.edsVersion, ResponseNonce: s.edsNonce})
	}
	return nil
}

// delta is an incremental stream of either service.
type delta = grpc.BidiStreamingClient[discoverypb.DeltaDiscoveryRequest, discoverypb.DeltaDiscoveryResponse]

func (c *Client) startDelta(ctx context.Context) (func() error, error) {
	var cds, eds delta
	var err error
	if c.opts.PerType {
		if cds, err = clustersvc.NewClusterDiscoveryServiceClient(c.opts.Conn).DeltaClusters(ctx); err == nil {
			eds, err = endpointsvc.NewEndpointDiscoveryServiceClient(c.opts.Conn).DeltaEndpoints(ctx)
		}
	} else {
		cds, err = discoverypb.NewAggregatedDiscoveryServiceClient(c.opts.Conn).DeltaAggregatedResources(ctx)
		eds = cds
	}
	if err != nil {
		return nil, fmt.Errorf("envoysim: open: %w", err)
	}
	s := &deltaState{streams: newStreams(c, cds, eds, func(r *discoverypb.DeltaDiscoveryRequest, n *corepb.Node) { r.Node = n }),
		watched: map[string]bool{}}
	if err := s.send(cds, &discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType,
		ResourceNamesSubscribe: []string{"*"}}); err != nil {
		return nil, err
	}
	return func() error { return s.run(s.handle) }, nil
}

// deltaState is the incremental client's protocol state.
type deltaState struct {
	streams[discoverypb.DeltaDiscoveryRequest, discoverypb.DeltaDiscoveryResponse]

	mu      sync.Mutex
	watched map[string]bool // the EDS names subscribed
}

func (s *deltaState) handle(resp *discoverypb.DeltaDiscoveryResponse) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var rs []*anypb.Any
	for _, r := range resp.GetResources() {
		if r.GetResource() != nil {
			rs = append(rs, r.GetResource())
		}
	}
	switch resp.GetTypeUrl() {
	case resourcev3.ClusterType:
		names, err := s.c.onClusters(rs, resp.GetRemovedResources(), false)
		if err != nil {
			return err
		}
		if err := s.resubscribe(names); err != nil {
			return err
		}
		return s.send(s.cds, &discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResponseNonce: resp.GetNonce()})
	case resourcev3.EndpointType:
		if err := s.c.onEndpoints(rs); err != nil {
			return err
		}
		return s.send(s.eds, &discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResponseNonce: resp.GetNonce()})
	}
	return nil
}

// resubscribe moves the EDS subscription to names: only what changed is
// sent, and nothing when nothing did (envoy#13009, envoy#47302).
func (s *deltaState) resubscribe(names []string) error {
	want := map[string]bool{}
	var sub, unsub []string
	for _, n := range names {
		want[n] = true
		if !s.watched[n] {
			sub = append(sub, n)
		}
	}
	for n := range s.watched {
		if !want[n] {
			unsub = append(unsub, n)
		}
	}
	if len(sub) == 0 && len(unsub) == 0 {
		return nil
	}
	slices.Sort(unsub)
	s.watched = want
	return s.send(s.eds, &discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType,
		ResourceNamesSubscribe: sub, ResourceNamesUnsubscribe: unsub})
}

// Counts are how many responses of each type the client was sent.
func (c *Client) Counts() (cds, eds int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cdsSeen, c.edsSeen
}
