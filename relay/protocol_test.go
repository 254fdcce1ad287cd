package relay

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	clustersvc "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointsvc "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	listenersvc "github.com/envoyproxy/go-control-plane/envoy/service/listener/v3"
	routesvc "github.com/envoyproxy/go-control-plane/envoy/service/route/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// "RPC Services and Methods for Each Variant": every per-type service, SotW
// and incremental, serves its type; a client's per-type streams join the
// group its ADS stream would, so the control plane still sees one stream.
func TestPerTypeServicesShareTheGroup(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Listener("l", "r"), testcp.Route("r", "c"), testcp.Cluster("c"), testcp.Endpoints("c", "10.0.0.1:80"))
	r := startRelay(t, cp.Addr)
	cc := dial(t, r.Addr())

	sotw := map[string]func(context.Context) (sotwClient, error){
		resourcev3.ListenerType: func(ctx context.Context) (sotwClient, error) {
			return listenersvc.NewListenerDiscoveryServiceClient(cc).StreamListeners(ctx)
		},
		resourcev3.RouteType: func(ctx context.Context) (sotwClient, error) {
			return routesvc.NewRouteDiscoveryServiceClient(cc).StreamRoutes(ctx)
		},
		resourcev3.ClusterType: func(ctx context.Context) (sotwClient, error) {
			return clustersvc.NewClusterDiscoveryServiceClient(cc).StreamClusters(ctx)
		},
		resourcev3.EndpointType: func(ctx context.Context) (sotwClient, error) {
			return endpointsvc.NewEndpointDiscoveryServiceClient(cc).StreamEndpoints(ctx)
		},
	}
	delta := map[string]func(context.Context) (deltaClient, error){
		resourcev3.ListenerType: func(ctx context.Context) (deltaClient, error) {
			return listenersvc.NewListenerDiscoveryServiceClient(cc).DeltaListeners(ctx)
		},
		resourcev3.RouteType: func(ctx context.Context) (deltaClient, error) {
			return routesvc.NewRouteDiscoveryServiceClient(cc).DeltaRoutes(ctx)
		},
		resourcev3.ClusterType: func(ctx context.Context) (deltaClient, error) {
			return clustersvc.NewClusterDiscoveryServiceClient(cc).DeltaClusters(ctx)
		},
		resourcev3.EndpointType: func(ctx context.Context) (deltaClient, error) {
			return endpointsvc.NewEndpointDiscoveryServiceClient(cc).DeltaEndpoints(ctx)
		},
	}
	names := map[string]string{resourcev3.ListenerType: "l", resourcev3.RouteType: "r", resourcev3.ClusterType: "c", resourcev3.EndpointType: "c"}
	for typeURL, open := range sotw {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		st, err := open(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// A per-type request may leave type_url empty.
		if err := st.Send(&discoverypb.DiscoveryRequest{Node: node("n", "c1"), ResourceNames: []string{names[typeURL]}}); err != nil {
			t.Fatal(err)
		}
		resp, err := st.Recv()
		if err != nil || resp.GetTypeUrl() != typeURL || len(resp.GetResources()) != 1 {
			t.Fatalf("SotW %s: %v %v", typeURL, resp, err)
		}
		cancel()
	}
	for typeURL, open := range delta {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		st, err := open(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "c1"), TypeUrl: typeURL, ResourceNamesSubscribe: []string{names[typeURL]}}); err != nil {
			t.Fatal(err)
		}
		resp, err := st.Recv()
		if err != nil || resp.GetTypeUrl() != typeURL || len(resp.GetResources()) != 1 {
			t.Fatalf("delta %s: %v %v", typeURL, resp, err)
		}
		cancel()
	}
	if n := cp.DeltaStreams.Load(); n != 1 {
		t.Fatalf("control plane saw %d streams for one node's per-type streams, want 1", n)
	}
}

type (
	sotwClient = interface {
		Send(*discoverypb.DiscoveryRequest) error
		Recv() (*discoverypb.DiscoveryResponse, error)
	}
	deltaClient = interface {
		Send(*discoverypb.DeltaDiscoveryRequest) error
		Recv() (*discoverypb.DeltaDiscoveryResponse, error)
	}
)

// The SotW example of "How the client specifies what resources to return":
// unset is *, then * and A, then A alone, then unset unsubscribes A.
func TestSotWWildcardExample(t *testing.T) {
	cp := testcp.Start(t)
	eds, eds2 := testcp.Endpoints("e", "10.0.0.1:80"), testcp.Endpoints("e2", "10.0.0.2:80")
	cp.Set(t, "c1", "1", testcp.Cluster("A"), testcp.Cluster("B"), eds, eds2)
	r := startRelay(t, cp.Addr)
	s := openSotW(t, r.Addr())
	ack := func(resp *discoverypb.DiscoveryResponse, names ...string) *discoverypb.DiscoveryRequest {
		return &discoverypb.DiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResourceNames: names,
			VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}
	}
	s.send(&discoverypb.DiscoveryRequest{Node: node("n", "c1"), TypeUrl: resourcev3.ClusterType})
	resp := s.recv()
	if got := sotwClusters(t, resp); !slices.Equal(got, []string{"A", "B"}) {
		t.Fatalf("step 1 (unset = *): %v", got)
	}
	// Step 2: A is newly named, so it is sent again, in the full state.
	s.send(ack(resp, "*", "A"))
	resp = s.recv()
	if got := sotwClusters(t, resp); !slices.Equal(got, []string{"A", "B"}) {
		t.Fatalf("step 2 (* and A): %v", got)
	}
	s.send(ack(resp, "*", "A"))
	s.quiet(100 * time.Millisecond) // an ACK changes nothing
	// Step 3: A alone: * is dropped (no response is needed), A continues.
	s.send(ack(resp, "A"))
	s.quiet(100 * time.Millisecond)
	// A request on another type is answered once the ones before it are
	// processed: after it, upstream changes meet the new subscription.
	edsNonce := ""
	barrier := func(names ...string) {
		s.send(&discoverypb.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: names, ResponseNonce: edsNonce})
		got := s.recv()
		if got.GetTypeUrl() != resourcev3.EndpointType {
			t.Fatalf("barrier: got a %s response", got.GetTypeUrl())
		}
		edsNonce = got.GetNonce()
	}
	barrier("e")
	a2, b2 := testcp.Cluster("A"), testcp.Cluster("B")
	a2.ConnectTimeout.Seconds, b2.ConnectTimeout.Seconds = 2, 2
	cp.Set(t, "c1", "2", a2, b2, eds, eds2)
	resp = s.recv()
	if got := sotwClusters(t, resp); !slices.Equal(got, []string{"A"}) {
		t.Fatalf("step 3 (A only): the next full state is %v", got)
	}
	// Step 4: unset, after names were given, unsubscribes A; it is not the
	// wildcard again, so neither a change to A nor a new cluster is sent.
	s.send(ack(resp))
	s.quiet(100 * time.Millisecond)
	barrier("e", "e2")
	a3 := testcp.Cluster("A")
	a3.ConnectTimeout.Seconds = 3
	cp.Set(t, "c1", "3", a3, b2, testcp.Cluster("C"), eds, testcp.Endpoints("e2", "10.0.0.3:80"))
	if got := s.recv(); got.GetTypeUrl() != resourcev3.EndpointType {
		t.Fatalf("step 4: a %s response, want only the EDS for e2", got.GetTypeUrl())
	}
	s.quiet(200 * time.Millisecond)
}

// The incremental example of "How the client specifies what resources to
// return", and the wildcard-plus-name exception of "Unsubscribing from
// Resources".
func TestDeltaWildcardExample(t *testing.T) {
	cp := testcp.Start(t)
	eds := testcp.Endpoints("e", "10.0.0.1:80")
	cp.Set(t, "c1", "1", testcp.Cluster("A"), testcp.Cluster("B"), eds)
	r := startRelay(t, cp.Addr)
	s := openDelta(t, r.Addr())
	s.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "c1"), TypeUrl: resourcev3.ClusterType})
	if got := deltaNames(s.recv()); !slices.Equal(got, []string{"A", "B"}) {
		t.Fatalf("step 1 (unset = *): %v", got)
	}
	// Step 2: * continues and A is added; A is answered although unchanged
	// ("Subscribing to Resources").
	s.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"A"}})
	if got := deltaNames(s.recv()); !slices.Equal(got, []string{"A"}) {
		t.Fatalf("step 2: %v", got)
	}
	// The exception: dropping A while * still covers it answers A.
	s.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResourceNamesUnsubscribe: []string{"A"}})
	if got := deltaNames(s.recv()); !slices.Equal(got, []string{"A"}) {
		t.Fatalf("wildcard-plus-name unsubscribe: %v, want A in resources", got)
	}
	s.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"A"}})
	s.recv()
	// Step 3: unsubscribe *: A stays; B's changes no longer come.
	s.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResourceNamesUnsubscribe: []string{"*"}})
	// Re-subscribing e is answered once the requests before it are
	// processed: after it, upstream changes meet the new subscription.
	barrier := func() {
		s.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: []string{"e"}})
		if got := s.recv(); got.GetTypeUrl() != resourcev3.EndpointType {
			t.Fatalf("barrier: got a %s response", got.GetTypeUrl())
		}
	}
	barrier()
	changedB := testcp.Cluster("B")
	changedB.ConnectTimeout.Seconds = 9
	cp.Set(t, "c1", "2", testcp.Cluster("A"), changedB, eds)
	s.quiet(200 * time.Millisecond)
	// Step 4: unsubscribe A: nothing is subscribed, and it is not a wildcard.
	s.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResourceNamesUnsubscribe: []string{"A"}})
	barrier()
	changedA := testcp.Cluster("A")
	changedA.ConnectTimeout.Seconds = 9
	cp.Set(t, "c1", "3", changedA, changedB, testcp.Cluster("C"), eds)
	s.quiet(200 * time.Millisecond)
	// Phantom unsubscribes are ignored ("Unsubscribing from Resources").
	s.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResourceNamesUnsubscribe: []string{"never"}})
	s.quiet(100 * time.Millisecond)
	s.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"C"}})
	if got := deltaNames(s.recv()); !slices.Equal(got, []string{"C"}) {
		t.Fatalf("after a phantom unsubscribe the stream still works: %v", got)
	}
}

// "EDS update race motivates nonces": a SotW request with a stale nonce is
// not answered; incremental subscription changes are honoured whatever the
// nonce ("Incremental xDS").
func TestStaleNonces(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Endpoints("a", "10.0.0.1:80"), testcp.Endpoints("b", "10.0.0.2:80"))
	r := startRelay(t, cp.Addr)

	s := openSotW(t, r.Addr())
	s.send(&discoverypb.DiscoveryRequest{Node: node("n", "c1"), TypeUrl: resourcev3.EndpointType, ResourceNames: []string{"a"}})
	resp := s.recv()
	s.send(&discoverypb.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: []string{"a", "b"}, ResponseNonce: "stale"})
	s.quiet(200 * time.Millisecond)
	s.send(&discoverypb.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: []string{"a", "b"}, ResponseNonce: resp.GetNonce()})
	if len(s.recv().GetResources()) != 1 {
		t.Fatal("a request with the current nonce adding b was not answered with b")
	}

	d := openDelta(t, r.Addr())
	d.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "c1"), TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: []string{"a"}})
	d.recv()
	d.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: []string{"b"}, ResponseNonce: "stale"})
	if got := deltaNames(d.recv()); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("incremental subscribe with a stale nonce: %v", got)
	}
}

// "Knowing When a Requested Resource Does Not Exist" (incremental): a name
// that does not exist comes back in removed_resources, and in resources once
// it appears; a deletion upstream is passed on.
func TestDeltaNotFound(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cluster := func(name string) string {
		return "\"@type\": type.googleapis.com/envoy.config.cluster.v3.Cluster\nname: " + name + "\nconnect_timeout: 1s\n"
	}
	write("a.yaml", cluster("a"))
	r := startRelay(t, FilePrefix+dir)
	s := openDelta(t, r.Addr())
	s.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "c1"), TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"a", "late"}})
	seen, removed := map[string]bool{}, []string{}
	for !seen["a"] || len(removed) == 0 {
		resp := s.recv()
		for _, n := range deltaNames(resp) {
			seen[n] = true
		}
		removed = append(removed, resp.GetRemovedResources()...)
	}
	if !slices.Equal(removed, []string{"late"}) {
		t.Fatalf("removed %v, want [late]", removed)
	}
	write("late.yaml", cluster("late"))
	if got := deltaNames(s.recv()); !slices.Equal(got, []string{"late"}) {
		t.Fatalf("once it exists: %v", got)
	}
	if err := os.Remove(filepath.Join(dir, "a.yaml")); err != nil {
		t.Fatal(err)
	}
	if resp := s.recv(); !slices.Equal(resp.GetRemovedResources(), []string{"a"}) {
		t.Fatalf("after deleting a: removed %v", resp.GetRemovedResources())
	}
}

// With go-control-plane upstream, a name that does not exist is known once
// the group's wildcard is synced (the wildcard is the complete set), and is
// answered in removed_resources.
func TestDeltaNotFoundFromTheWildcardSet(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("x"))
	r := startRelay(t, cp.Addr)
	envoy := openDelta(t, r.Addr())
	envoy.send(&discoverypb.DeltaDiscoveryRequest{Node: node("envoy", "c1"), TypeUrl: resourcev3.ClusterType})
	envoy.recv()
	grpcClient := openDelta(t, r.Addr())
	grpcClient.send(&discoverypb.DeltaDiscoveryRequest{Node: node("grpc", "c1"), TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"x", "missing"}})
	seen, removed := map[string]bool{}, []string{}
	for !seen["x"] || len(removed) == 0 {
		resp := grpcClient.recv()
		for _, n := range deltaNames(resp) {
			seen[n] = true
		}
		removed = append(removed, resp.GetRemovedResources()...)
	}
	if !slices.Equal(removed, []string{"missing"}) {
		t.Fatalf("removed %v, want [missing]", removed)
	}
	cp.Set(t, "c1", "2", testcp.Cluster("x"), testcp.Cluster("missing"))
	for {
		if got := deltaNames(grpcClient.recv()); slices.Contains(got, "missing") {
			break
		}
	}
}

// Bad input ends only the offending stream, with INVALID_ARGUMENT and a
// message; other clients keep being served.
func TestBadInputEndsOnlyThatStream(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("x"))
	r := startRelay(t, cp.Addr)
	good := openDelta(t, r.Addr())
	good.send(&discoverypb.DeltaDiscoveryRequest{Node: node("good", "c1"), TypeUrl: resourcev3.ClusterType})
	good.recv()

	cases := map[string][]*discoverypb.DeltaDiscoveryRequest{
		"unknown type": {{Node: node("n", "c1"), TypeUrl: "type.googleapis.com/not.a.Type"}},
		"no type":      {{Node: node("n", "c1")}},
		"no node":      {{TypeUrl: resourcev3.ClusterType}},
		"node changed": {
			{Node: node("n", "c1"), TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"x"}},
			{Node: node("other", "c1"), TypeUrl: resourcev3.ClusterType},
		},
	}
	for name, reqs := range cases {
		t.Run(name, func(t *testing.T) {
			cc := dial(t, r.Addr())
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			st, err := discoverypb.NewAggregatedDiscoveryServiceClient(cc).DeltaAggregatedResources(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, req := range reqs {
				if err := st.Send(req); err != nil {
					t.Fatal(err)
				}
			}
			for {
				_, err = st.Recv()
				if err != nil {
					break
				}
			}
			if grpcstatus.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "xdsrelay:") {
				t.Fatalf("stream ended with %v, want INVALID_ARGUMENT with a message", err)
			}
		})
	}
	changed := testcp.Cluster("x")
	changed.ConnectTimeout.Seconds = 5
	cp.Set(t, "c1", "2", changed)
	if got := deltaNames(good.recv()); !slices.Equal(got, []string{"x"}) {
		t.Fatalf("the well-behaved client: %v", got)
	}
}

// NACKs are counted per type on /metrics.
func TestNACKsOnMetrics(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("x"))
	r := startRelay(t, cp.Addr)
	s := openSotW(t, r.Addr())
	s.send(&discoverypb.DiscoveryRequest{Node: node("n", "c1"), TypeUrl: resourcev3.ClusterType})
	resp := s.recv()
	s.send(&discoverypb.DiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResponseNonce: resp.GetNonce(),
		ErrorDetail: &status.Status{Code: 3, Message: "bad cluster"}})
	eventually(t, "the NACK on /metrics", func() bool {
		return strings.Contains(getMetrics(t, r), `xdsrelay_downstream_nacks_total{type="Cluster"} 1`)
	})
}

func getMetrics(t *testing.T, r *Relay) string {
	t.Helper()
	resp, err := http.Get("http://" + r.AdminAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// "REST-JSON polling subscriptions": proto3 JSON in and out; a poll whose
// version_info is current is held until a change, and an unchanged set is
// never answered (304 at the deadline).
func TestRESTPolling(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("x"))
	r := startRelay(t, cp.Addr, func(c *Config) {
		c.Downstream.RESTAddress = "127.0.0.1:0"
		c.Downstream.PollTimeout = time.Second
	})
	url := "http://" + r.RESTAddr() + "/v3/discovery:clusters"
	poll := func(version string) (int, *discoverypb.DiscoveryResponse) {
		t.Helper()
		body, _ := protojson.Marshal(&discoverypb.DiscoveryRequest{Node: node("rest", "c1"), VersionInfo: version})
		resp, err := http.Post(url, "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return resp.StatusCode, nil
		}
		out := &discoverypb.DiscoveryResponse{}
		if err := protojson.Unmarshal(b, out); err != nil {
			t.Fatalf("response is not a DiscoveryResponse: %v: %s", err, b)
		}
		return resp.StatusCode, out
	}
	code, resp := poll("")
	if code != http.StatusOK || len(resp.GetResources()) != 1 {
		t.Fatalf("first poll: %d %v", code, resp)
	}
	if code, _ := poll(resp.GetVersionInfo()); code != http.StatusNotModified {
		t.Fatalf("unchanged poll: %d, want 304", code)
	}
	// A held poll is answered by the change.
	type result struct {
		code int
		resp *discoverypb.DiscoveryResponse
	}
	held := make(chan result, 1)
	go func() {
		code, out := poll(resp.GetVersionInfo())
		held <- result{code, out}
	}()
	cp.Set(t, "c1", "2", testcp.Cluster("x"), testcp.Cluster("y"))
	if res := <-held; res.code != http.StatusOK || len(res.resp.GetResources()) != 2 {
		t.Fatalf("held poll: %d with %d resources, want 200 with 2", res.code, len(res.resp.GetResources()))
	}
	// Bad requests get a clear 4xx.
	for body, want := range map[string]int{"{not json": http.StatusBadRequest, `{"typeUrl": "x", "node": {"id": "a"}}`: http.StatusBadRequest, `{}`: http.StatusBadRequest} {
		resp, err := http.Post(url, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want || !strings.Contains(string(b), "xdsrelay") {
			t.Errorf("POST %s: %d %q, want %d with a message", body, resp.StatusCode, b, want)
		}
	}
}
