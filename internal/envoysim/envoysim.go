// Package envoysim is an xDS client that behaves on the wire as Envoy's
// does for clusters and their endpoints, and, if asked, for listeners and
// their routes, warming included, so that tests and the load tool can
// prove what an Envoy fleet sees without an Envoy binary.
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
//   - ADS (one stream for every type), or a per-type stream each on one
//     connection.
//
// With Options.Listeners it also does as Envoy's LdsApiImpl and
// RdsRouteConfigSubscription do (listeners.go):
//   - Listeners are subscribed with the wildcard once the clusters of the
//     first CDS response are warmed (the cluster manager initializes before
//     the listener manager starts LDS). The RouteConfigurations that the
//     Listeners' HttpConnectionManagers load by RDS (rds.route_config_name,
//     of an API listener or of a filter chain) are subscribed on RDS: SotW,
//     the whole list with the version and nonce of the last RDS ACK; delta,
//     what changed. These requests go before the LDS ACK. A Listener whose
//     routes are inline (route_config) needs no RDS.
//   - A new or changed Listener warms until every RouteConfiguration it
//     loads by RDS is held ("Resource warming": one held from before
//     finishes it at once); while it warms, the version before it, if
//     any, serves.
//   - Routes are not warmed ("Eventual consistency considerations"): a
//     RouteConfiguration applies as it arrives. A Cluster that is changing
//     keeps serving its former version while the new one warms, as
//     Envoy's cluster manager keeps an active cluster beside a warming one;
//     a removed Cluster is gone at once.
//
// Responses apply in the order they arrive, one at a time. After each, the
// client records whether a serving Listener's routes name a Cluster it
// does not serve: a dangling reference (Client.Dangling, DanglingSeen).
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
	listenersvc "github.com/envoyproxy/go-control-plane/envoy/service/listener/v3"
	routesvc "github.com/envoyproxy/go-control-plane/envoy/service/route/v3"
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
	// PerType opens a stream of its own for each type on the connection
	// (CDS and EDS, and with Listeners LDS and RDS) instead of one ADS
	// stream.
	PerType bool
	// Listeners also subscribes Listeners with the wildcard, and the
	// RouteConfigurations they load by RDS.
	Listeners bool
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

	// guarded by mu
	mu        sync.Mutex
	clusters  map[string]*clusterState
	listeners map[string]*listenerState
	routes    map[string]*Route
	changed   chan struct{} // closed and replaced at every change
	cdsSeen   int           // CDS responses received
	edsSeen   int           // EDS responses received
	cdsInit   bool          // the first CDS response arrived
	dangling  []Dangling    // the dangling references held now
	seen      []Dangling    // every one that began, the first maxSeen
	seenTotal int           // how many began
}

type clusterState struct {
	Cluster
	raw []byte // the Cluster as received, to tell a change
	// serving: a version of the cluster finished warming and the cluster
	// was not removed since; Envoy serves it while a changed one warms.
	serving bool
}

// Start opens the client's streams and sends its first requests.
func Start(ctx context.Context, opts Options) (*Client, error) {
	if opts.Conn == nil || opts.Node == nil {
		return nil, errors.New("envoysim: Conn and Node are required")
	}
	ctx, cancel := context.WithCancel(ctx)
	c := &Client{opts: opts, cancel: cancel, done: make(chan struct{}), clusters: map[string]*clusterState{},
		listeners: map[string]*listenerState{}, routes: map[string]*Route{}, changed: make(chan struct{})}
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
	return c.WaitState(ctx, func(s State) bool { return cond(s.Clusters) })
}

// WaitState waits until cond holds of the client's state, or ctx ends.
func (c *Client) WaitState(ctx context.Context, cond func(State) bool) error {
	for {
		c.mu.Lock()
		ch := c.changed
		st := c.stateLocked()
		c.mu.Unlock()
		if cond(st) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("envoysim: %w; %v", ctx.Err(), c.describe())
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
	st := c.State()
	var b bytes.Buffer
	b.WriteString("clusters: ")
	for _, cl := range st.Clusters {
		fmt.Fprintf(&b, "%s(eds=%q warming=%v) ", cl.Name, cl.EDS, cl.Warming)
	}
	if c.opts.Listeners {
		b.WriteString("listeners: ")
		for _, l := range st.Listeners {
			fmt.Fprintf(&b, "%s(routes=%v warming=%v serving=%v) ", l.Name, l.Routes, l.Warming, l.Serving)
		}
		b.WriteString("routes: ")
		for _, r := range st.Routes {
			fmt.Fprintf(&b, "%s->%v ", r.Name, r.Clusters)
		}
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
		cs := &clusterState{Cluster: Cluster{Name: cl.GetName(), EDS: edsName(&cl), Updated: now}, raw: a.GetValue(),
			serving: old != nil && old.serving}
		if cs.EDS == "" {
			cs.Usable, cs.serving = now, true
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
	c.cdsInit = true
	c.changedLocked(now)
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
					cs.Warming, cs.Usable, cs.serving = false, now, true
					told = append(told, cs.Cluster)
				}
			}
		}
	}
	c.changedLocked(now)
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

// sotw is a SotW stream of any service, for requests and responses.
type sotw = grpc.BidiStreamingClient[discoverypb.DiscoveryRequest, discoverypb.DiscoveryResponse]

// streams are a client's streams of one variant, by type URL: one and the
// same ADS stream for every type, or a per-type stream each on one
// connection.
type streams[Req, Resp any] struct {
	c       *Client
	by      map[string]grpc.BidiStreamingClient[Req, Resp]
	setNode func(*Req, *corepb.Node)
	node    map[grpc.BidiStreamingClient[Req, Resp]]bool // the node was sent on the stream; guarded by the state's mu
}

// opener opens the stream of one type; ADS opens one stream for all.
type opener[Req, Resp any] func(typeURL string) (grpc.BidiStreamingClient[Req, Resp], error)

// openStreams opens the streams the client needs: clusters and endpoints,
// and with Options.Listeners listeners and routes.
func openStreams[Req, Resp any](c *Client, open opener[Req, Resp], setNode func(*Req, *corepb.Node)) (streams[Req, Resp], error) {
	s := streams[Req, Resp]{c: c, by: map[string]grpc.BidiStreamingClient[Req, Resp]{}, setNode: setNode,
		node: map[grpc.BidiStreamingClient[Req, Resp]]bool{}}
	types := []string{resourcev3.ClusterType, resourcev3.EndpointType}
	if c.opts.Listeners {
		types = append(types, resourcev3.ListenerType, resourcev3.RouteType)
	}
	var ads grpc.BidiStreamingClient[Req, Resp]
	for _, t := range types {
		if ads != nil {
			s.by[t] = ads
			continue
		}
		st, err := open(t)
		if err != nil {
			return s, fmt.Errorf("envoysim: open: %w", err)
		}
		s.by[t] = st
		if !c.opts.PerType {
			ads = st
		}
	}
	return s, nil
}

// send sends r on the stream of typeURL, with the node if it is the
// stream's first request.
func (s *streams[Req, Resp]) send(typeURL string, r *Req) error {
	st := s.by[typeURL]
	if !s.node[st] {
		s.setNode(r, s.c.opts.Node)
		s.node[st] = true
	}
	if err := st.Send(r); err != nil {
		return fmt.Errorf("envoysim: send: %w", err)
	}
	return nil
}

// run reads the responses of every stream into handle until one fails,
// then ends the others.
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
	var all []grpc.BidiStreamingClient[Req, Resp]
	for _, st := range s.by {
		if !slices.Contains(all, st) {
			all = append(all, st)
		}
	}
	if len(all) == 1 {
		return recv(all[0])
	}
	errc := make(chan error, len(all))
	for _, st := range all {
		go func() { errc <- recv(st) }()
	}
	errs := []error{<-errc}
	s.c.cancel() // ends the others
	for range len(all) - 1 {
		errs = append(errs, <-errc)
	}
	return errors.Join(errs...)
}

// startSotW opens the SotW streams and subscribes clusters with the
// wildcard.
func (c *Client) startSotW(ctx context.Context) (func() error, error) {
	open := func(typeURL string) (sotw, error) {
		if !c.opts.PerType {
			return discoverypb.NewAggregatedDiscoveryServiceClient(c.opts.Conn).StreamAggregatedResources(ctx)
		}
		switch typeURL {
		case resourcev3.ClusterType:
			return clustersvc.NewClusterDiscoveryServiceClient(c.opts.Conn).StreamClusters(ctx)
		case resourcev3.EndpointType:
			return endpointsvc.NewEndpointDiscoveryServiceClient(c.opts.Conn).StreamEndpoints(ctx)
		case resourcev3.ListenerType:
			return listenersvc.NewListenerDiscoveryServiceClient(c.opts.Conn).StreamListeners(ctx)
		}
		return routesvc.NewRouteDiscoveryServiceClient(c.opts.Conn).StreamRoutes(ctx)
	}
	sts, err := openStreams(c, open, func(r *discoverypb.DiscoveryRequest, n *corepb.Node) { r.Node = n })
	if err != nil {
		return nil, err
	}
	s := &sotwState{streams: sts, subs: map[string]*sotwSub{}}
	if err := s.send(resourcev3.ClusterType, &discoverypb.DiscoveryRequest{TypeUrl: resourcev3.ClusterType}); err != nil {
		return nil, err
	}
	return func() error { return s.run(s.handle) }, nil
}

// sotwState is the SotW client's protocol state, owned by run's goroutines
// one response at a time (mu).
type sotwState struct {
	streams[discoverypb.DiscoveryRequest, discoverypb.DiscoveryResponse]

	mu         sync.Mutex
	subs       map[string]*sotwSub // EDS's and RDS's, by type URL
	ldsStarted bool
}

// sotwSub is a SotW subscription by name (EDS, RDS).
type sotwSub struct {
	names   []string // subscribed
	version string   // of the last response accepted
	nonce   string   // of the last response
	started bool
}

func (s *sotwState) sub(typeURL string) *sotwSub {
	if s.subs[typeURL] == nil {
		s.subs[typeURL] = &sotwSub{}
	}
	return s.subs[typeURL]
}

// request sends the subscription of typeURL: its names, with the version
// and nonce of its last ACK.
func (s *sotwState) request(typeURL string) error {
	sub := s.sub(typeURL)
	sub.started = true
	return s.send(typeURL, &discoverypb.DiscoveryRequest{TypeUrl: typeURL, ResourceNames: sub.names,
		VersionInfo: sub.version, ResponseNonce: sub.nonce})
}

// startLDS subscribes Listeners with the wildcard once the cluster manager
// has initialized: the first CDS response arrived and no cluster warms.
func (s *sotwState) startLDS() error {
	if s.ldsStarted || !s.c.listenersDue() {
		return nil
	}
	s.ldsStarted = true
	return s.send(resourcev3.ListenerType, &discoverypb.DiscoveryRequest{TypeUrl: resourcev3.ListenerType})
}

func (s *sotwState) handle(resp *discoverypb.DiscoveryResponse) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	ack := &discoverypb.DiscoveryRequest{TypeUrl: resp.GetTypeUrl(), VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}
	switch resp.GetTypeUrl() {
	case resourcev3.ClusterType:
		names, err := s.c.onClusters(resp.GetResources(), nil, true)
		if err != nil {
			return err
		}
		// The cluster manager's EDS watches change under a paused EDS
		// subscription; resumed, it sends its request, identical to the
		// last when the names did not change. Then CDS is ACKed.
		if eds := s.sub(resourcev3.EndpointType); len(names) > 0 || eds.started {
			eds.names = names
			if err := s.request(resourcev3.EndpointType); err != nil {
				return err
			}
		}
		if err := s.send(resourcev3.ClusterType, ack); err != nil {
			return err
		}
		return s.startLDS()
	case resourcev3.EndpointType:
		if err := s.c.onEndpoints(resp.GetResources()); err != nil {
			return err
		}
		eds := s.sub(resourcev3.EndpointType)
		eds.version, eds.nonce = resp.GetVersionInfo(), resp.GetNonce()
		if err := s.request(resourcev3.EndpointType); err != nil {
			return err
		}
		return s.startLDS()
	case resourcev3.ListenerType:
		names, err := s.c.onListeners(resp.GetResources(), nil, true)
		if err != nil {
			return err
		}
		// LdsApiImpl pauses RDS while it applies Listeners: the RDS
		// request, if the names changed, goes before the LDS ACK.
		if err := s.resubscribe(resourcev3.RouteType, names); err != nil {
			return err
		}
		return s.send(resourcev3.ListenerType, ack)
	case resourcev3.RouteType:
		names, err := s.c.onRoutes(resp.GetResources())
		if err != nil {
			return err
		}
		rds := s.sub(resourcev3.RouteType)
		rds.names, rds.version, rds.nonce = names, resp.GetVersionInfo(), resp.GetNonce()
		return s.request(resourcev3.RouteType)
	}
	return nil
}

// resubscribe sends the subscription of typeURL if its names changed.
func (s *sotwState) resubscribe(typeURL string, names []string) error {
	sub := s.sub(typeURL)
	if slices.Equal(sub.names, names) || (len(names) == 0 && !sub.started) {
		return nil
	}
	sub.names = names
	return s.request(typeURL)
}

// delta is an incremental stream of any service.
type delta = grpc.BidiStreamingClient[discoverypb.DeltaDiscoveryRequest, discoverypb.DeltaDiscoveryResponse]

func (c *Client) startDelta(ctx context.Context) (func() error, error) {
	open := func(typeURL string) (delta, error) {
		if !c.opts.PerType {
			return discoverypb.NewAggregatedDiscoveryServiceClient(c.opts.Conn).DeltaAggregatedResources(ctx)
		}
		switch typeURL {
		case resourcev3.ClusterType:
			return clustersvc.NewClusterDiscoveryServiceClient(c.opts.Conn).DeltaClusters(ctx)
		case resourcev3.EndpointType:
			return endpointsvc.NewEndpointDiscoveryServiceClient(c.opts.Conn).DeltaEndpoints(ctx)
		case resourcev3.ListenerType:
			return listenersvc.NewListenerDiscoveryServiceClient(c.opts.Conn).DeltaListeners(ctx)
		}
		return routesvc.NewRouteDiscoveryServiceClient(c.opts.Conn).DeltaRoutes(ctx)
	}
	sts, err := openStreams(c, open, func(r *discoverypb.DeltaDiscoveryRequest, n *corepb.Node) { r.Node = n })
	if err != nil {
		return nil, err
	}
	s := &deltaState{streams: sts, watched: map[string]map[string]bool{}}
	if err := s.send(resourcev3.ClusterType, &discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType,
		ResourceNamesSubscribe: []string{"*"}}); err != nil {
		return nil, err
	}
	return func() error { return s.run(s.handle) }, nil
}

// deltaState is the incremental client's protocol state.
type deltaState struct {
	streams[discoverypb.DeltaDiscoveryRequest, discoverypb.DeltaDiscoveryResponse]

	mu         sync.Mutex
	watched    map[string]map[string]bool // the EDS and RDS names subscribed, by type URL
	ldsStarted bool
}

// startLDS subscribes Listeners with the wildcard once the cluster manager
// has initialized.
func (s *deltaState) startLDS() error {
	if s.ldsStarted || !s.c.listenersDue() {
		return nil
	}
	s.ldsStarted = true
	return s.send(resourcev3.ListenerType, &discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.ListenerType,
		ResourceNamesSubscribe: []string{"*"}})
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
	ack := &discoverypb.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()}
	switch resp.GetTypeUrl() {
	case resourcev3.ClusterType:
		names, err := s.c.onClusters(rs, resp.GetRemovedResources(), false)
		if err != nil {
			return err
		}
		if err := s.resubscribe(resourcev3.EndpointType, names, nil); err != nil {
			return err
		}
		if err := s.send(resourcev3.ClusterType, ack); err != nil {
			return err
		}
		return s.startLDS()
	case resourcev3.EndpointType:
		if err := s.c.onEndpoints(rs); err != nil {
			return err
		}
		if err := s.send(resourcev3.EndpointType, ack); err != nil {
			return err
		}
		return s.startLDS()
	case resourcev3.ListenerType:
		names, err := s.c.onListeners(rs, resp.GetRemovedResources(), false)
		if err != nil {
			return err
		}
		if err := s.resubscribe(resourcev3.RouteType, names, nil); err != nil {
			return err
		}
		return s.send(resourcev3.ListenerType, ack)
	case resourcev3.RouteType:
		// A delta RDS removal is ignored, as Envoy's
		// RdsRouteConfigSubscription ignores it (with an error log).
		names, err := s.c.onRoutes(rs)
		if err != nil {
			return err
		}
		// What a Listener that finished warming no longer needs is
		// unsubscribed with the ACK.
		return s.resubscribe(resourcev3.RouteType, names, ack)
	}
	return nil
}

// resubscribe moves the subscription of typeURL to names: only what
// changed is sent, and nothing when nothing did (envoy#13009,
// envoy#47302), unless the request is also an ACK (ack non-nil).
func (s *deltaState) resubscribe(typeURL string, names []string, ack *discoverypb.DeltaDiscoveryRequest) error {
	watched := s.watched[typeURL]
	want := map[string]bool{}
	var sub, unsub []string
	for _, n := range names {
		want[n] = true
		if !watched[n] {
			sub = append(sub, n)
		}
	}
	for n := range watched {
		if !want[n] {
			unsub = append(unsub, n)
		}
	}
	if len(sub) == 0 && len(unsub) == 0 && ack == nil {
		return nil
	}
	slices.Sort(unsub)
	s.watched[typeURL] = want
	req := ack
	if req == nil {
		req = &discoverypb.DeltaDiscoveryRequest{TypeUrl: typeURL}
	}
	req.ResourceNamesSubscribe, req.ResourceNamesUnsubscribe = sub, unsub
	return s.send(typeURL, req)
}

// Counts are how many responses of each type the client was sent.
func (c *Client) Counts() (cds, eds int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cdsSeen, c.edsSeen
}
