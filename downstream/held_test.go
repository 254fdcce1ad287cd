package downstream

import (
	"slices"
	"strings"
	"testing"
	"time"

	clusterpb "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

const cds = resourcev3.ClusterType

// heldWaitTest is Options.HeldWait in these tests.
const heldWaitTest = 500 * time.Millisecond

// heldGroup serves a group whose cache keeps what nobody watches, with a
// HeldWait of heldWaitTest.
func heldGroup(t *testing.T) (*cache.Cache, *grpc.ClientConn, *Server) {
	t.Helper()
	c := cache.New(cache.Options{Retention: time.Hour})
	s, cc := serveOn(t, Options{Groups: oneGroup{c}, HeldWait: heldWaitTest})
	return c, cc, s
}

// upsert applies Cluster name at version to c.
func upsert(t *testing.T, c *cache.Cache, name, version string) {
	t.Helper()
	c.Apply(cds, cache.Change{Upserts: []*cache.Resource{encoded(t, cds, name, version, 0)}})
}

// sotwNames are the names of a SotW response's resources.
func sotwNames(t *testing.T, resp *discoverypb.DiscoveryResponse) []string {
	t.Helper()
	var out []string
	for _, a := range resp.GetResources() {
		c := &clusterpb.Cluster{}
		if err := a.UnmarshalTo(c); err != nil {
			t.Fatal(err)
		}
		out = append(out, c.GetName())
	}
	return out
}

// An error is never absence (docs/architecture.md, invariant 21): a
// client that comes back with the version it holds (a reconnect, a relay
// restarted) and names Clusters x and y is never sent a state without x
// while the relay lacks x, whether x is still coming or UNAVAILABLE: the
// state is held, a change of y with it, and after HeldWait the stream ends
// with UNAVAILABLE naming x, counted. Should x arrive in time, the whole
// state goes out.
func TestHeldStateNeverLeavesOutWhatTheClientHolds(t *testing.T) {
	node := &corepb.Node{Id: "n1", Cluster: "c1"}
	for _, tc := range []struct {
		name string
		x    func(c *cache.Cache)
	}{
		{"still coming", func(*cache.Cache) {}},
		{"unavailable", func(c *cache.Cache) {
			c.Apply(cds, cache.Change{Errors: []*cache.ResourceError{xds.NewError("x", codes.Unavailable, "no server reachable")}})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, cc, m := heldGroup(t)
			st := openStream(t, discoverypb.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources)
			st.send(&discoverypb.DiscoveryRequest{Node: node, TypeUrl: cds, ResourceNames: []string{"x", "y"}, VersionInfo: "7"})
			watched(t, c, cds, "x", "y")
			upsert(t, c, "y", "1")
			tc.x(c)
			upsert(t, c, "y", "2")
			start := time.Now()
			err := st.ended()
			if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), `Cluster "x" is not available`) {
				t.Fatalf("the stream ended with %v, want UNAVAILABLE naming x", err)
			}
			if took := time.Since(start); took > heldWaitTest+time.Second {
				t.Errorf("the stream ended %v after the state was held, want about %v", took, heldWaitTest)
			}
			if got := m.heldEnds.With("Cluster").Get(); got != 1 {
				t.Errorf("xdsrelay_downstream_held_ends_total{type=Cluster} %v, want 1", got)
			}
		})
	}
	t.Run("arrives in time", func(t *testing.T) {
		c, cc, _ := heldGroup(t)
		st := openStream(t, discoverypb.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources)
		st.send(&discoverypb.DiscoveryRequest{Node: node, TypeUrl: cds, ResourceNames: []string{"x", "y"}, VersionInfo: "7"})
		watched(t, c, cds, "x", "y")
		upsert(t, c, "y", "1")
		st.quiet(heldWaitTest / 4)
		upsert(t, c, "x", "1")
		if got := sotwNames(t, st.recv()); !slices.Equal(got, []string{"x", "y"}) {
			t.Fatalf("the state once x arrived: %v, want [x y]", got)
		}
		st.quiet(heldWaitTest + 100*time.Millisecond) // and the stream goes on
	})
}

// A client that holds nothing of the type (its first request carries no
// version: a new client, or a relay below, which keeps no version across
// streams and reads resource_errors) is sent what the relay has at once:
// each name left out carries an error, x's own UNAVAILABLE or, for a name
// not received yet, the relay's. A name it asks for later on the stream
// is new to it: left out without being held for.
func TestNewClientGetsWhatTheRelayHas(t *testing.T) {
	c, cc, m := heldGroup(t)
	st := openStream(t, discoverypb.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources)
	st.send(&discoverypb.DiscoveryRequest{Node: &corepb.Node{Id: "n1", Cluster: "c1"}, TypeUrl: cds, ResourceNames: []string{"w", "x", "y"}})
	watched(t, c, cds, "w", "x", "y")
	c.Apply(cds, cache.Change{Errors: []*cache.ResourceError{xds.NewError("x", codes.Unavailable, "no server reachable")}})
	upsert(t, c, "y", "1")
	first := st.recv()
	codesOf := map[string]codes.Code{}
	for _, e := range first.GetResourceErrors() {
		codesOf[e.GetResourceName().GetName()] = codes.Code(e.GetErrorDetail().GetCode())
	}
	if got := sotwNames(t, first); !slices.Equal(got, []string{"y"}) ||
		codesOf["w"] != codes.Unavailable || codesOf["x"] != codes.Unavailable || len(codesOf) != 2 {
		t.Fatalf("first state %v with errors %v, want [y] with UNAVAILABLE for w and x", got, codesOf)
	}
	if got := m.resourceErrors.With("Cluster", "UNAVAILABLE").Get(); got != 2 {
		t.Errorf("xdsrelay_resource_errors_total{Cluster,UNAVAILABLE} %v, want 2", got)
	}
	ack := func(resp *discoverypb.DiscoveryResponse, names ...string) {
		st.send(&discoverypb.DiscoveryRequest{TypeUrl: cds, ResourceNames: names, VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()})
	}
	ack(first, "w", "x", "y", "z")
	watched(t, c, cds, "w", "x", "y", "z")
	upsert(t, c, "y", "2")
	next := st.recv()
	if got := sotwNames(t, next); !slices.Equal(got, []string{"y"}) || len(next.GetResourceErrors()) != 0 {
		t.Fatalf("y's change: %v with errors %v, want [y] alone (the errors were sent)", got, next.GetResourceErrors())
	}
	ack(next, "w", "x", "y", "z")
	upsert(t, c, "x", "1")
	if got := sotwNames(t, st.recv()); !slices.Equal(got, []string{"x", "y"}) {
		t.Fatalf("once x arrived: %v, want [x y]", got)
	}
}
