package relay

import (
	"slices"
	"strings"
	"testing"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlspb "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// The node the control plane sees is the group's: its group_by fields as
// clients sent them, the configured id, metadata and user agent; nothing
// else of the client that came first (its id, its other metadata, its user
// agent) reaches the control plane.
func TestUpstreamNodeIsTheGroups(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("one"))
	r := startRelay(t, cp.Addr, func(c *Config) {
		c.Upstream.GroupBy = []string{"cluster", "metadata.team"}
		c.Upstream.Node.ID = "relay-{cluster}-{metadata.team}"
		c.Upstream.Node.Metadata = map[string]string{"region": "eu-1"}
		c.Upstream.Node.UserAgentVersion = "v9"
	})
	meta, _ := structpb.NewStruct(map[string]any{"team": "pay", "secret": "client-only"})
	first := &corepb.Node{Id: "first-client", Cluster: "c1", Metadata: meta, UserAgentName: "envoy",
		ClientFeatures: []string{"envoy.lb.does_not_support_overprovisioning"}}
	s := openDelta(t, r.Addr())
	s.send(&discoverypb.DeltaDiscoveryRequest{Node: first, TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"one"}})
	if got := deltaNames(s.recv()); !slices.Equal(got, []string{"one"}) {
		t.Fatalf("got %v", got)
	}
	nodes := cp.Nodes()
	if len(nodes) != 1 {
		t.Fatalf("%d upstream nodes, want 1", len(nodes))
	}
	n := nodes[0]
	md := n.GetMetadata().GetFields()
	switch {
	case n.GetId() != "relay-c1-pay":
		t.Errorf("id %q, want relay-c1-pay", n.GetId())
	case n.GetCluster() != "c1":
		t.Errorf("cluster %q", n.GetCluster())
	case md["team"].GetStringValue() != "pay" || md["region"].GetStringValue() != "eu-1" || md["secret"] != nil:
		t.Errorf("metadata %v: want team and region only", md)
	case n.GetUserAgentName() != "xdsrelay" || n.GetUserAgentVersion() != "v9":
		t.Errorf("user agent %q %q", n.GetUserAgentName(), n.GetUserAgentVersion())
	case !slices.Equal(n.GetClientFeatures(), []string{"xds.config.supports-resource-ttl"}):
		t.Errorf("client features %v", n.GetClientFeatures())
	}
}

func TestNodeIDTemplateIsChecked(t *testing.T) {
	for tmpl, ok := range map[string]bool{
		DefaultNodeID: true, "{cluster}": true, "{id}": false, "{nope}": false, "": false, "a{cluster": false,
	} {
		cfg := Default()
		cfg.Upstream.Node.ID = tmpl
		if err := cfg.Validate(); (err == nil) != ok {
			t.Errorf("%q: %v", tmpl, err)
		}
	}
}

// A group keyed by node id is restored from a warm-restart file under the
// same key: the file keeps the clients' group_by fields, not the node
// presented upstream (whose id is the template's).
func TestKeyNodeKeepsTheGroupKey(t *testing.T) {
	groupBy := []string{"id", "cluster"}
	client := &corepb.Node{Id: "sidecar-1", Cluster: "c1", UserAgentName: "envoy"}
	saved := keyNode(groupBy, client)
	if got, want := GroupKey(saved, groupBy), GroupKey(client, groupBy); got != want {
		t.Fatalf("restored key %q, want %q", got, want)
	}
	if saved.GetUserAgentName() != "" {
		t.Errorf("the saved node holds more than the group's fields: %v", saved)
	}
}

// With the kind fields in group_by (the default), the group's node carries
// the clients' user agent (Envoy's semantic version without its build
// metadata) and their features with the relay's own, sorted; the saved key
// node restores the same key.
func TestUpstreamNodeCarriesTheKind(t *testing.T) {
	cfg := Default()
	client := envoyOf("sidecar-1", 36, 2, "z.feature", overprovisioning, "z.feature")
	key := GroupKey(client, cfg.Upstream.GroupBy)
	n := groupNode(&cfg, "host", key, client)
	if n.GetUserAgentName() != "envoy" || n.GetUserAgentBuildVersion().GetVersion().GetMinorNumber() != 36 ||
		n.GetUserAgentBuildVersion().GetVersion().GetPatch() != 0 ||
		n.GetUserAgentBuildVersion().GetMetadata() != nil {
		t.Errorf("user agent %q %v", n.GetUserAgentName(), n.GetUserAgentBuildVersion())
	}
	if want := []string{overprovisioning, "xds.config.supports-resource-ttl", "z.feature"}; !slices.Equal(n.GetClientFeatures(), want) {
		t.Errorf("features %v, want %v", n.GetClientFeatures(), want)
	}
	if got := GroupKey(keyNode(cfg.Upstream.GroupBy, client), cfg.Upstream.GroupBy); got != key {
		t.Errorf("restored key %q, want %q", got, key)
	}
}

// A gRPC client's version string is presented as the kind's: a dotted
// numeric one as MAJOR.MINOR.0, another cut to MAJOR.MINOR. The saved key
// node restores the same key and presents the same, whichever client of
// the group it was saved from, and a key node saved with the version cut
// (by an earlier release) restores the key of that minor's clients.
func TestUpstreamNodePresentsTheKindsVersion(t *testing.T) {
	cfg := Default()
	grpc := func(v string) *corepb.Node {
		return &corepb.Node{Cluster: "c", UserAgentName: "gRPC Go", UserAgentVersionType: &corepb.Node_UserAgentVersion{UserAgentVersion: v}}
	}
	for _, tc := range []struct{ version, presented string }{
		{"1.85.0", "1.85.0"},
		{"1.85.3", "1.85.0"},
		{"1.85", "1.85.0"},
		{"1.86.0-dev", "1.86"},
		{"v2", "v2"},
	} {
		client := grpc(tc.version)
		key := GroupKey(client, cfg.Upstream.GroupBy)
		n := groupNode(&cfg, "host", key, client)
		if n.GetUserAgentVersion() != tc.presented || n.GetUserAgentName() != "gRPC Go" {
			t.Errorf("%s: presented %q %q, want %q", tc.version, n.GetUserAgentName(), n.GetUserAgentVersion(), tc.presented)
		}
		saved := keyNode(cfg.Upstream.GroupBy, client)
		if got := GroupKey(saved, cfg.Upstream.GroupBy); got != key {
			t.Errorf("%s: restored key %q, want %q", tc.version, got, key)
		}
		if got := groupNode(&cfg, "host", key, saved).GetUserAgentVersion(); got != tc.presented {
			t.Errorf("%s: restored group presents %q, want %q", tc.version, got, tc.presented)
		}
	}
	if GroupKey(grpc("1.86.0-dev"), cfg.Upstream.GroupBy) == GroupKey(grpc("1.86.1"), cfg.Upstream.GroupBy) {
		t.Error("a pre-release and a release of one minor share a group, which presents one version for both")
	}
	if got, want := GroupKey(grpc("1.85"), cfg.Upstream.GroupBy), GroupKey(grpc("1.85.3"), cfg.Upstream.GroupBy); got != want {
		t.Errorf("a key node saved with the version cut restores %q, want the minor's key %q", got, want)
	}
}

// Each control plane sees the group's node from its own upstream's node.*
// keys (docs/control-planes.md, "What each control plane sees"): two
// control planes, each keyed by node id, answer only the node they are
// configured for, and each is sent its own id and metadata, never the
// other's.
func TestEachUpstreamSeesItsOwnNode(t *testing.T) {
	def, secrets := testcp.StartKeyed(t, cachev3.IDHash{}), testcp.StartKeyed(t, cachev3.IDHash{})
	def.Set(t, "main-c1", "1", testcp.Cluster("a"))
	secrets.Set(t, "vault-c1", "1", &tlspb.Secret{Name: "cert"})
	r := startRelay(t, def.Addr, withUpstream("secrets", secrets.Addr, []string{resourcev3.SecretType}, nil), func(c *Config) {
		c.Upstream.GroupBy = []string{"cluster"} // the user agent is the relay's
		c.Upstream.Node.ID = "main-{cluster}"
		c.Upstream.Node.Metadata = map[string]string{"plane": "main"}
		u := &c.Upstreams[0]
		u.Node.ID = "vault-{cluster}"
		u.Node.Metadata = map[string]string{"plane": "vault"}
		u.Node.UserAgentName = "xdsrelay-secrets"
	})
	s := openDelta(t, r.Addr())
	s.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "c1"), TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"a"}})
	if got := deltaNames(s.recvWithin(wait)); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("cluster: %v", got)
	}
	s.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.SecretType, ResourceNamesSubscribe: []string{"cert"}})
	if got := deltaNames(s.recvWithin(wait)); !slices.Equal(got, []string{"cert"}) {
		t.Fatalf("secret: %v (the secrets control plane answers node vault-c1 only)", got)
	}
	for _, c := range []struct {
		cp                   *testcp.ControlPlane
		id, plane, userAgent string
	}{{def, "main-c1", "main", "xdsrelay"}, {secrets, "vault-c1", "vault", "xdsrelay-secrets"}} {
		nodes := c.cp.Nodes()
		if len(nodes) != 1 {
			t.Fatalf("%s: %d nodes sent, want 1", c.id, len(nodes))
		}
		n := nodes[0]
		if n.GetId() != c.id || n.GetMetadata().GetFields()["plane"].GetStringValue() != c.plane ||
			n.GetUserAgentName() != c.userAgent || n.GetCluster() != "c1" {
			t.Errorf("control plane for %s was sent %v", c.id, n)
		}
	}
}

// admin.advertise_address: a host:port another machine can dial, refused
// naming the key otherwise; set, it is in every node the relay presents
// upstream (metadata xdsrelay.admin), and a client's node that carries a
// usable one is read back, one that does not is not.
func TestAdvertiseAddress(t *testing.T) {
	for _, bad := range []string{"10.0.0.7", "0.0.0.0:9901", "[::]:9901", ":9901", "10.0.0.7:0", "10.0.0.7:x"} {
		c := Default()
		c.Admin.AdvertiseAddress = bad
		if err := c.Validate(); err == nil || !strings.HasPrefix(err.Error(), "admin.advertise_address") {
			t.Errorf("%q: error %v, want one naming admin.advertise_address", bad, err)
		}
	}
	c := Default()
	c.Admin.AdvertiseAddress = "10.0.0.7:9901"
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	for i, n := range groupNodes(&c, "h", "k", node("n1", "c1")) {
		if got := advertised(n); got != "10.0.0.7:9901" {
			t.Errorf("node %d advertises %q", i, got)
		}
	}
	if got := advertised(groupNode(ptr(Default()), "h", "k", node("n1", "c1"))); got != "" {
		t.Errorf("without the key, the node advertises %q", got)
	}
	bad := node("n1", "c1")
	setMetadata(bad, TierMetadataKey, structpb.NewStringValue("0.0.0.0:9901"))
	if got := advertised(bad); got != "" {
		t.Errorf("a node advertising a wildcard address is read as %q", got)
	}
}

func ptr[T any](v T) *T { return &v }
