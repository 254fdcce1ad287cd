package relay

import (
	"context"
	"testing"
	"time"

	clusterpb "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointsvc "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/xdsrelay/xdsrelay/internal/envoysim"
	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// edsCluster is an EDS cluster over ADS; service names its endpoints
// (eds_cluster_config.service_name), its own name if empty. timeout tells
// one version from another.
func edsCluster(name, service string, timeout time.Duration) *clusterpb.Cluster {
	c := testcp.Cluster(name)
	c.EdsClusterConfig.ServiceName = service
	c.ConnectTimeout = durationpb.New(timeout)
	return c
}

// envoyVariants are the ways Envoy takes clusters and endpoints.
var envoyVariants = []struct {
	name           string
	delta, perType bool
}{
	{name: "sotw-ads"},
	{name: "delta-ads", delta: true},
	{name: "sotw-per-type", perType: true},
	{name: "delta-per-type", delta: true, perType: true},
}

func envoyNode(id string) *corepb.Node {
	return &corepb.Node{Id: id, Cluster: "c1", UserAgentName: "envoy",
		UserAgentVersionType: &corepb.Node_UserAgentBuildVersion{UserAgentBuildVersion: &corepb.BuildVersion{
			Version: &typev3.SemanticVersion{MajorNumber: 1, MinorNumber: 36, Patch: 2}}}}
}

// Envoy keeps a new or changed Cluster warming until its endpoints arrive
// again ("Resource warming"). Through the relay, in every variant, a
// changed cluster and a new cluster on endpoints the client already holds
// are usable at once, though the control plane (a LinearCache, which sends
// only what changed) sends no endpoints; a cluster without held endpoints
// costs no EDS response.
func TestEnvoyClustersWarmThroughRelay(t *testing.T) {
	for _, v := range envoyVariants {
		t.Run(v.name, func(t *testing.T) {
			cp := testcp.StartLinear(t)
			cp.Clusters.UpdateResource("a", edsCluster("a", "", time.Second))
			cp.Endpoints.UpdateResource("a", testcp.Endpoints("a", "127.0.0.1:1"))
			r := startRelay(t, cp.Addr)
			sim := startEnvoy(t, r.Addr(), v.delta, v.perType)
			waitWarmed(t, sim, "a", time.Time{})

			// A changed cluster whose endpoints did not change.
			before := time.Now()
			cp.Clusters.UpdateResource("a", edsCluster("a", "", 2*time.Second))
			waitWarmed(t, sim, "a", before)

			// A new cluster on endpoints the client holds (envoy#47302).
			before = time.Now()
			cp.Clusters.UpdateResource("b", edsCluster("b", "a", time.Second))
			waitWarmed(t, sim, "b", before)

			// A cluster that needs no endpoints sends none.
			_, eds := sim.Counts()
			cp.Clusters.UpdateResource("s", &clusterpb.Cluster{Name: "s", ConnectTimeout: durationpb.New(time.Second)})
			waitWarmed(t, sim, "s", time.Time{})
			time.Sleep(200 * time.Millisecond) // a window for a stray EDS response to show
			if _, after := sim.Counts(); after != eds {
				t.Errorf("a cluster without endpoints was followed by %d EDS responses", after-eds)
			}
		})
	}
}

// The same clients against the LinearCache directly stall: the changed
// cluster stays warming (until Envoy's initial_fetch_timeout, 15 s by
// default), as go-control-plane#245 reports. This is what the relay's
// warming spares them.
func TestEnvoyClustersStallOnLinearCache(t *testing.T) {
	for _, v := range envoyVariants[:2] {
		t.Run(v.name, func(t *testing.T) {
			cp := testcp.StartLinear(t)
			cp.Clusters.UpdateResource("a", edsCluster("a", "", time.Second))
			cp.Endpoints.UpdateResource("a", testcp.Endpoints("a", "127.0.0.1:1"))
			sim := startEnvoy(t, cp.Addr, v.delta, v.perType)
			waitWarmed(t, sim, "a", time.Time{})
			before := time.Now()
			cp.Clusters.UpdateResource("a", edsCluster("a", "", 2*time.Second))
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			if err := sim.WaitFor(ctx, func(cs map[string]envoysim.Cluster) bool { return cs["a"].Updated.After(before) }); err != nil {
				t.Fatal(err)
			}
			time.Sleep(200 * time.Millisecond) // a window for endpoints to come, as in the test above
			if cl := sim.Clusters()["a"]; !cl.Warming {
				t.Fatalf("the changed cluster warmed without the relay (its endpoints came again at %v): the simulated Envoy is not Envoy", cl.Usable)
			}
		})
	}
}

// A SotW EDS request that repeats the last one (same names, version and
// nonce, no error) is answered with the endpoints it names: Envoy sends it
// after a Cluster update, on whatever stream its EDS takes, and waits for
// them to finish warming the Cluster.
func TestSotWRepeatedEDSRequestIsAnswered(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("a"), testcp.Endpoints("a", "127.0.0.1:1"))
	r := startRelay(t, cp.Addr)
	st := newStream(t, endpointsvc.NewEndpointDiscoveryServiceClient(dial(t, r.Addr())).StreamEndpoints)
	req := &discoverypb.DiscoveryRequest{Node: envoyNode("e1"), TypeUrl: resourcev3.EndpointType, ResourceNames: []string{"a"}}
	st.send(req)
	first := st.recv()
	if len(first.GetResources()) != 1 {
		t.Fatalf("first response: %v", first)
	}
	ack := &discoverypb.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: []string{"a"},
		VersionInfo: first.GetVersionInfo(), ResponseNonce: first.GetNonce()}
	st.send(ack)
	st.quiet(100 * time.Millisecond) // an ACK is not answered
	st.send(ack)
	again := st.recv()
	if len(again.GetResources()) != 1 || again.GetNonce() == first.GetNonce() {
		t.Fatalf("the repeated request was answered with %v", again)
	}
	// Its ACK, with the new nonce, is an ACK again: no loop.
	st.send(&discoverypb.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: []string{"a"},
		VersionInfo: again.GetVersionInfo(), ResponseNonce: again.GetNonce()})
	st.quiet(200 * time.Millisecond)
}

// startEnvoy connects a simulated Envoy to addr until the test ends.
func startEnvoy(t *testing.T, addr string, delta, perType bool) *envoysim.Client {
	t.Helper()
	return startSim(t, addr, envoysim.Options{Node: envoyNode("envoy-1"), Delta: delta, PerType: perType})
}

// startSim connects a simulated Envoy with opts (Conn aside) to addr until
// the test ends.
func startSim(t *testing.T, addr string, opts envoysim.Options) *envoysim.Client {
	t.Helper()
	opts.Conn = dial(t, addr)
	sim, err := envoysim.Start(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	return sim
}

// waitWarmed waits for cluster name, updated after since, to finish
// warming, and checks that its endpoints came within a second of it: on
// the wire, right behind the Cluster.
func waitWarmed(t *testing.T, sim *envoysim.Client, name string, since time.Time) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	err := sim.WaitFor(ctx, func(cs map[string]envoysim.Cluster) bool {
		cl, ok := cs[name]
		return ok && cl.Updated.After(since) && !cl.Warming
	})
	if err != nil {
		t.Fatalf("cluster %s: %v", name, err)
	}
	if cl := sim.Clusters()[name]; cl.Usable.Sub(cl.Updated) > time.Second {
		t.Errorf("cluster %s warmed %v after it arrived", name, cl.Usable.Sub(cl.Updated))
	}
}
