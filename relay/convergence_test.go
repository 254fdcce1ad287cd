package relay

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"

	adminpb "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statuspb "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// convergenceOfE1 is /debug/convergence's record of e1 in group c1.
func convergenceOfE1(t *testing.T, r *Relay) ConvergenceResource {
	t.Helper()
	var out DebugConvergence
	getJSON(t, r, "/debug/convergence?group="+url.QueryEscape(keyOf("c1"))+"&type=eds&name=e1", &out)
	if len(out.Resources) != 1 {
		t.Fatalf("/debug/convergence: %d resources, want e1", len(out.Resources))
	}
	return out.Resources[0]
}

// csdsCounts counts e1's per-client status as CSDS reports it: ACKED,
// NACKED and REQUESTED with a version (sent, not answered).
func csdsCounts(t *testing.T, r *Relay) (acked, nacked, pending int) {
	t.Helper()
	resp, err := fetchStatus(t, r, &statuspb.ClientStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range resp.GetConfig() {
		for _, g := range c.GetGenericXdsConfigs() {
			if g.GetName() != "e1" {
				continue
			}
			switch g.GetClientStatus() {
			case adminpb.ClientResourceStatus_ACKED:
				acked++
			case adminpb.ClientResourceStatus_NACKED:
				nacked++
			case adminpb.ClientResourceStatus_REQUESTED:
				if g.GetVersionInfo() != "" {
					pending++
				}
			}
		}
	}
	return acked, nacked, pending
}

// sameAsCSDS fails unless the counters of e1's current version say what
// CSDS says of every client.
func sameAsCSDS(t *testing.T, r *Relay, rc ConvergenceResource) {
	t.Helper()
	a, n, p := csdsCounts(t, r)
	if a != rc.Accepted || n != rc.Rejected || p != rc.Pending {
		t.Errorf("counters: %d accepted, %d rejected, %d pending; CSDS: %d ACKED, %d NACKED, %d sent and unanswered",
			rc.Accepted, rc.Rejected, rc.Pending, a, n, p)
	}
}

// The counters follow a change through a fleet of real clients: accepted
// by a delta and a SotW client, rejected by another with its error and
// node, pending for one that does not answer yet, and gone with a client
// that leaves mid-change. At each step they say what CSDS says, and the
// time to accept is on /metrics.
func TestConvergenceFollowsAChange(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Endpoints("e1", "10.0.0.1:80"))
	r := startRelay(t, cp.Addr)

	d, resp := edsClient(t, r, "acker")
	ackDelta(d, resp)

	sotw := func(id string) (*sotwStream, *discoverypb.DiscoveryResponse) {
		s := openSotW(t, r.Addr())
		s.send(&discoverypb.DiscoveryRequest{Node: node(id, "c1"), TypeUrl: resourcev3.EndpointType, ResourceNames: []string{"e1"}})
		return s, s.recv()
	}
	ack := func(s *sotwStream, resp *discoverypb.DiscoveryResponse) {
		s.send(&discoverypb.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: []string{"e1"},
			VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()})
	}
	slow, slowResp := sotw("slow")
	ack(slow, slowResp)
	nacker, nackResp := sotw("nacker")
	nacker.send(&discoverypb.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: []string{"e1"},
		ResponseNonce: nackResp.GetNonce(), ErrorDetail: &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: "bad endpoint e1"}})

	var rc ConvergenceResource
	eventually(t, "two clients accept e1, one rejects it", func() bool {
		rc = convergenceOfE1(t, r)
		return rc.Accepted == 2 && rc.Rejected == 1
	})
	v1 := rc.Version
	if rc.Subscribed != 3 || rc.Behind != 0 || rc.Pending != 0 || len(rc.Versions) != 1 ||
		rc.Versions[0].Error != "bad endpoint e1" || !slices.Equal(rc.Versions[0].RejectedBy, []string{"nacker"}) {
		t.Fatalf("e1 at its first version: %+v", rc)
	}
	sameAsCSDS(t, r, rc)
	mfs := scrape(t, r)
	eds := xds.ShortName(resourcev3.EndpointType)
	if got := value(mfs, "xdsrelay_clients_rejecting", map[string]string{"type": eds}); got != 1 {
		t.Errorf("xdsrelay_clients_rejecting{type=%q} = %v, want 1", eds, got)
	}

	// A change: the delta client and the one that rejected the first
	// version accept it; the slow one has not answered yet.
	cp.Set(t, "c1", "2", testcp.Endpoints("e1", "10.0.0.2:80"))
	resp = d.recv()
	d.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResponseNonce: resp.GetNonce()})
	ack(nacker, nacker.recv())
	slow.recv()
	eventually(t, "two clients accept the change, one is pending", func() bool {
		rc = convergenceOfE1(t, r)
		return rc.Version != v1 && rc.Accepted == 2 && rc.Pending == 1
	})
	if rc.Subscribed != 3 || rc.Rejected != 0 || rc.Behind != 0 || len(rc.Versions) != 1 || rc.Versions[0].Acks != 2 {
		t.Fatalf("e1 after the change: %+v", rc)
	}
	if v := rc.Versions[0]; v.Received == nil || v.Max <= 0 || v.P50 > v.Max || v.OldestPending <= 0 {
		t.Errorf("the change's times: %+v", v)
	}
	sameAsCSDS(t, r, rc)
	if got := histogramCount(scrape(t, r)["xdsrelay_convergence_seconds"]); got < 2 {
		t.Errorf("xdsrelay_convergence_seconds counts %d ACKs, want at least the change's 2", got)
	}

	// The slow client leaves mid-change: its count goes with it.
	slow.close()
	eventually(t, "the slow client's count gone", func() bool {
		rc = convergenceOfE1(t, r)
		return rc.Pending == 0 && rc.Subscribed == 2
	})
	if rc.Accepted != 2 || rc.Behind != 0 {
		t.Fatalf("e1 after the slow client left: %+v", rc)
	}
	sameAsCSDS(t, r, rc)
	d.close()
	nacker.close()
	eventually(t, "every count gone with the clients", func() bool {
		var out DebugConvergence
		getJSON(t, r, "/debug/convergence", &out)
		for _, s := range out.Summary {
			if s.Subscribed > 0 {
				return false
			}
		}
		return true
	})
}

// A wildcard SotW client shares the complete state it is sent with every
// such client and keeps no per-name record: its counts still move, name by
// name, as the response is sent and answered, and the summary counts it
// once, as one client, whatever the number of resources it holds.
func TestConvergenceWildcardAndSummary(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("a"), testcp.Cluster("b"))
	r := startRelay(t, cp.Addr)
	s := openSotW(t, r.Addr())
	s.send(&discoverypb.DiscoveryRequest{Node: node("w", "c1"), TypeUrl: resourcev3.ClusterType})
	resp := s.recv()
	s.send(&discoverypb.DiscoveryRequest{TypeUrl: resourcev3.ClusterType, VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()})
	var out DebugConvergence
	eventually(t, "both clusters accepted", func() bool {
		getJSON(t, r, "/debug/convergence?type=clusters", &out)
		return len(out.Summary) == 1 && out.Summary[0].Accepted == 1 && len(out.Resources) == 2 &&
			out.Resources[0].Accepted == 1 && out.Resources[1].Accepted == 1
	})
	if s := out.Summary[0]; s.Resources != 2 || s.Subscribed != 1 || s.Behind != 0 || !strings.HasSuffix(s.Type, "Cluster") {
		t.Fatalf("summary: %+v", s)
	}
	// ?limit= bounds the resources listed, not the summary; more says how
	// many it left off.
	for limit, listed := range map[string]int{"0": 0, "1": 1, "5": 2} {
		var lim DebugConvergence
		getJSON(t, r, "/debug/convergence?type=clusters&limit="+limit, &lim)
		if len(lim.Resources) != listed || lim.More != 2-listed || len(lim.Summary) != 1 || lim.Summary[0].Resources != 2 {
			t.Errorf("limit=%s: %d listed, %d more, summary %+v; want %d listed of 2", limit, len(lim.Resources), lim.More, lim.Summary, listed)
		}
	}
	for _, q := range []string{"limit=-1", "limit=x", "type=nosuch", "group=nosuch"} {
		if code, body := get(t, http.DefaultClient, "http://"+r.AdminAddr()+"/debug/convergence?"+q); code/100 != 4 {
			t.Errorf("?%s: %d %s, want a 4xx", q, code, body)
		}
	}
	resp2, err := fetchStatus(t, r, &statuspb.ClientStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got := summary(resp2); len(got) != 2 || !strings.HasSuffix(got[0], "ACKED") {
		t.Errorf("CSDS: %q", got)
	}

	// A delta client that names a with the wildcard is one client of a,
	// and one more client of the type.
	d := openDelta(t, r.Addr())
	d.send(&discoverypb.DeltaDiscoveryRequest{Node: node("d", "c1"), TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"*", "a"}})
	dresp := d.recv()
	d.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResponseNonce: dresp.GetNonce()})
	eventually(t, "the delta client accepts both clusters", func() bool {
		getJSON(t, r, "/debug/convergence?type=clusters", &out)
		return len(out.Summary) == 1 && out.Summary[0].Accepted == 2
	})
	if s := out.Summary[0]; s.Subscribed != 2 || s.Behind != 0 || out.Resources[0].Subscribed != 2 || out.Resources[0].Accepted != 2 {
		t.Errorf("with a client of the wildcard and of a by name: summary %+v, a %+v; want 2 clients of each", s, out.Resources[0])
	}
	// With names, each resource's counts are its clients': no summary sums them.
	getJSON(t, r, "/debug/convergence?type=clusters&name=a&name=b", &out)
	if len(out.Summary) != 0 || len(out.Resources) != 2 {
		t.Errorf("with names: %+v", out)
	}
}

// Clients are counted as clients: of two clients of five Clusters, one
// rejecting them all is one client rejecting in the summary and on
// /metrics, not five, and one of two; each Cluster counts it once.
func TestConvergenceCountsClientsOnce(t *testing.T) {
	cp := testcp.Start(t)
	var cs []types.Resource
	for i := range 5 {
		cs = append(cs, testcp.Cluster(fmt.Sprintf("c%d", i)))
	}
	cp.Set(t, "c1", "1", cs...)
	r := startRelay(t, cp.Addr)
	for _, id := range []string{"acker", "nacker"} {
		s := openSotW(t, r.Addr())
		s.send(&discoverypb.DiscoveryRequest{Node: node(id, "c1"), TypeUrl: resourcev3.ClusterType})
		resp := s.recv()
		ans := &discoverypb.DiscoveryRequest{TypeUrl: resourcev3.ClusterType, VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}
		if id == "nacker" {
			ans.VersionInfo, ans.ErrorDetail = "", &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: "no"}
		}
		s.send(ans)
	}
	var out DebugConvergence
	eventually(t, "one client accepts, one rejects", func() bool {
		getJSON(t, r, "/debug/convergence?type=clusters", &out)
		return len(out.Summary) == 1 && out.Summary[0].Accepted == 1 && out.Summary[0].Rejected == 1
	})
	if s := out.Summary[0]; s.Subscribed != 2 || s.Resources != 5 || s.Pending+s.Behind+s.Waiting != 0 {
		t.Errorf("summary: %+v, want 2 clients of 5 resources", s)
	}
	for _, rc := range out.Resources {
		if rc.Subscribed != 2 || rc.Accepted != 1 || rc.Rejected != 1 {
			t.Errorf("%s: %+v, want its 2 clients, 1 accepting and 1 rejecting", rc.Name, rc)
		}
	}
	short := xds.ShortName(resourcev3.ClusterType)
	if got := value(scrape(t, r), "xdsrelay_clients_rejecting", map[string]string{"type": short}); got != 1 {
		t.Errorf("xdsrelay_clients_rejecting{type=%q} = %v, want 1", short, got)
	}
}

// A change a canary NACKed is held from the rest of the group: the
// canary rejects the current version, the others are behind it, still
// holding the released one, and the gauges say so.
func TestConvergenceHeldRolloutIsBehind(t *testing.T) {
	cp, r, _ := heldRolloutFixture(t, 4)
	cds := "/debug/convergence?type=clusters&name=app"
	var out DebugConvergence
	eventually(t, "every client accepts the first version", func() bool {
		getJSON(t, r, cds, &out)
		return len(out.Resources) == 1 && out.Resources[0].Accepted == 4
	})

	cp.Set(t, "c1", "2", appCluster(badTimeout), appEndpoints(1001))
	eventually(t, "the canary rejects the change, the others are behind it", func() bool {
		getJSON(t, r, cds, &out)
		rc := out.Resources[0]
		return rc.Rejected == 1 && rc.Behind == 3
	})
	rc := out.Resources[0]
	if rc.Subscribed != 4 || rc.Accepted != 0 || rc.Pending != 0 || len(rc.Versions) != 2 ||
		rc.Versions[1].Accepted != 3 || rc.Versions[0].Error != "cannot use it" {
		t.Fatalf("app during the hold: %+v", rc)
	}
	getJSON(t, r, "/debug/convergence?type=clusters", &out)
	if s := out.Summary; len(s) != 1 || s[0].Behind != 3 || s[0].Rejected != 1 || s[0].Subscribed != 4 {
		t.Errorf("summary during the hold: %+v, want 4 clients: 3 behind, 1 rejecting", s)
	}
	mfs := scrape(t, r)
	short := xds.ShortName(resourcev3.ClusterType)
	if b, n := value(mfs, "xdsrelay_clients_behind", map[string]string{"type": short}), value(mfs, "xdsrelay_clients_rejecting", map[string]string{"type": short}); b != 3 || n != 1 {
		t.Errorf("xdsrelay_clients_behind = %v, xdsrelay_clients_rejecting = %v; want 3 and 1", b, n)
	}
}

// Beside each version, /debug/convergence shows the upstream version it
// came with, whatever the control plane speaks: a SotW response's
// version_info (the cache's version is then a hash of the bytes), and from
// a delta control plane its system_version_info, with the resource's own
// version, as the control plane sent it, as the version; with
// ?bytes_version=1, the hash of its bytes beside.
func TestConvergenceUpstreamVersion(t *testing.T) {
	forEachDialect(t, func(t *testing.T, d testcp.Dialect) {
		cp := testcp.StartDialect(t, d)
		cp.Set(t, "c1", "snap-1", testcp.Endpoints("e1", "10.0.0.1:80"))
		r := startRelay(t, cp.Addr)
		s, resp := edsClient(t, r, "n1")
		ackDelta(s, resp)
		for _, want := range []string{"snap-1", "snap-2"} {
			if want == "snap-2" {
				cp.Set(t, "c1", want, testcp.Endpoints("e1", "10.0.0.2:80"))
				ackDelta(s, s.recv())
			}
			var rc ConvergenceResource
			eventually(t, "the client accepts e1 at "+want, func() bool {
				rc = convergenceOfE1(t, r)
				return rc.UpstreamVersion == want && rc.Accepted == 1
			})
			if len(rc.Versions) != 1 || rc.Versions[0].UpstreamVersion != want || rc.Versions[0].Version != rc.Version || rc.BytesVersion != "" {
				t.Fatalf("e1 at %s: %+v", want, rc)
			}
			// Asked for, the hash of its bytes: the version itself where
			// the control plane sent none (SotW), another beside the
			// control plane's own (delta).
			var withBytes DebugConvergence
			getJSON(t, r, "/debug/convergence?type=eds&name=e1&bytes_version=1", &withBytes)
			if len(withBytes.Resources) != 1 || withBytes.Resources[0].BytesVersion == "" ||
				(withBytes.Resources[0].BytesVersion == rc.Version) != (d != testcp.DialectDelta) {
				t.Fatalf("e1 at %s (version %q) with ?bytes_version=1: %+v", want, rc.Version, withBytes.Resources)
			}
			if d != testcp.DialectDelta {
				continue
			}
			// The control plane's own version of e1, asked of it directly.
			direct := openDelta(t, cp.Addr)
			direct.send(&discoverypb.DeltaDiscoveryRequest{Node: node("direct", "c1"), TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: []string{"e1"}})
			got := direct.recv().GetResources()
			direct.close()
			if len(got) != 1 || got[0].GetVersion() == "" || got[0].GetVersion() != rc.Version {
				t.Fatalf("the control plane's version of e1 %v; /debug/convergence shows %q", got, rc.Version)
			}
		}
	})
}

// A relay lists the lower relays among its clients, as their nodes
// advertise their admin endpoints, once per node whatever its streams,
// and forgets one when its last stream leaves; a client advertising
// nothing, or an address nobody can dial, is not listed.
func TestConvergenceListsTiers(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Endpoints("e1", "10.0.0.1:80"))
	r := startRelay(t, cp.Addr)
	advertising := func(id, admin string) *deltaStream {
		s := openDelta(t, r.Addr())
		n := node(id, "c1")
		n.Metadata = &structpb.Struct{Fields: map[string]*structpb.Value{TierMetadataKey: structpb.NewStringValue(admin)}}
		s.send(&discoverypb.DeltaDiscoveryRequest{Node: n, TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: []string{"e1"}})
		s.recv()
		return s
	}
	tiers := func() []ConvergenceTier {
		var out DebugConvergence
		getJSON(t, r, "/debug/convergence", &out)
		return out.Tiers
	}
	b1, b1again := advertising("relay-b1", "10.0.0.7:9901"), advertising("relay-b1", "10.0.0.7:9901")
	b2 := advertising("relay-b2", "10.0.0.8:9901")
	advertising("envoy", "")
	advertising("confused", "0.0.0.0:9901")
	want := []ConvergenceTier{{Group: keyOf("c1"), Node: "relay-b1", Admin: "10.0.0.7:9901"}, {Group: keyOf("c1"), Node: "relay-b2", Admin: "10.0.0.8:9901"}}
	if got := tiers(); !slices.Equal(got, want) {
		t.Fatalf("tiers %+v, want %+v", got, want)
	}
	b1.close()
	b2.close()
	eventually(t, "relay-b2 forgotten, relay-b1 kept by its other stream", func() bool { return slices.Equal(tiers(), want[:1]) })
	b1again.close()
	eventually(t, "relay-b1 forgotten with its last stream", func() bool { return len(tiers()) == 0 })
}
