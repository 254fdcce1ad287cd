package relay

import (
	"strings"
	"testing"
	"time"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// quietWindow is how long a test watches for what must not happen.
const quietWindow = 500 * time.Millisecond

// forwardedNACKs are the requests the control plane received that carry
// an error_detail, delta or SotW, of typeURL.
func forwardedNACKs(cp *testcp.ControlPlane, typeURL string) []*rpcstatus.Status {
	var out []*rpcstatus.Status
	for _, r := range cp.Requests() {
		if r.GetErrorDetail() != nil && r.GetTypeUrl() == typeURL {
			out = append(out, r.GetErrorDetail())
		}
	}
	for _, r := range cp.SotWRequests() {
		if r.GetErrorDetail() != nil && r.GetTypeUrl() == typeURL {
			out = append(out, r.GetErrorDetail())
		}
	}
	return out
}

// afterForwarded is how many requests, delta and SotW, the control plane
// received after the first forwarded NACK: a resubscription, or the ACK
// of what it sent in reaction.
func afterForwarded(cp *testcp.ControlPlane) int {
	n, seen := 0, false
	for _, r := range cp.Requests() {
		if seen {
			n++
		}
		seen = seen || r.GetErrorDetail() != nil
	}
	for _, r := range cp.SotWRequests() {
		if seen {
			n++
		}
		seen = seen || r.GetErrorDetail() != nil
	}
	return n
}

// rejectedAt is how many of r's clients, over its groups, reject e1 at
// version (at any version if "": a relay that speaks SotW to the one
// above versions resources itself).
func rejectedAt(r *Relay, version string) int {
	n := 0
	for _, g := range r.snapshotGroups() {
		for _, rc := range g.cache.Convergence([]string{resourcev3.EndpointType}, []string{"e1"}) {
			for _, v := range rc.Versions {
				if v.Version == version || version == "" {
					n += v.Rejected
				}
			}
		}
	}
	return n
}

// edsClient is a delta client of e1 in group c1 that has received e1.
func edsClient(t *testing.T, r *Relay, id string) (*deltaStream, *discoverypb.DeltaDiscoveryResponse) {
	t.Helper()
	s := openDelta(t, r.Addr())
	s.send(&discoverypb.DeltaDiscoveryRequest{Node: node(id, "c1"), TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: []string{"e1"}})
	resp := s.recv()
	if len(resp.GetResources()) != 1 {
		t.Fatalf("%s: first response %v, want e1", id, resp)
	}
	return s, resp
}

func nack(s *deltaStream, resp *discoverypb.DeltaDiscoveryResponse, msg string) {
	s.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResponseNonce: resp.GetNonce(),
		ErrorDetail: &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: msg}})
}

func ackDelta(s *deltaStream, resp *discoverypb.DeltaDiscoveryResponse) {
	s.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResponseNonce: resp.GetNonce()})
}

// forwardedCount is xdsrelay_upstream_forwarded_nacks_total of EDS with
// outcome.
func forwardedCount(t *testing.T, r *Relay, outcome string) float64 {
	t.Helper()
	return value(scrape(t, r), "xdsrelay_upstream_forwarded_nacks_total",
		map[string]string{"type": xds.ShortName(resourcev3.EndpointType), "outcome": outcome})
}

// A client's NACK reaches the control plane, in each dialect: one request
// naming the count, the resource, the version and the first error; a
// second client rejecting the same version sends nothing more; and the
// control plane's reaction changes nothing: no resubscription, nothing
// new for the clients, the version still served.
func TestForwardNACK(t *testing.T) {
	for _, d := range testcp.Dialects {
		t.Run(string(d), func(t *testing.T) {
			cp := testcp.StartDialect(t, d)
			cp.Set(t, "c1", "1", testcp.Endpoints("e1", "10.0.0.1:80"))
			r := startRelay(t, cp.Addr, func(c *Config) { c.Upstream.Protocol = string(d) })

			acker, ackResp := edsClient(t, r, "acker")
			ackDelta(acker, ackResp)
			v := ackResp.GetResources()[0].GetVersion()
			eventually(t, "the first client to accept e1", func() bool { return convergenceOfE1(t, r).Accepted == 1 })
			nacker, nackResp := edsClient(t, r, "nacker")
			nack(nacker, nackResp, "bad endpoint e1")

			var got []*rpcstatus.Status
			eventually(t, "the control plane to be told of the rejection", func() bool {
				got = forwardedNACKs(cp, resourcev3.EndpointType)
				return len(got) > 0
			})
			want := "xdsrelay: 1 of 2 clients rejected " + xds.ShortName(resourcev3.EndpointType) + " e1 version " + v + ": bad endpoint e1"
			if got[0].GetMessage() != want || got[0].GetCode() != int32(codes.InvalidArgument) {
				t.Fatalf("forwarded NACK %v, want code %d and message %q", got[0], codes.InvalidArgument, want)
			}
			if rs := xds.Forwarded(got[0], 10); len(rs) != 1 || rs[0].Name != "e1" || rs[0].Version != v || rs[0].Rejected != 1 || rs[0].Clients != 2 {
				t.Fatalf("forwarded NACK's details: %+v", rs)
			}
			if n := forwardedCount(t, r, "sent"); n != 1 {
				t.Errorf("forwarded NACKs sent: %v, want 1", n)
			}

			// A second client rejects the same version: counted, not sent again.
			late, lateResp := edsClient(t, r, "late")
			if lateResp.GetResources()[0].GetVersion() != v {
				t.Fatalf("a new client got version %s, want the one served, %s", lateResp.GetResources()[0].GetVersion(), v)
			}
			nack(late, lateResp, "bad endpoint e1, again")
			eventually(t, "the second rejection counted", func() bool { return rejectedAt(r, v) == 2 })
			acker.quiet(quietWindow)
			nacker.quiet(50 * time.Millisecond)
			if n := len(forwardedNACKs(cp, resourcev3.EndpointType)); n != 1 {
				t.Fatalf("the control plane was told %d times, want once per version", n)
			}
			if n := afterForwarded(cp); n != 0 {
				t.Errorf("the relay sent the control plane %d more requests after the forwarded NACK (a resubscription, or the ACK of a state sent again): %v %v",
					n, cp.Requests(), cp.SotWRequests())
			}
			if rc := convergenceOfE1(t, r); rc.Version != v || rc.Accepted != 1 || rc.Rejected != 2 {
				t.Errorf("e1 after the rejections: %+v, want version %s still served", rc, v)
			}
		})
	}
}

// upstream.forward_nacks: false keeps clients' rejections at the relay.
func TestForwardNACKsOff(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Endpoints("e1", "10.0.0.1:80"))
	r := startRelay(t, cp.Addr, func(c *Config) { c.Upstream.ForwardNACKs = false })
	s, resp := edsClient(t, r, "nacker")
	nack(s, resp, "bad endpoint e1")
	eventually(t, "the rejection counted", func() bool { return convergenceOfE1(t, r).Rejected == 1 })
	s.quiet(quietWindow)
	if got := forwardedNACKs(cp, resourcev3.EndpointType); len(got) != 0 {
		t.Fatalf("the control plane was told %v with upstream.forward_nacks off", got)
	}
	if n := forwardedCount(t, r, "sent"); n != 0 {
		t.Errorf("forwarded NACKs sent: %v, want 0", n)
	}
}

// Through tiers: a client of relay A rejects; A tells relay B, its
// control plane; B counts it as a rejection by A's node and tells the
// control plane above it, with the first error from below.
// Relay A speaks to B in delta, and in SotW.
func TestForwardNACKThroughTiers(t *testing.T) {
	for _, p := range []string{"delta", "sotw"} {
		t.Run(p, func(t *testing.T) { forwardThroughTiers(t, p) })
	}
}

func forwardThroughTiers(t *testing.T, protocol string) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Endpoints("e1", "10.0.0.1:80"))
	b := startRelay(t, cp.Addr)
	a := startRelay(t, b.Addr(), func(c *Config) { c.Upstream.Protocol = protocol })

	s, resp := edsClient(t, a, "nacker")
	v := resp.GetResources()[0].GetVersion()
	nack(s, resp, "bad endpoint e1")
	eventually(t, "relay B to count relay A's rejection", func() bool { return rejectedAt(b, "") == 1 })
	var got []*rpcstatus.Status
	eventually(t, "the control plane to be told by relay B", func() bool {
		got = forwardedNACKs(cp, resourcev3.EndpointType)
		return len(got) > 0
	})
	if msg := got[0].GetMessage(); !strings.Contains(msg, "1 of 1 clients rejected") || !strings.Contains(msg, "e1 version ") ||
		!strings.Contains(msg, "bad endpoint e1") {
		t.Fatalf("the control plane was told %q", msg)
	}
	s.quiet(quietWindow)
	if n := len(forwardedNACKs(cp, resourcev3.EndpointType)); n != 1 {
		t.Errorf("the control plane was told %d times, want once", n)
	}
	if rc := convergenceOfE1(t, a); rc.Version != v || rc.Rejected != 1 {
		t.Errorf("relay A's e1: %+v", rc)
	}
}

// With several control planes, each upstream's upstream.forward_nacks
// decides for the names it serves: a rejection goes to the control plane
// that sent the version, if that one is to be told.
func TestForwardNACKToTheUpstreamOfTheName(t *testing.T) {
	def, eds := testcp.Start(t), testcp.Start(t)
	def.Set(t, "c1", "1", testcp.Cluster("a"))
	eds.Set(t, "c1", "1", testcp.Endpoints("e1", "10.0.0.1:80"))
	r := startRelay(t, def.Addr, func(c *Config) { c.Upstream.ForwardNACKs = false },
		withUpstream("eds", eds.Addr, []string{resourcev3.EndpointType}, nil))

	s, resp := edsClient(t, r, "nacker")
	nack(s, resp, "bad endpoint e1")
	eventually(t, "the EDS control plane to be told", func() bool { return len(forwardedNACKs(eds, resourcev3.EndpointType)) == 1 })

	c := openDelta(t, r.Addr())
	c.send(&discoverypb.DeltaDiscoveryRequest{Node: node("cds-nacker", "c1"), TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"a"}})
	cresp := c.recv()
	c.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResponseNonce: cresp.GetNonce(),
		ErrorDetail: &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: "bad cluster a"}})
	eventually(t, "the cluster's rejection counted", func() bool {
		var out DebugConvergence
		getJSON(t, r, "/debug/convergence?type=cds&name=a", &out)
		return len(out.Resources) == 1 && out.Resources[0].Rejected == 1
	})
	c.quiet(quietWindow)
	if got := forwardedNACKs(def, resourcev3.ClusterType); len(got) != 0 {
		t.Fatalf("the default control plane, upstream.forward_nacks off, was told %v", got)
	}
}
