package relay

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	adminpb "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statuspb "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	matcherpb "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// csdsFixture runs a relay with two clients of one group: "acker", a delta
// client that ACKs e1 and is told "missing" does not exist, and "nacker", a
// SotW client that NACKs e1.
func csdsFixture(t *testing.T) *Relay {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Endpoints("e1", "10.0.0.1:80"))
	r := startRelay(t, cp.Addr, func(c *Config) { c.Cache.NotFoundTimeout = 200 * time.Millisecond })

	d := openDelta(t, r.Addr())
	d.send(&discoverypb.DeltaDiscoveryRequest{Node: node("acker", "c1"), TypeUrl: resourcev3.EndpointType,
		ResourceNamesSubscribe: []string{"e1", "missing"}})
	for seen := 0; seen < 2; {
		resp := d.recv()
		seen += len(resp.GetResources()) + len(resp.GetRemovedResources())
		d.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResponseNonce: resp.GetNonce()})
	}

	s := openSotW(t, r.Addr())
	s.send(&discoverypb.DiscoveryRequest{Node: node("nacker", "c1"), TypeUrl: resourcev3.EndpointType, ResourceNames: []string{"e1"}})
	resp := s.recv()
	s.send(&discoverypb.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: []string{"e1"},
		ResponseNonce: resp.GetNonce(), ErrorDetail: &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: "bad endpoint e1"}})
	return r
}

func fetchStatus(t *testing.T, r *Relay, req *statuspb.ClientStatusRequest) (*statuspb.ClientStatusResponse, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	return statuspb.NewClientStatusDiscoveryServiceClient(dial(t, r.Addr())).FetchClientStatus(ctx, req)
}

// summary is "node type/name version STATUS [error]" per resource, sorted;
// a version (upstream's hash of the resource) is "V" if there is one.
func summary(resp *statuspb.ClientStatusResponse) []string {
	var out []string
	for _, c := range resp.GetConfig() {
		for _, g := range c.GetGenericXdsConfigs() {
			line := fmt.Sprintf("%s %s/%s %s %s", c.GetNode().GetId(), typeShort(g.GetTypeUrl()), g.GetName(), present(g.GetVersionInfo()), g.GetClientStatus())
			if e := g.GetErrorState(); e != nil {
				line += " " + e.GetDetails()
			}
			out = append(out, line)
		}
	}
	slices.Sort(out)
	return out
}

func present(version string) string {
	if version == "" {
		return ""
	}
	return "V"
}

func typeShort(u string) string { return u[strings.LastIndex(u, ".")+1:] }

func TestCSDSShowsEachClientsStatus(t *testing.T) {
	r := csdsFixture(t)
	want := []string{
		"acker ClusterLoadAssignment/e1 V ACKED",
		"acker ClusterLoadAssignment/missing  DOES_NOT_EXIST",
		"nacker ClusterLoadAssignment/e1 V NACKED bad endpoint e1",
	}
	var got []string
	eventually(t, "both clients' status", func() bool {
		resp, err := fetchStatus(t, r, &statuspb.ClientStatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		got = summary(resp)
		return slices.Equal(got, want)
	})

	resp, err := fetchStatus(t, r, &statuspb.ClientStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range resp.GetConfig() {
		for _, g := range c.GetGenericXdsConfigs() {
			if g.GetLastUpdated() == nil {
				t.Errorf("%s %s: no last_updated", c.GetNode().GetId(), g.GetName())
			}
			if g.GetClientStatus() == adminpb.ClientResourceStatus_NACKED && g.GetErrorState().GetLastUpdateAttempt() == nil {
				t.Errorf("%s %s: NACK without its time", c.GetNode().GetId(), g.GetName())
			}
		}
	}
}

func TestCSDSNodeMatchers(t *testing.T) {
	r := csdsFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	st, err := statuspb.NewClientStatusDiscoveryServiceClient(dial(t, r.Addr())).StreamClientStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ask := func(m *matcherpb.StringMatcher) []string {
		if err := st.Send(&statuspb.ClientStatusRequest{NodeMatchers: []*matcherpb.NodeMatcher{{NodeId: m}}}); err != nil {
			t.Fatal(err)
		}
		resp, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, c := range resp.GetConfig() {
			ids = append(ids, c.GetNode().GetId())
		}
		return ids
	}
	exact := &matcherpb.StringMatcher{MatchPattern: &matcherpb.StringMatcher_Exact{Exact: "nacker"}}
	if got := ask(exact); !slices.Equal(got, []string{"nacker"}) {
		t.Fatalf("exact nacker: %v", got)
	}
	prefix := &matcherpb.StringMatcher{MatchPattern: &matcherpb.StringMatcher_Prefix{Prefix: "ACK"}, IgnoreCase: true}
	if got := ask(prefix); !slices.Equal(got, []string{"acker"}) {
		t.Fatalf("prefix ACK, ignoring case: %v", got)
	}

	_, err = fetchStatus(t, r, &statuspb.ClientStatusRequest{NodeMatchers: []*matcherpb.NodeMatcher{{NodeId: &matcherpb.StringMatcher{
		MatchPattern: &matcherpb.StringMatcher_SafeRegex{SafeRegex: &matcherpb.RegexMatcher{Regex: ".*"}}}}}})
	if grpcstatus.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "SafeRegex") {
		t.Fatalf("regex matcher: %v, want InvalidArgument naming it", err)
	}
}

// With authorization rules, CSDS shows a caller only the clients whose
// nodes its certificate may claim: tenant-a never sees tenant-b's.
func TestCSDSOnlyShowsTheCallersTenants(t *testing.T) {
	r, _, ca := startTenantRelay(t)
	for _, tenant := range []string{"a", "b"} {
		cc := ca.dialAs(r.Addr(), ca.client("spiffe://example.org/tenant/"+tenant))
		s := newStream(t, discoverypb.NewAggregatedDiscoveryServiceClient(cc).DeltaAggregatedResources)
		s.send(&discoverypb.DeltaDiscoveryRequest{Node: node(tenant+"-1", "tenant-"+tenant), TypeUrl: resourcev3.ClusterType})
		s.recv()
	}
	csdsA := statuspb.NewClientStatusDiscoveryServiceClient(ca.dialAs(r.Addr(), ca.client("spiffe://example.org/tenant/a")))
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	resp, err := csdsA.FetchClientStatus(ctx, &statuspb.ClientStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, c := range resp.GetConfig() {
		ids = append(ids, c.GetNode().GetId())
	}
	if !slices.Equal(ids, []string{"a-1"}) {
		t.Fatalf("tenant-a sees %v, want only [a-1]", ids)
	}
}

// A wildcard-only SotW subscription shares the type's complete state and
// keeps no per-name record: CSDS still lists each resource, sent and then
// ACKed.
func TestCSDSWildcardSotW(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("x"), testcp.Cluster("y"))
	r := startRelay(t, cp.Addr)
	s := openSotW(t, r.Addr())
	s.send(&discoverypb.DiscoveryRequest{Node: node("envoy", "c1"), TypeUrl: resourcev3.ClusterType})
	resp := s.recv()
	state := func() []string {
		resp, err := fetchStatus(t, r, &statuspb.ClientStatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return summary(resp)
	}
	if got, want := state(), []string{"envoy Cluster/x V REQUESTED", "envoy Cluster/y V REQUESTED"}; !slices.Equal(got, want) {
		t.Fatalf("before the ACK: %v, want %v", got, want)
	}
	s.send(&discoverypb.DiscoveryRequest{TypeUrl: resourcev3.ClusterType, VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()})
	want := []string{"envoy Cluster/x V ACKED", "envoy Cluster/y V ACKED"}
	eventually(t, "the ACK in CSDS", func() bool { return slices.Equal(state(), want) })
}
