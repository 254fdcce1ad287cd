package relay

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlspb "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// withUpstream adds a control plane to the relay's upstreams[], serving the
// types and authorities given.
func withUpstream(name, addr string, types, authorities []string) func(*Config) {
	return func(c *Config) {
		u := DefaultUpstream()
		u.Name, u.Address, u.Types, u.Authorities = name, addr, types, authorities
		c.Upstreams = append(c.Upstreams, u)
	}
}

// upstreamSubscriptions lists every name cp was asked for, as "Type name",
// from both resource_names_subscribe and initial_resource_versions.
func upstreamSubscriptions(cp *testcp.ControlPlane) []string {
	var out []string
	for _, r := range cp.Requests() {
		short := r.GetTypeUrl()[strings.LastIndex(r.GetTypeUrl(), ".")+1:]
		for _, n := range r.GetResourceNamesSubscribe() {
			out = append(out, short+" "+n)
		}
		for n := range r.GetInitialResourceVersions() {
			out = append(out, short+" "+n)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// upstreamTypes are the type URLs of every request cp received.
func upstreamTypes(cp *testcp.ControlPlane) []string {
	var out []string
	for _, r := range cp.Requests() {
		out = append(out, r.GetTypeUrl())
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// gRFC A47 federation through the relay: a real gRPC client whose
// bootstrap names the relay for the default servers and for the authority
// partner.example.com resolves xds://partner.example.com/greeter through
// xdstp names (listener → route → cluster → endpoints) that only the
// partner control plane serves, and xds:///plain through old-style names
// that only the default one serves. Each control plane is asked only for
// its own names.
func TestFederationGRPCClient(t *testing.T) {
	const (
		auth     = "partner.example.com"
		listener = "xdstp://" + auth + "/envoy.config.listener.v3.Listener/greeter"
		route    = "xdstp://" + auth + "/envoy.config.route.v3.RouteConfiguration/greeter-route"
		cluster  = "xdstp://" + auth + "/envoy.config.cluster.v3.Cluster/greeter-cluster"
	)
	def, partner := testcp.Start(t), testcp.Start(t)
	partnerBackend, defaultBackend := startBackend(t, "partner-backend"), startBackend(t, "default-backend")
	// gRPC wants an xdstp cluster's EDS service name set: here, the
	// cluster's own name.
	xdstpCluster := testcp.Cluster(cluster)
	xdstpCluster.EdsClusterConfig.ServiceName = cluster
	partner.Set(t, "greeters", "1",
		testcp.Listener(listener, route), testcp.Route(route, cluster),
		xdstpCluster, testcp.Endpoints(cluster, partnerBackend))
	def.Set(t, "greeters", "1",
		testcp.Listener("plain", "plain-route"), testcp.Route("plain-route", "plain-cluster"),
		testcp.Cluster("plain-cluster"), testcp.Endpoints("plain-cluster", defaultBackend))
	r := startRelay(t, def.Addr, withUpstream("partner", partner.Addr, nil, []string{auth}))

	bootstrap := federatedBootstrap(r.Addr(), "grpc-federated-1", auth)
	logAsked := func() {
		t.Logf("default control plane was asked for %q", upstreamSubscriptions(def))
		t.Logf("partner control plane was asked for %q", upstreamSubscriptions(partner))
	}
	for _, c := range []struct{ target, backend string }{
		{"xds://" + auth + "/greeter", "partner-backend"},
		{"xds:///plain", "default-backend"},
	} {
		rpcReaches(t, grpcClientWith(t, bootstrap, c.target), c.backend, logAsked)
	}

	for _, s := range upstreamSubscriptions(def) {
		if strings.Contains(s, "xdstp://") {
			t.Errorf("default control plane was asked for %s", s)
		}
	}
	for _, s := range upstreamSubscriptions(partner) {
		if !strings.Contains(s, " xdstp://"+auth+"/") {
			t.Errorf("partner control plane was asked for %s", s)
		}
	}
	if t.Failed() {
		logAsked()
	}
}

// federatedBootstrap is a gRPC xDS bootstrap whose node is id in cluster
// greeters, naming the relay at addr for the default servers and for the
// authority auth (gRFC A47).
func federatedBootstrap(addr, id, auth string) string {
	server := fmt.Sprintf(`{"server_uri": %q, "channel_creds": [{"type": "insecure"}], "server_features": ["xds_v3"]}`, addr)
	return fmt.Sprintf(`{
		"xds_servers": [%s],
		"node": {"id": %q, "cluster": "greeters"},
		"authorities": {%q: {
			"xds_servers": [%s],
			"client_listener_resource_name_template": "xdstp://%s/envoy.config.listener.v3.Listener/%%s"
		}}
	}`, server, id, auth, server, auth)
}

// An xdstp name whose authority no upstream lists does not exist (gRFC
// A47): a delta client gets it in removed_resources at once, long before
// cache.not_found_timeout, next to the names that do exist, with a
// NOT_FOUND error (gRFC A88); a SotW client gets the error, or the end of
// its stream if that would be its only answer; no control plane is asked
// for it, and it is counted.
func TestUnknownAuthority(t *testing.T) {
	const unknown = "xdstp://other.example.com/envoy.config.cluster.v3.Cluster/x"
	def, partner := testcp.Start(t), testcp.Start(t)
	def.Set(t, "c1", "1", testcp.Cluster("a"))
	r := startRelay(t, def.Addr, withUpstream("partner", partner.Addr, nil, []string{"partner.example.com"}),
		func(c *Config) { c.Cache.NotFoundTimeout = time.Minute })

	d := openDelta(t, r.Addr())
	start := time.Now()
	d.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n1", "c1"), TypeUrl: resourcev3.ClusterType,
		ResourceNamesSubscribe: []string{unknown, "a"}})
	var got, removed []string
	var errs []*discoverypb.ResourceError
	for !slices.Contains(got, "a") || !slices.Contains(removed, unknown) {
		resp := d.recv()
		got, removed = append(got, deltaNames(resp)...), append(removed, resp.GetRemovedResources()...)
		errs = append(errs, resp.GetResourceErrors()...)
		d.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResponseNonce: resp.GetNonce()})
	}
	if len(errs) != 1 || errs[0].GetResourceName().GetName() != unknown || errs[0].GetErrorDetail().GetCode() != int32(codes.NotFound) {
		t.Errorf("delta client's resource errors: %v", errs)
	}
	if slices.Contains(got, unknown) || slices.Contains(removed, "a") {
		t.Fatalf("delta client got %v and removed %v, want [a] and [%s]", got, removed, unknown)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("the unknown name was reported after %s: not at once", took)
	}
	waitMetric(t, r, `xdsrelay_unroutable_names_total{type="Cluster"} 1`)

	// A second delta client of the group, asking for it once it is known
	// not to exist, is told so too.
	d2 := openDelta(t, r.Addr())
	d2.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n3", "c1"), TypeUrl: resourcev3.ClusterType,
		ResourceNamesSubscribe: []string{unknown}})
	if resp := d2.recvWithin(5 * time.Second); !slices.Equal(resp.GetRemovedResources(), []string{unknown}) || len(resp.GetResources()) > 0 {
		t.Fatalf("second delta client got %v, removed %v; want only %s removed", deltaNames(resp), resp.GetRemovedResources(), unknown)
	}

	// A SotW client asking for it alone: the stream ends with NOT_FOUND at
	// once, which clients that do not read resource_errors understand.
	alone := openSotW(t, r.Addr())
	alone.send(&discoverypb.DiscoveryRequest{Node: node("n2", "c1"), TypeUrl: resourcev3.ClusterType, ResourceNames: []string{unknown}})
	if err := ended(t, alone); grpcstatus.Code(err) != codes.NotFound {
		t.Errorf("SotW client alone: %v, want NOT_FOUND", err)
	}
	// Asking for it next to "a", it gets "a" and the error: the complete
	// state, so that nothing is taken for deleted.
	s := openSotW(t, r.Addr())
	s.send(&discoverypb.DiscoveryRequest{Node: node("n4", "c1"), TypeUrl: resourcev3.ClusterType, ResourceNames: []string{unknown, "a"}})
	for {
		resp := s.recv()
		names := resourceNames(t, resp)
		if slices.Contains(names, unknown) {
			t.Fatalf("SotW client got %v", names)
		}
		if e := resp.GetResourceErrors(); len(e) == 1 && e[0].GetResourceName().GetName() == unknown && slices.Equal(names, []string{"a"}) {
			break
		}
		s.send(&discoverypb.DiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResourceNames: []string{unknown, "a"},
			VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()})
	}
	noResponseWith(t, s, unknown, 300*time.Millisecond)

	for _, cp := range []*testcp.ControlPlane{def, partner} {
		if slices.Contains(upstreamSubscriptions(cp), "Cluster "+unknown) {
			t.Errorf("control plane %s was asked for %s", cp.Addr, unknown)
		}
	}
	if n := partner.DeltaStreams.Load(); n != 0 {
		t.Errorf("partner control plane saw %d streams, want none: nothing it serves was wanted", n)
	}
}

// noResponseWith fails the test if a response naming name arrives on s
// within d.
func noResponseWith(t *testing.T, s *sotwStream, name string, d time.Duration) {
	t.Helper()
	window := time.After(d)
	for {
		select {
		case resp, ok := <-s.resps:
			if !ok {
				t.Fatal("stream ended")
			}
			if names := resourceNames(t, resp); slices.Contains(names, name) {
				t.Fatalf("SotW client got %v", names)
			}
		case <-window:
			return
		}
	}
}

// genericSecret is a Secret holding content.
func genericSecret(name, content string) *tlspb.Secret {
	return &tlspb.Secret{Name: name, Type: &tlspb.Secret_GenericSecret{GenericSecret: &tlspb.GenericSecret{
		Secret: &corepb.DataSource{Specifier: &corepb.DataSource_InlineString{InlineString: content}},
	}}}
}

// secretContent is what a Secret sent as a holds.
func secretContent(t *testing.T, a *anypb.Any) string {
	t.Helper()
	s := &tlspb.Secret{}
	if err := a.UnmarshalTo(s); err != nil {
		t.Fatal(err)
	}
	return s.GetGenericSecret().GetSecret().GetInlineString()
}

// typed is what a client has received: type URL → name → resource.
type typed map[string]map[string]*anypb.Any

func (g typed) add(typeURL, name string, a *anypb.Any) {
	if g[typeURL] == nil {
		g[typeURL] = map[string]*anypb.Any{}
	}
	g[typeURL][name] = a
}

// complete tells whether g holds cluster "c", endpoints "c" and secret "cert".
func (g typed) complete() bool {
	return g[resourcev3.ClusterType]["c"] != nil && g[resourcev3.EndpointType]["c"] != nil &&
		g[resourcev3.SecretType]["cert"] != nil
}

// upstreams[].types: a type listed by an upstream is asked of that upstream
// only, even for a name the default control plane also serves; the others
// are the default's. Both delta and SotW ADS clients of one group get each
// resource from its own control plane.
func TestTypesGoToTheirUpstream(t *testing.T) {
	def, secrets := testcp.Start(t), testcp.Start(t)
	def.Set(t, "c1", "1", testcp.Cluster("c"), testcp.Endpoints("c", "10.0.0.1:80"), genericSecret("cert", "decoy"))
	secrets.Set(t, "c1", "1", genericSecret("cert", "real"))
	r := startRelay(t, def.Addr, withUpstream("secrets", secrets.Addr, []string{"secrets"}, nil))

	subs := []struct{ typeURL, name string }{
		{resourcev3.ClusterType, "c"}, {resourcev3.EndpointType, "c"}, {resourcev3.SecretType, "cert"},
	}
	d := openDelta(t, r.Addr())
	for i, s := range subs {
		req := &discoverypb.DeltaDiscoveryRequest{TypeUrl: s.typeURL, ResourceNamesSubscribe: []string{s.name}}
		if i == 0 {
			req.Node = node("n1", "c1")
		}
		d.send(req)
	}
	fromDelta := typed{}
	for !fromDelta.complete() {
		resp := d.recv()
		for _, res := range resp.GetResources() {
			fromDelta.add(resp.GetTypeUrl(), res.GetName(), res.GetResource())
		}
		d.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()})
	}

	s := openSotW(t, r.Addr())
	for i, sub := range subs {
		req := &discoverypb.DiscoveryRequest{TypeUrl: sub.typeURL, ResourceNames: []string{sub.name}}
		if i == 0 {
			req.Node = node("n2", "c1")
		}
		s.send(req)
	}
	fromSotW := typed{}
	for !fromSotW.complete() {
		resp := s.recv()
		for _, a := range resp.GetResources() {
			fromSotW.add(resp.GetTypeUrl(), resourceName(t, a), a)
		}
		s.send(&discoverypb.DiscoveryRequest{TypeUrl: resp.GetTypeUrl(), VersionInfo: resp.GetVersionInfo(),
			ResponseNonce: resp.GetNonce()})
	}

	for client, got := range map[string]typed{"delta": fromDelta, "SotW": fromSotW} {
		if c := secretContent(t, got[resourcev3.SecretType]["cert"]); c != "real" {
			t.Errorf("%s client got secret cert holding %q, want the secrets control plane's %q", client, c, "real")
		}
	}
	if types := upstreamTypes(def); slices.Contains(types, resourcev3.SecretType) {
		t.Errorf("default control plane was asked for secrets: %q", upstreamSubscriptions(def))
	}
	for _, typeURL := range upstreamTypes(secrets) {
		if typeURL != resourcev3.SecretType {
			t.Errorf("secrets control plane was asked for %s: %q", typeURL, upstreamSubscriptions(secrets))
		}
	}
}
