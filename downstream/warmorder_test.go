package downstream

import (
	"slices"
	"testing"
	"time"

	clusterpb "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointpb "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	routepb "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// warmClient is an ADS client, delta or SotW, that subscribes and answers
// as the test says, and describes what it is told, a resource at a time:
// "Cluster y", "ClusterLoadAssignment y", "RouteConfiguration r→y".
type warmClient struct {
	// subscribe asks for names of typeURL, the type's whole list (SotW:
	// answering its last response; delta: subscribing those added).
	subscribe func(typeURL string, names ...string)
	// answer ACKs the last response of typeURL.
	answer func(typeURL string)
	// recv reads the next response: its type and what it tells.
	recv func() (string, []string)
}

// tell describes a resource as warmClient does.
func tell(t *testing.T, a *anypb.Any) string {
	t.Helper()
	m, err := a.UnmarshalNew()
	if err != nil {
		t.Fatal(err)
	}
	switch m := m.(type) {
	case *clusterpb.Cluster:
		return "Cluster " + m.GetName()
	case *endpointpb.ClusterLoadAssignment:
		return "ClusterLoadAssignment " + m.GetClusterName()
	case *routepb.RouteConfiguration:
		return "RouteConfiguration " + m.GetName() + "→" + m.GetVirtualHosts()[0].GetRoutes()[0].GetRoute().GetCluster()
	}
	return a.GetTypeUrl()
}

func sotwWarmClient(t *testing.T, s *clientStream[discoverypb.DiscoveryRequest, discoverypb.DiscoveryResponse]) warmClient {
	names, version, nonce := map[string][]string{}, map[string]string{}, map[string]string{}
	first := true
	request := func(typeURL string) {
		req := &discoverypb.DiscoveryRequest{TypeUrl: typeURL, ResourceNames: names[typeURL],
			VersionInfo: version[typeURL], ResponseNonce: nonce[typeURL]}
		if first {
			req.Node, first = &corepb.Node{Id: "envoy"}, false
		}
		s.send(req)
	}
	return warmClient{
		subscribe: func(typeURL string, n ...string) {
			names[typeURL] = n
			request(typeURL)
		},
		answer: request,
		recv: func() (string, []string) {
			resp := s.recv()
			version[resp.GetTypeUrl()], nonce[resp.GetTypeUrl()] = resp.GetVersionInfo(), resp.GetNonce()
			var told []string
			for _, r := range resp.GetResources() {
				told = append(told, tell(t, r))
			}
			return resp.GetTypeUrl(), told
		},
	}
}

func deltaWarmClient(t *testing.T, s *clientStream[discoverypb.DeltaDiscoveryRequest, discoverypb.DeltaDiscoveryResponse]) warmClient {
	names, nonce := map[string][]string{}, map[string]string{}
	first := true
	send := func(req *discoverypb.DeltaDiscoveryRequest) {
		if first {
			req.Node, first = &corepb.Node{Id: "envoy"}, false
		}
		s.send(req)
	}
	return warmClient{
		subscribe: func(typeURL string, n ...string) {
			added := slices.DeleteFunc(slices.Clone(n), func(x string) bool { return slices.Contains(names[typeURL], x) })
			names[typeURL] = n
			send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: typeURL, ResourceNamesSubscribe: added})
		},
		answer: func(typeURL string) {
			send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: typeURL, ResponseNonce: nonce[typeURL]})
		},
		recv: func() (string, []string) {
			resp := s.recv()
			nonce[resp.GetTypeUrl()] = resp.GetNonce()
			var told []string
			for _, r := range resp.GetResources() {
				told = append(told, tell(t, r.GetResource()))
			}
			return resp.GetTypeUrl(), told
		},
	}
}

// warmOrderClients are the ADS clients the tests run with.
var warmOrderClients = map[string]func(*testing.T, discoverypb.AggregatedDiscoveryServiceClient) warmClient{
	"sotw": func(t *testing.T, ads discoverypb.AggregatedDiscoveryServiceClient) warmClient {
		return sotwWarmClient(t, openStream(t, ads.StreamAggregatedResources))
	},
	"delta": func(t *testing.T, ads discoverypb.AggregatedDiscoveryServiceClient) warmClient {
		return deltaWarmClient(t, openStream(t, ads.DeltaAggregatedResources))
	},
}

// warmOrderStart serves c and opens cl on it as Envoy does: every
// Cluster, x's endpoints, Route r. It reads and ACKs Cluster x, its
// endpoints and r→x, then applies a new EDS Cluster y, its endpoints and
// r→y, marked together, and returns the client.
func warmOrderStart(t *testing.T, open func(*testing.T, discoverypb.AggregatedDiscoveryServiceClient) warmClient) warmClient {
	const cds, eds, rds = resourcev3.ClusterType, resourcev3.EndpointType, resourcev3.RouteType
	c := cache.New(cache.Options{Retention: time.Hour, Consistency: cache.Consistency{MaxWait: time.Minute}})
	_, cc := serveOn(t, Options{Groups: oneGroup{c}})
	ads := discoverypb.NewAggregatedDiscoveryServiceClient(cc)
	cl := open(t, ads)
	cl.subscribe(cds, "*")
	cl.subscribe(eds, "x")
	cl.subscribe(rds, "r")
	watched(t, c, eds, "x")
	watched(t, c, rds, "r")
	upsert := func(typeURL string, synced bool, rs ...*cache.Resource) {
		c.Apply(typeURL, cache.Change{Synced: synced, Upserts: rs})
	}
	upsert(eds, false, encodeMsg(t, "x", "1", testcp.Endpoints("x", "127.0.0.1:1")))
	upsert(cds, true, encodeMsg(t, "x", "1", testcp.Cluster("x")))
	upsert(rds, false, route(t, "1", "x"))
	var got []string
	for want := []string{"Cluster x", "ClusterLoadAssignment x", "RouteConfiguration r→x"}; !seen(want...)(got); {
		typ, told := cl.recv()
		got = append(got, told...)
		cl.answer(typ)
	}
	// The cache releases the Route to y once y and its endpoints are in
	// (Consistency), whatever the order they come in.
	upsert(cds, true, encodeMsg(t, "x", "1", testcp.Cluster("x")), encodeMsg(t, "y", "1", testcp.Cluster("y")))
	upsert(rds, false, route(t, "2", "y"))
	upsert(eds, false, encodeMsg(t, "y", "1", testcp.Endpoints("y", "127.0.0.1:2")))
	return cl
}

// Make before break across a new Cluster's warming (warmorder.go;
// "Eventual consistency considerations": EDS after CDS for the respective
// clusters, RDS after CDS/EDS): a new EDS Cluster y and a Route to it
// marked together reach a client that behaves as Envoy (it asks for y's
// endpoints once it reads y, then ACKs the Clusters) as Cluster y, then
// y's endpoints, then the Route. Without the hold, the Route went right
// behind the Cluster, while y still warmed.
func TestNewClusterWarmsBeforeTheRouteToIt(t *testing.T) {
	const cds, eds = resourcev3.ClusterType, resourcev3.EndpointType
	for name, open := range warmOrderClients {
		t.Run(name, func(t *testing.T) {
			cl := warmOrderStart(t, open)
			var got []string
			asked := false
			for !slices.Contains(got, "RouteConfiguration r→y") {
				typ, told := cl.recv()
				got = append(got, told...)
				if typ == cds && slices.Contains(told, "Cluster y") && !asked {
					asked = true
					cl.subscribe(eds, "x", "y") // as Envoy: the new Cluster's endpoints, then the ACK
				}
				cl.answer(typ)
			}
			i, j, k := slices.Index(got, "Cluster y"), slices.Index(got, "ClusterLoadAssignment y"), slices.Index(got, "RouteConfiguration r→y")
			if i < 0 || j < i || k < j {
				t.Fatalf("the client was told %v: want Cluster y, then its endpoints, then the Route to it", got)
			}
		})
	}
}

// The hold is bounded (warmHoldMax): a client that reads the new Cluster
// and never answers it, nor asks for its endpoints, is sent the Route all
// the same.
func TestRouteHeldBehindAWarmingClusterIsBounded(t *testing.T) {
	const cds = resourcev3.ClusterType
	for name, open := range warmOrderClients {
		t.Run(name, func(t *testing.T) {
			cl := warmOrderStart(t, open)
			var got []string
			for !slices.Contains(got, "RouteConfiguration r→y") { // recv's wait is bounded
				typ, told := cl.recv()
				got = append(got, told...)
				if typ != cds {
					cl.answer(typ)
				}
			}
			if i, k := slices.Index(got, "Cluster y"), slices.Index(got, "RouteConfiguration r→y"); i < 0 || k < i {
				t.Fatalf("the client was told %v: want Cluster y, then the Route to it", got)
			}
		})
	}
}

// The hold ends on the client's answer on CDS to the response that started
// or last extended it, and wakes the stream to send what it kept back; an
// answer to an older response, or a nonce that does not parse, leaves it
// on (warmHoldMax still bounds it).
func TestWarmHoldEndsOnTheClustersAnswer(t *testing.T) {
	const rds = resourcev3.RouteType
	b := &streamBase{watch: cache.NewWatch()}
	h := &warmHold{on: true, nonce: 5, until: time.Now().Add(time.Hour), timer: time.AfterFunc(time.Hour, func() {}),
		parked: []*cache.Dirty{{TypeURL: rds}}}
	b.hold = h
	defer b.endHold()
	woken := func() bool {
		select {
		case <-b.watch.Ready():
			return true
		default:
			return false
		}
	}
	for _, nonce := range []string{"", "x", "-1", "4", "99999999999999999999999"} {
		b.answeredClusters(nonce)
		if !h.on || woken() {
			t.Fatalf("the answer with nonce %q ended the hold of the response 5", nonce)
		}
		if d := b.unheld(nil); len(d) != 0 {
			t.Fatalf("the hold let %d types out after the answer with nonce %q", len(d), nonce)
		}
	}
	b.answeredClusters("5")
	if h.on || !woken() {
		t.Fatalf("the answer to the response 5 left the hold on (%v) or did not wake the stream", h.on)
	}
	if d := b.unheld(nil); len(d) != 1 || d[0].TypeURL != rds {
		t.Fatalf("after the hold, the flush has %v, want the Routes kept back", d)
	}
}
