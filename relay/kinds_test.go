package relay

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"testing"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statuspb "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/xdsrelay/xdsrelay/internal/envoysim"
	"github.com/xdsrelay/xdsrelay/internal/testcp"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

const overprovisioning = "envoy.lb.does_not_support_overprovisioning"

// kindHash keys a control plane's snapshots by the client's kind, as
// Consul keys by Envoy's version and any server by client features: the
// user agent with its version, and whether the client does without
// overprovisioning. gRPC clients are one kind whatever their version.
type kindHash struct{}

func (kindHash) ID(n *corepb.Node) string {
	ua := xds.UserAgent(n)
	if strings.HasPrefix(ua, "gRPC") {
		ua = "grpc"
	}
	if slices.Contains(n.GetClientFeatures(), overprovisioning) {
		ua += "+no-overprovisioning"
	}
	return ua
}

// envoyOf is the node of an Envoy of the given version, with features.
func envoyOf(id string, minor, patch uint32, features ...string) *corepb.Node {
	meta, _ := structpb.NewStruct(map[string]any{"build": id}) // differs per proxy
	return &corepb.Node{Id: id, Cluster: "mesh", UserAgentName: "envoy", ClientFeatures: features,
		UserAgentVersionType: &corepb.Node_UserAgentBuildVersion{UserAgentBuildVersion: &corepb.BuildVersion{
			Version: &typev3.SemanticVersion{MajorNumber: 1, MinorNumber: minor, Patch: patch}, Metadata: meta}}}
}

// usableEnvoy connects a simulated Envoy of node n to addr until the test
// ends, and waits for its cluster svc to be usable.
func usableEnvoy(t *testing.T, addr string, n *corepb.Node, delta bool) *envoysim.Client {
	t.Helper()
	sim := startSim(t, addr, envoysim.Options{Node: n, Delta: delta})
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := sim.WaitFor(ctx, envoysim.Usable("svc")); err != nil {
		t.Fatalf("%s (%s): %v", n.GetId(), xds.UserAgent(n), err)
	}
	return sim
}

// Clients of four kinds in one node.cluster, through one relay in front of
// one control plane that tailors its config by kind: each gets its own
// kind's endpoints, and the control plane sees each kind's user agent and
// features (with the relay's own) in the group's node.
func TestClientKindsKeptApart(t *testing.T) {
	cp := testcp.StartKeyed(t, kindHash{})
	grpcBackend := startBackend(t, "for-grpc")
	kinds := map[string]string{ // kind → the address its endpoints hold
		"envoy/1.36":                     "10.0.36.1:80",
		"envoy/1.36+no-overprovisioning": "10.0.36.2:80",
		"envoy/1.37":                     "10.0.37.1:80",
		"grpc+no-overprovisioning":       grpcBackend,
	}
	for kind, addr := range kinds {
		cp.Set(t, kind, "1", testcp.Listener("svc", "svc-route"), testcp.Route("svc-route", "svc"),
			testcp.Cluster("svc"), testcp.Endpoints("svc", addr))
	}
	r := startRelay(t, cp.Addr)

	envoys := map[string]*corepb.Node{
		"envoy/1.36":                     envoyOf("e-136", 36, 2),
		"envoy/1.36+no-overprovisioning": envoyOf("e-136-nop", 36, 2, overprovisioning),
		"envoy/1.37":                     envoyOf("e-137", 37, 0),
	}
	for kind, n := range envoys {
		sim := usableEnvoy(t, r.Addr(), n, true)
		got := sim.Clusters()["svc"].Endpoints.GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
		if want := kinds[kind]; got.GetAddress()+":80" != want {
			t.Errorf("%s got endpoints %v, want %s", kind, got, want)
		}
	}
	cc := grpcXDSClient(t, r.Addr(), "grpc-1", "mesh", "xds:///svc")
	rpcReaches(t, cc, "for-grpc", func() {})

	// What the control plane saw: one stream per kind, each under a node
	// that carries the kind, and the relay's own feature.
	seen := map[string]bool{}
	for _, n := range cp.Nodes() {
		seen[kindHash{}.ID(n)] = true
		if !slices.Contains(n.GetClientFeatures(), "xds.config.supports-resource-ttl") {
			t.Errorf("upstream node %s lacks the relay's own feature: %v", n.GetId(), n.GetClientFeatures())
		}
		if md := n.GetUserAgentBuildVersion().GetMetadata(); md != nil {
			t.Errorf("upstream node %s carries a proxy's build metadata %v", n.GetId(), md)
		}
	}
	for kind := range kinds {
		if !seen[kind] {
			t.Errorf("the control plane never saw kind %s (saw %v)", kind, seen)
		}
	}
	if len(cp.Nodes()) != len(kinds) {
		t.Errorf("%d upstream streams, want one per kind (%d)", len(cp.Nodes()), len(kinds))
	}

	// /debug/groups shows each group's kind.
	var groups []debugGroup
	getJSON(t, r, "/debug/groups", &groups)
	shown := map[string]bool{}
	for _, g := range groups {
		shown[g.UserAgent+" "+strings.Join(g.ClientFeatures, ",")] = true
	}
	for _, want := range []string{
		"envoy/1.36 xds.config.supports-resource-ttl",
		"envoy/1.36 " + overprovisioning + ",xds.config.supports-resource-ttl",
		"envoy/1.37 xds.config.supports-resource-ttl",
	} {
		if !shown[want] {
			t.Errorf("/debug/groups does not show %q: %v", want, shown)
		}
	}

	// CSDS shows each client's kind: its node as the client sent it.
	status, err := fetchStatus(t, r, &statuspb.ClientStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	inCSDS := map[string]*corepb.Node{}
	for _, c := range status.GetConfig() {
		inCSDS[c.GetNode().GetId()] = c.GetNode()
	}
	for kind, n := range envoys {
		got := inCSDS[n.GetId()]
		if xds.UserAgentPatch(got) != xds.UserAgentPatch(n) || !slices.Equal(got.GetClientFeatures(), n.GetClientFeatures()) {
			t.Errorf("%s: CSDS shows node %v", kind, got)
		}
	}
	if got := inCSDS["grpc-1"]; !strings.HasPrefix(xds.UserAgent(got), "gRPC Go/") {
		t.Errorf("the gRPC client: CSDS shows user agent %q", xds.UserAgent(got))
	}
}

// An explicit group_by without the kind fields merges them on purpose:
// one group, and the relay's own user agent upstream.
func TestClientKindsMergedOnPurpose(t *testing.T) {
	cp := testcp.StartKeyed(t, kindHash{})
	cp.Set(t, "xdsrelay", "1", testcp.Cluster("svc"), testcp.Endpoints("svc", "10.0.0.9:80"))
	r := startRelay(t, cp.Addr, func(c *Config) { c.Upstream.GroupBy = []string{"cluster"} })
	for _, n := range []*corepb.Node{envoyOf("a", 36, 2), envoyOf("b", 37, 0, overprovisioning)} {
		usableEnvoy(t, r.Addr(), n, false)
	}
	if nodes := cp.Nodes(); len(nodes) != 1 || nodes[0].GetUserAgentName() != "xdsrelay" {
		t.Fatalf("upstream nodes %v, want one with the relay's user agent", nodes)
	}
}

// A patch rollout does not split a fleet: Envoys 1.36.2 and 1.36.3 are one
// kind by default (user_agent is MAJOR.MINOR), one group and one upstream
// stream, whose node says 1.36 (patch 0); 1.37 is another. With
// user_agent_patch in group_by, each patch release is a kind of its own,
// presented with its whole version.
func TestPatchReleasesShareAGroup(t *testing.T) {
	for _, tc := range []struct {
		name    string
		groupBy []string
		streams int
	}{
		{"by default", nil, 2},
		{"user_agent_patch", []string{"cluster", xds.FieldUserAgentPatch, xds.FieldClientFeatures}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cp := testcp.Start(t)
			cp.Set(t, "mesh", "1", testcp.Listener("svc", "svc-route"), testcp.Route("svc-route", "svc"),
				testcp.Cluster("svc"), testcp.Endpoints("svc", "10.0.0.1:80"))
			r := startRelay(t, cp.Addr, func(c *Config) {
				if tc.groupBy != nil {
					c.Upstream.GroupBy = tc.groupBy
				}
			})
			for _, n := range []*corepb.Node{envoyOf("a", 36, 2), envoyOf("b", 36, 3), envoyOf("c", 37, 1)} {
				usableEnvoy(t, r.Addr(), n, true)
			}
			var seen []string
			for _, n := range cp.Nodes() {
				seen = append(seen, xds.UserAgentPatch(n))
			}
			slices.Sort(seen)
			want := []string{"envoy/1.36.0", "envoy/1.37.0"}
			if tc.groupBy != nil {
				want = []string{"envoy/1.36.2", "envoy/1.36.3", "envoy/1.37.1"}
			}
			if len(cp.Nodes()) != tc.streams || !slices.Equal(seen, want) {
				t.Errorf("upstream streams under %v, want %v", seen, want)
			}
		})
	}
}

// What the default group_by does not name it does not keep apart
// (docs/architecture.md, invariant 14): two clients of one cluster and
// kind that ask istiod for different generators share a group, and the
// control plane is sent no GENERATOR. With metadata.GENERATOR in
// group_by, each generator has its group and its node carries the value.
func TestGeneratorsApartOnlyWhenNamed(t *testing.T) {
	withGenerator := func(id, generator string) *corepb.Node {
		n := node(id, "c1")
		md, _ := structpb.NewStruct(map[string]any{"GENERATOR": generator})
		n.Metadata = md
		return n
	}
	for _, tc := range []struct {
		name       string
		groupBy    []string
		generators []string // as each group's upstream node shows it
	}{
		{"default", Default().Upstream.GroupBy, []string{""}},
		{"named", append(Default().Upstream.GroupBy, "metadata.GENERATOR"), []string{"grpc", "xds"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cp := testcp.Start(t)
			cp.Set(t, "c1", "1", testcp.Cluster("a"))
			r := startRelay(t, cp.Addr, func(c *Config) { c.Upstream.GroupBy = tc.groupBy })
			for _, n := range []*corepb.Node{withGenerator("one", "grpc"), withGenerator("two", "xds")} {
				s := openDelta(t, r.Addr())
				s.send(&discoverypb.DeltaDiscoveryRequest{Node: n, TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"a"}})
				s.recvWithin(wait)
			}
			var got []string
			for _, n := range cp.Nodes() {
				got = append(got, n.GetMetadata().GetFields()["GENERATOR"].GetStringValue())
			}
			slices.Sort(got)
			if !slices.Equal(got, tc.generators) {
				t.Fatalf("the control plane was sent GENERATOR %q, one per group; want %q", got, tc.generators)
			}
		})
	}
}

// patchHash keys a control plane's snapshots as one that reads versions as
// X.Y.Z does: the user agent with a version of exactly three numbers. Any
// other version keys "unparsed", for which nothing is set.
type patchHash struct{}

var xyz = regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+$`)

func (patchHash) ID(n *corepb.Node) string {
	if v := xds.UserAgentVersion(n); xyz.MatchString(v) {
		return n.GetUserAgentName() + "/" + v
	}
	return "unparsed"
}

// A control plane that keys its config on exact X.Y.Z versions serves a
// group of gRPC clients of one minor release: the group presents the
// version its clients sent as MAJOR.MINOR.0, as Envoy's build version is
// presented with patch 0. A real grpc-go xDS client reaches its backend,
// and a client of another patch release of that minor joins its group and
// is served the same; a pre-release presents MAJOR.MINOR alone, so it is
// never taken for the release.
func TestVersionKeyedControlPlaneServesAMinorGroup(t *testing.T) {
	m := regexp.MustCompile(`^([0-9]+)\.([0-9]+)\.`).FindStringSubmatch(grpc.Version)
	if m == nil {
		t.Fatalf("grpc.Version %q is not MAJOR.MINOR.PATCH", grpc.Version)
	}
	release := m[1] + "." + m[2] + ".0"
	cp := testcp.StartKeyed(t, patchHash{})
	backend := startBackend(t, "served-by-version")
	cp.Set(t, "gRPC Go/"+release, "1", testcp.Listener("svc", "svc-route"), testcp.Route("svc-route", "svc"),
		testcp.Cluster("svc"), testcp.Endpoints("svc", backend))
	cp.Set(t, "gRPC Go/1.86.0", "1", testcp.Cluster("svc"))
	r := startRelay(t, cp.Addr)

	cc := grpcXDSClient(t, r.Addr(), "grpc-1", "mesh", "xds:///svc")
	rpcReaches(t, cc, "served-by-version", func() {
		for _, n := range cp.Nodes() {
			t.Logf("the control plane was presented %s", xds.UserAgentPatch(n))
		}
	})

	// Another patch release of the same minor, with grpc-go's features: the
	// same group and stream.
	var features []string
	for _, f := range cp.Nodes()[0].GetClientFeatures() {
		if !slices.Contains(relayFeatures, f) {
			features = append(features, f)
		}
	}
	patched := &corepb.Node{Id: "grpc-2", Cluster: "mesh", UserAgentName: "gRPC Go", ClientFeatures: features,
		UserAgentVersionType: &corepb.Node_UserAgentVersion{UserAgentVersion: m[1] + "." + m[2] + ".7"}}
	s := openDelta(t, r.Addr())
	s.send(&discoverypb.DeltaDiscoveryRequest{Node: patched, TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"svc"}})
	if resp := recvAck(t, s, wait); len(resp.GetResources()) != 1 || resp.GetResources()[0].GetName() != "svc" {
		t.Fatalf("a %s client got %v, want Cluster svc", patched.GetUserAgentVersion(), resp)
	}

	// A pre-release is a kind of its own, presented cut to MAJOR.MINOR:
	// the control plane, which parses X.Y.Z, gives it nothing by version.
	dev := &corepb.Node{Id: "grpc-3", Cluster: "mesh", UserAgentName: "gRPC Go", ClientFeatures: features,
		UserAgentVersionType: &corepb.Node_UserAgentVersion{UserAgentVersion: "1.86.0-dev"}}
	d := openDelta(t, r.Addr())
	d.send(&discoverypb.DeltaDiscoveryRequest{Node: dev, TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"svc"}})
	presented := func() []string {
		var seen []string
		for _, n := range cp.Nodes() {
			seen = append(seen, xds.UserAgentPatch(n))
		}
		slices.Sort(seen)
		return slices.Compact(seen)
	}
	eventually(t, "a stream for the pre-release", func() bool { return len(presented()) == 2 })
	if got, want := presented(), []string{"gRPC Go/" + release, "gRPC Go/1.86"}; !slices.Equal(got, want) {
		t.Errorf("the control plane was presented %q, want %q", got, want)
	}
	// /debug/groups shows each group's kind as its key has it.
	var groups []debugGroup
	getJSON(t, r, "/debug/groups", &groups)
	var shown []string
	for _, g := range groups {
		shown = append(shown, g.UserAgent)
	}
	slices.Sort(shown)
	if want := []string{"gRPC Go/" + m[1] + "." + m[2], "gRPC Go/1.86.0-dev"}; !slices.Equal(shown, want) {
		t.Errorf("/debug/groups shows user agents %q, want %q", shown, want)
	}
}
