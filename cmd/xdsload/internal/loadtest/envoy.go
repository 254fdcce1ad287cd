package loadtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"sync"
	"text/tabwriter"
	"time"

	clusterpb "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointpb "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/xdsrelay/xdsrelay/internal/envoysim"
	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// EnvoyConfig is a run of Envoy-behaving clients (internal/envoysim):
// each subscribes to every cluster with the wildcard and to the endpoints
// of each, and warms a new or changed cluster until its endpoints arrive
// again, as Envoy does. The control plane serves Clusters EDS clusters
// cluster-0..K-1, each with a ClusterLoadAssignment of the same name, from
// go-control-plane's LinearCache (which sends only what changed); an update
// changes one cluster and not its endpoints. What is measured is how long a
// cluster change takes to make the changed cluster usable on every client.
type EnvoyConfig struct {
	Target         string  // the xDS server; empty: the control plane, or the relay with Relay
	ServeCP        string  // the control plane's address
	Relay          bool    // start xdsrelay in this process in front of the control plane
	Clients        int     // simulated Envoys
	StreamsPerConn int     // clients per gRPC connection
	Rate           float64 // clients started a second; 0: no limit
	Delta          bool    // DELTA_GRPC, else GRPC (SotW)
	PerType        bool    // per-type CDS and EDS streams instead of ADS
	Clusters       int     // clusters served
	Endpoints      int     // endpoints per ClusterLoadAssignment
	Updates        int     // cluster changes published
	UpdateEvery    time.Duration
	// InitialFetchTimeout is Envoy's initial_fetch_timeout: a cluster still
	// warming this long after it arrived is counted as stalled, and as
	// usable then (on stale or no endpoints), as Envoy would use it.
	InitialFetchTimeout time.Duration
	PID                 int // the server process whose CPU is sampled per change; 0: none
	Timeout             time.Duration
	Progress            io.Writer
}

// EnvoyResult is what an Envoy run measured.
type EnvoyResult struct {
	Setup      string        `json:"setup"`
	Clients    int           `json:"clients"`
	Variant    string        `json:"variant"`
	Configured time.Duration `json:"configured_ns"` // until every client had every cluster usable
	Updates    []EnvoyUpdate `json:"updates"`
	// CPUPerChange is the server's CPU per cluster change (PID), over the
	// updates; zero without a PID.
	CPUPerChange time.Duration `json:"cpu_per_change_ns"`
}

// EnvoyUpdate is one cluster change, over the clients.
type EnvoyUpdate struct {
	Cluster string `json:"cluster"`
	// Received is the fan-out of the Cluster: from its publication to its
	// arrival, p50 and max over the clients.
	ReceivedP50, ReceivedMax time.Duration
	// Usable is from its publication to the end of its warming (or to
	// InitialFetchTimeout after its arrival for a stalled client), p50,
	// p99 and max over the clients.
	UsableP50, UsableP99, UsableMax time.Duration
	Within1s                        int // clients on which it was usable within a second of its arrival
	Stalled                         int // clients on which it still warmed after InitialFetchTimeout
}

func envoyCluster(i int, timeout time.Duration) *clusterpb.Cluster {
	return &clusterpb.Cluster{
		Name:                 "cluster-" + strconv.Itoa(i),
		ClusterDiscoveryType: &clusterpb.Cluster_Type{Type: clusterpb.Cluster_EDS},
		EdsClusterConfig: &clusterpb.Cluster_EdsClusterConfig{EdsConfig: &corepb.ConfigSource{
			ResourceApiVersion: corepb.ApiVersion_V3, ConfigSourceSpecifier: &corepb.ConfigSource_Ads{Ads: &corepb.AggregatedConfigSource{}}}},
		ConnectTimeout: durationpb.New(timeout),
	}
}

func envoyEndpoints(i, n int) *endpointpb.ClusterLoadAssignment {
	cla := &endpointpb.ClusterLoadAssignment{ClusterName: "cluster-" + strconv.Itoa(i),
		Endpoints: []*endpointpb.LocalityLbEndpoints{{Locality: &corepb.Locality{Zone: "z"}}}}
	for e := range n {
		cla.Endpoints[0].LbEndpoints = append(cla.Endpoints[0].LbEndpoints, &endpointpb.LbEndpoint{
			HostIdentifier: &endpointpb.LbEndpoint_Endpoint{Endpoint: &endpointpb.Endpoint{
				Address: &corepb.Address{Address: &corepb.Address_SocketAddress{SocketAddress: &corepb.SocketAddress{
					Address: "127.0.0.1", PortSpecifier: &corepb.SocketAddress_PortValue{PortValue: uint32(10000 + e)}}}}}}})
	}
	return cla
}

// startEnvoyPlane serves the clusters and endpoints on cfg.ServeCP.
func startEnvoyPlane(cfg *EnvoyConfig) (*testcp.Linear, error) {
	p, err := testcp.ServeLinear(cfg.ServeCP, grpc.MaxConcurrentStreams(1<<20))
	if err != nil {
		return nil, fmt.Errorf("control plane: %w", err)
	}
	for i := range cfg.Clusters {
		name := "cluster-" + strconv.Itoa(i)
		err = errors.Join(p.Clusters.UpdateResource(name, envoyCluster(i, time.Second)),
			p.Endpoints.UpdateResource(name, envoyEndpoints(i, cfg.Endpoints)))
		if err != nil {
			p.Stop()
			return nil, err
		}
	}
	return p, nil
}

// envoyTracker collects the clients' reports on the cluster being changed.
type envoyTracker struct {
	mu       sync.Mutex
	name     string    // the cluster changed, "" before the first update
	since    time.Time // when it was published
	received []time.Duration
	usable   []time.Duration
	warmed   []time.Duration // from arrival to the end of warming
	done     int             // clients that reported it usable
	all      int             // clients that have every cluster usable
	clusters int             // clusters served
	usableOf []map[string]bool
	changed  chan struct{} // capacity 1
}

func (tr *envoyTracker) report(i int, cl envoysim.Cluster) {
	tr.mu.Lock()
	if !cl.Warming && !tr.usableOf[i][cl.Name] {
		tr.usableOf[i][cl.Name] = true
		if len(tr.usableOf[i]) == tr.clusters {
			tr.all++
		}
	}
	if tr.name == cl.Name && cl.Updated.After(tr.since) {
		if cl.Warming {
			tr.received[i] = cl.Updated.Sub(tr.since)
		} else if tr.usable[i] < 0 {
			tr.received[i], tr.usable[i], tr.warmed[i] = cl.Updated.Sub(tr.since), cl.Usable.Sub(tr.since), cl.Usable.Sub(cl.Updated)
			tr.done++
		}
	}
	tr.mu.Unlock()
	select {
	case tr.changed <- struct{}{}:
	default:
	}
}

// Validate reports the first problem with cfg.
func (cfg *EnvoyConfig) Validate() error {
	switch {
	case cfg.ServeCP == "":
		return errors.New("envoy: the clusters come from the tool's control plane: give serve-cp")
	case cfg.Clients < 1 || cfg.Clusters < 1 || cfg.StreamsPerConn < 1:
		return errors.New("envoy: clients, resources (clusters) and streams-per-conn must be at least 1")
	case cfg.Updates < 0 || cfg.UpdateEvery < 0 || cfg.InitialFetchTimeout < 0 || cfg.Rate < 0:
		return errors.New("envoy: updates, update-every, initial-fetch-timeout and rate must not be negative")
	case cfg.Timeout <= 0:
		return errors.New("envoy: timeout must be positive")
	}
	return nil
}

// RunEnvoy runs Envoy-behaving clients against the target (see EnvoyConfig).
func RunEnvoy(ctx context.Context, cfg EnvoyConfig) (*EnvoyResult, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	plane, err := startEnvoyPlane(&cfg)
	if err != nil {
		return nil, err
	}
	defer plane.Stop()
	res := &EnvoyResult{Setup: "go-control-plane linear", Clients: cfg.Clients, Variant: VariantSotW}
	if cfg.Delta {
		res.Variant = VariantDelta
	}
	target := cfg.Target
	switch {
	case cfg.Relay:
		r, err := startRelay(plane.Addr, &Config{Progress: cfg.Progress})
		if err != nil {
			return nil, err
		}
		defer stopRelay(r)
		target, res.Setup = r.Addr(), "xdsrelay (in process)"
	case target == "":
		target = plane.Addr
	default:
		res.Setup = "target " + target
	}
	tr := &envoyTracker{changed: make(chan struct{}, 1), received: make([]time.Duration, cfg.Clients), clusters: cfg.Clusters,
		usable: make([]time.Duration, cfg.Clients), warmed: make([]time.Duration, cfg.Clients), usableOf: make([]map[string]bool, cfg.Clients)}
	start := time.Now()
	clients, conns, err := startEnvoys(ctx, &cfg, target, tr)
	defer func() {
		for _, c := range clients {
			c.Close()
		}
		for _, cc := range conns {
			cc.Close()
		}
	}()
	if err != nil {
		return nil, err
	}
	if err := tr.wait(ctx, func() bool { return tr.all == cfg.Clients }); err != nil {
		return nil, fmt.Errorf("envoy: first config: %w", err)
	}
	res.Configured = time.Since(start)
	cpu0 := sampleCPU(cfg.PID)
	for u := range cfg.Updates {
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(cfg.UpdateEvery):
		}
		up, err := publishEnvoyUpdate(ctx, &cfg, plane, tr, u)
		if err != nil {
			return res, err
		}
		res.Updates = append(res.Updates, up)
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, "update %d (%s): usable p50 %v max %v, stalled %d\n", u+1, up.Cluster, up.UsableP50, up.UsableMax, up.Stalled)
		}
	}
	if n := len(res.Updates); n > 0 && cfg.PID > 0 {
		res.CPUPerChange = (sampleCPU(cfg.PID) - cpu0) / time.Duration(n)
	}
	return res, nil
}

// startEnvoys starts the clients, StreamsPerConn to a connection, at most
// Rate a second.
func startEnvoys(ctx context.Context, cfg *EnvoyConfig, target string, tr *envoyTracker) ([]*envoysim.Client, []*grpc.ClientConn, error) {
	var clients []*envoysim.Client
	var conns []*grpc.ClientConn
	var tick <-chan time.Time
	if cfg.Rate > 0 {
		t := time.NewTicker(time.Duration(float64(time.Second) / cfg.Rate))
		defer t.Stop()
		tick = t.C
	}
	for i := range cfg.Clients {
		if tick != nil {
			select {
			case <-tick:
			case <-ctx.Done():
				return clients, conns, ctx.Err()
			}
		}
		if i%cfg.StreamsPerConn == 0 {
			cc, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				return clients, conns, err
			}
			conns = append(conns, cc)
		}
		tr.usableOf[i] = map[string]bool{}
		node := &corepb.Node{Id: "envoy-" + strconv.Itoa(i), Cluster: "load", UserAgentName: "envoy",
			UserAgentVersionType: &corepb.Node_UserAgentBuildVersion{UserAgentBuildVersion: &corepb.BuildVersion{
				Version: &typev3.SemanticVersion{MajorNumber: 1, MinorNumber: 36}}}}
		c, err := envoysim.Start(ctx, envoysim.Options{Conn: conns[len(conns)-1], Node: node, Delta: cfg.Delta, PerType: cfg.PerType,
			OnCluster: func(cl envoysim.Cluster) { tr.report(i, cl) }})
		if err != nil {
			return clients, conns, err
		}
		clients = append(clients, c)
	}
	return clients, conns, nil
}

// wait waits until cond holds (under tr.mu) or ctx ends.
func (tr *envoyTracker) wait(ctx context.Context, cond func() bool) error {
	t := time.NewTicker(100 * time.Millisecond) // reports can coalesce in changed
	defer t.Stop()
	for {
		tr.mu.Lock()
		ok := cond()
		tr.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tr.changed:
		case <-t.C:
		}
	}
}

// publishEnvoyUpdate changes cluster u%Clusters and waits until it is
// usable on every client, or InitialFetchTimeout past its arrival.
func publishEnvoyUpdate(ctx context.Context, cfg *EnvoyConfig, plane *testcp.Linear, tr *envoyTracker, u int) (EnvoyUpdate, error) {
	i := u % cfg.Clusters
	name := "cluster-" + strconv.Itoa(i)
	tr.mu.Lock()
	tr.name, tr.since, tr.done = name, time.Now(), 0
	for k := range tr.usable {
		tr.received[k], tr.usable[k], tr.warmed[k] = -1, -1, -1
	}
	tr.mu.Unlock()
	if err := plane.Clusters.UpdateResource(name, envoyCluster(i, time.Second+time.Duration(u+1)*time.Millisecond)); err != nil {
		return EnvoyUpdate{}, err
	}
	stall := ctx
	if cfg.InitialFetchTimeout > 0 {
		var cancel context.CancelFunc
		stall, cancel = context.WithTimeout(ctx, cfg.InitialFetchTimeout+time.Second)
		defer cancel()
	}
	err := tr.wait(stall, func() bool { return tr.done == cfg.Clients })
	if err != nil && ctx.Err() != nil {
		return EnvoyUpdate{}, fmt.Errorf("envoy: update %d: %w", u+1, ctx.Err())
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	up := EnvoyUpdate{Cluster: name}
	var received, usable []time.Duration
	for k := range cfg.Clients {
		r, us, w := tr.received[k], tr.usable[k], tr.warmed[k]
		if r >= 0 {
			received = append(received, r)
		}
		switch {
		case us >= 0 && (cfg.InitialFetchTimeout == 0 || w <= cfg.InitialFetchTimeout):
			usable = append(usable, us)
			if w <= time.Second {
				up.Within1s++
			}
		case r >= 0:
			up.Stalled++
			usable = append(usable, r+cfg.InitialFetchTimeout)
		}
	}
	if len(received) < cfg.Clients {
		return up, fmt.Errorf("envoy: update %d: %d of %d clients never received %s", u+1, cfg.Clients-len(received), cfg.Clients, name)
	}
	slices.Sort(received)
	slices.Sort(usable)
	up.ReceivedP50, up.ReceivedMax = received[len(received)/2], received[len(received)-1]
	up.UsableP50, up.UsableP99, up.UsableMax = usable[len(usable)/2], usable[len(usable)*99/100], usable[len(usable)-1]
	return up, nil
}

// WriteTable prints the run, a row per update.
func (r *EnvoyResult) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "%s, %d Envoy-behaving clients (%s), every cluster usable after %v\n", r.Setup, r.Clients, r.Variant, r.Configured.Round(time.Millisecond))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "update\tcluster\treceived p50\treceived max\tusable p50\tusable p99\tusable max\twithin 1s\tstalled")
	for i, u := range r.Updates {
		fmt.Fprintf(tw, "%d\t%s\t%v\t%v\t%v\t%v\t%v\t%d\t%d\n", i+1, u.Cluster, round(u.ReceivedP50), round(u.ReceivedMax),
			round(u.UsableP50), round(u.UsableP99), round(u.UsableMax), u.Within1s, u.Stalled)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if r.CPUPerChange > 0 {
		fmt.Fprintf(w, "server CPU per cluster change: %v\n", r.CPUPerChange)
	}
	return nil
}

func round(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond)
	}
	return d
}
