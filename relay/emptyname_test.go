package relay

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"slices"
	"testing"
	"time"

	clustersvc "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointsvc "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// The empty name is a name, of a resource that never exists: it neither
// ends a stream nor makes a wildcard subscriber, and it is never subscribed
// upstream.
func startEmptyNameRelay(t *testing.T) (*testcp.ControlPlane, *Relay) {
	t.Helper()
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("x"), testcp.Cluster("y"), testcp.Endpoints("x", "10.0.0.1:80"))
	r := startRelay(t, cp.Addr, func(c *Config) {
		c.Downstream.RESTAddress = "127.0.0.1:0"
		c.Downstream.PollTimeout = wait
	})
	return cp, r
}

func checkNotSubscribedUpstream(t *testing.T, cp *testcp.ControlPlane) {
	t.Helper()
	if n := upstreamCount(cp, "", false); n != 0 {
		t.Fatalf(`"" subscribed upstream %d times`, n)
	}
}

// SotW, on ADS and on the per-type services: [""] is answered at once with
// no resources (the client holds none), as go-control-plane answers it; a
// change of another resource does not reach the client, and a following
// subscription on the same stream is answered.
func TestSotWEmptyName(t *testing.T) {
	cp, r := startEmptyNameRelay(t)
	cc := dial(t, r.Addr())
	open := map[string]func(t *testing.T) *sotwStream{
		"ADS": func(t *testing.T) *sotwStream { return openSotW(t, r.Addr()) },
		"per-type": func(t *testing.T) *sotwStream {
			return newStream(t, clustersvc.NewClusterDiscoveryServiceClient(cc).StreamClusters)
		},
	}
	perTypeEDS := func(t *testing.T) *sotwStream {
		return newStream(t, endpointsvc.NewEndpointDiscoveryServiceClient(cc).StreamEndpoints)
	}
	cases := []struct {
		name    string
		open    func(t *testing.T) *sotwStream
		typeURL string
	}{
		{"ADS CDS", open["ADS"], resourcev3.ClusterType},
		{"ADS EDS", open["ADS"], resourcev3.EndpointType},
		{"per-type CDS", open["per-type"], resourcev3.ClusterType},
		{"per-type EDS", perTypeEDS, resourcev3.EndpointType},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.open(t)
			s.send(&discoverypb.DiscoveryRequest{Node: node("empty-"+tc.name, "c1"), TypeUrl: tc.typeURL, ResourceNames: []string{""}})
			resp := s.recv()
			if len(resp.GetResources()) != 0 || resp.GetTypeUrl() != tc.typeURL {
				t.Fatalf(`[""]: %v`, resp)
			}
			s.send(&discoverypb.DiscoveryRequest{TypeUrl: tc.typeURL, ResourceNames: []string{""},
				VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()})
			s.quiet(100 * time.Millisecond) // the ACK changes nothing
			s.send(&discoverypb.DiscoveryRequest{TypeUrl: tc.typeURL, ResourceNames: []string{"", "x"},
				VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()})
			resp = s.recv()
			if got := resourceNames(t, resp); !slices.Equal(got, []string{"x"}) {
				t.Fatalf(`after subscribing x: %v`, got)
			}
		})
	}
	checkNotSubscribedUpstream(t, cp)
}

func resourceNames(t *testing.T, resp *discoverypb.DiscoveryResponse) []string {
	t.Helper()
	var out []string
	for _, a := range resp.GetResources() {
		out = append(out, resourceName(t, a))
	}
	slices.Sort(out)
	return out
}

// Incremental, on ADS and on the per-type services: "" comes back in
// removed_resources, whether subscribed or claimed in
// initial_resource_versions; unsubscribing it is harmless; the stream goes
// on serving.
func TestDeltaEmptyName(t *testing.T) {
	cp, r := startEmptyNameRelay(t)
	cc := dial(t, r.Addr())
	cases := []struct {
		name    string
		open    func(t *testing.T) *deltaStream
		typeURL string
	}{
		{"ADS", func(t *testing.T) *deltaStream { return openDelta(t, r.Addr()) }, resourcev3.ClusterType},
		{"per-type CDS", func(t *testing.T) *deltaStream {
			return newStream(t, clustersvc.NewClusterDiscoveryServiceClient(cc).DeltaClusters)
		}, resourcev3.ClusterType},
		{"per-type EDS", func(t *testing.T) *deltaStream {
			return newStream(t, endpointsvc.NewEndpointDiscoveryServiceClient(cc).DeltaEndpoints)
		}, resourcev3.EndpointType},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.open(t)
			s.send(&discoverypb.DeltaDiscoveryRequest{Node: node("empty-"+tc.name, "c1"), TypeUrl: tc.typeURL,
				ResourceNamesSubscribe: []string{""}})
			if resp := s.recv(); len(resp.GetResources()) != 0 || !slices.Equal(resp.GetRemovedResources(), []string{""}) {
				t.Fatalf(`subscribing "": %v`, resp)
			}
			s.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: tc.typeURL, ResourceNamesUnsubscribe: []string{""}})
			s.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: tc.typeURL, ResourceNamesSubscribe: []string{"x"}})
			if got := deltaNames(s.recv()); !slices.Equal(got, []string{"x"}) {
				t.Fatalf("after subscribing x: %v", got)
			}
		})
		t.Run(tc.name+" initial_resource_versions", func(t *testing.T) {
			s := tc.open(t)
			s.send(&discoverypb.DeltaDiscoveryRequest{Node: node("resume-"+tc.name, "c1"), TypeUrl: tc.typeURL,
				ResourceNamesSubscribe: []string{"", "x"}, InitialResourceVersions: map[string]string{"": "1"}})
			seen, removed := map[string]bool{}, []string{}
			for !seen["x"] || len(removed) == 0 {
				resp := s.recv()
				for _, n := range deltaNames(resp) {
					seen[n] = true
				}
				removed = append(removed, resp.GetRemovedResources()...)
			}
			if !slices.Equal(removed, []string{""}) {
				t.Fatalf(`removed %q, want [""]`, removed)
			}
		})
	}
	checkNotSubscribedUpstream(t, cp)
}

// Polling, gRPC Fetch and REST-JSON: [""] is answered at once with no
// resources, not held until the poll deadline, and is no wildcard.
func TestPollingEmptyName(t *testing.T) {
	cp, r := startEmptyNameRelay(t)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	cds := clustersvc.NewClusterDiscoveryServiceClient(dial(t, r.Addr()))
	resp, err := cds.FetchClusters(ctx, &discoverypb.DiscoveryRequest{Node: node("fetch", "c1"), ResourceNames: []string{""}})
	if err != nil || len(resp.GetResources()) != 0 {
		t.Fatalf(`Fetch [""]: %v %v`, resp, err)
	}
	resp, err = cds.FetchClusters(ctx, &discoverypb.DiscoveryRequest{Node: node("fetch", "c1"), ResourceNames: []string{"", "x"}})
	if err != nil || !slices.Equal(resourceNames(t, resp), []string{"x"}) {
		t.Fatalf(`Fetch ["", x]: %v %v`, resp, err)
	}

	url := "http://" + r.RESTAddr() + "/v3/discovery:clusters"
	for names, want := range map[string][]string{`[""]`: nil, `["", "x"]`: {"x"}} {
		body := `{"node": {"id": "rest", "cluster": "c1"}, "resourceNames": ` + names + `}`
		hresp, err := http.Post(url, "application/json", bytes.NewReader([]byte(body)))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(hresp.Body)
		hresp.Body.Close()
		out := &discoverypb.DiscoveryResponse{}
		if hresp.StatusCode != http.StatusOK || protojson.Unmarshal(b, out) != nil {
			t.Fatalf("REST %s: %d %s", names, hresp.StatusCode, b)
		}
		if got := resourceNames(t, out); !slices.Equal(got, want) {
			t.Fatalf("REST %s: %v, want %v", names, got, want)
		}
	}
	checkNotSubscribedUpstream(t, cp)
}
