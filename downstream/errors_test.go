package downstream

import (
	"slices"
	"strings"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/authz"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

const eds = resourcev3.EndpointType

// watched waits until the group's cache watches exactly names of typeURL:
// the server has handled the request that asks for them.
func watched(t *testing.T, c *cache.Cache, typeURL string, names ...string) {
	t.Helper()
	eventually(t, "the names to be watched", func() bool { return slices.Equal(c.TypeInterest(typeURL).Names, names) })
}

// errorNames are the names of a response's resource_errors.
func errorNames(errs []*discoverypb.ResourceError) []string {
	var out []string
	for _, e := range errs {
		out = append(out, e.GetResourceName().GetName())
	}
	return out
}

// errorGroup is a group whose cache holds endpoints y and an UNAVAILABLE
// error for x once the stream watches both (see watched), and keeps what
// nobody watches (cache.retention).
func errorGroup(t *testing.T) (c *cache.Cache, cc *grpc.ClientConn, fill func()) {
	t.Helper()
	c = cache.New(cache.Options{Retention: time.Hour})
	_, cc = serveOn(t, Options{Groups: oneGroup{c}})
	fill = func() {
		c.Apply(eds, cache.Change{Upserts: []*cache.Resource{encoded(t, eds, "y", "1", 0)},
			Errors: []*cache.ResourceError{xds.NewError("x", codes.Unavailable, "no server reachable")}})
	}
	return c, cc, fill
}

// A per-resource error is sent once, and again to a client that asks for
// the name anew (gRFC A88: the client forgets it with the subscription;
// "the server must resend any newly requested resources"): in SotW after
// the name was dropped and asked for again; in delta also when it is
// subscribed again while subscribed.
func TestErrorSentAgainToANewSubscription(t *testing.T) {
	node := &corepb.Node{Id: "n1", Cluster: "c1"}
	t.Run("sotw", func(t *testing.T) {
		c, cc, fill := errorGroup(t)
		st := openStream(t, discoverypb.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources)
		st.send(&discoverypb.DiscoveryRequest{Node: node, TypeUrl: eds, ResourceNames: []string{"x", "y"}})
		watched(t, c, eds, "x", "y")
		fill()
		first := st.recv()
		if len(first.GetResources()) != 1 || !slices.Equal(errorNames(first.GetResourceErrors()), []string{"x"}) {
			t.Fatalf("first response: %v", first)
		}
		ack := func(names ...string) {
			st.send(&discoverypb.DiscoveryRequest{TypeUrl: eds, ResourceNames: names, VersionInfo: first.GetVersionInfo(), ResponseNonce: first.GetNonce()})
		}
		ack("y") // handled in order: x is dropped, then asked for again
		ack("x", "y")
		again := st.recv()
		if len(again.GetResources()) != 0 || !slices.Equal(errorNames(again.GetResourceErrors()), []string{"x"}) {
			t.Fatalf("x asked for again: %v, want its error alone", again)
		}
	})
	t.Run("delta", func(t *testing.T) {
		c, cc, fill := errorGroup(t)
		st := openStream(t, discoverypb.NewAggregatedDiscoveryServiceClient(cc).DeltaAggregatedResources)
		st.send(&discoverypb.DeltaDiscoveryRequest{Node: node, TypeUrl: eds, ResourceNamesSubscribe: []string{"x", "y"}})
		watched(t, c, eds, "x", "y")
		fill()
		resp := st.recv()
		if len(resp.GetResources()) != 1 || !slices.Equal(errorNames(resp.GetResourceErrors()), []string{"x"}) {
			t.Fatalf("first response: %v", resp)
		}
		for _, step := range []struct {
			what       string
			sub, unsub []string
		}{
			{what: "x subscribed again while subscribed", sub: []string{"x"}},
			{what: "x subscribed again after it was dropped", unsub: []string{"x"}},
		} {
			st.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: eds, ResponseNonce: resp.GetNonce(),
				ResourceNamesSubscribe: step.sub, ResourceNamesUnsubscribe: step.unsub})
			if step.unsub != nil {
				st.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: eds, ResourceNamesSubscribe: []string{"x"}})
			}
			resp = st.recv()
			if len(resp.GetResources()) != 0 || !slices.Equal(errorNames(resp.GetResourceErrors()), []string{"x"}) {
				t.Fatalf("%s: %v, want its error alone", step.what, resp)
			}
		}
	})
}

// A SotW stream whose first request names resources of one type, and
// whose first answer would be errors alone, ends with the error's status
// when the answer comes within Options.AnswerWait; after it, the client is
// sent the errors in a response and the stream goes on.
func TestSotWFirstAnswerOfErrorsWithinTheWait(t *testing.T) {
	const answerWait = 20 * time.Millisecond
	for _, within := range []bool{true, false} {
		c := cache.New(cache.Options{})
		_, cc := serveOn(t, Options{Groups: oneGroup{c}, AnswerWait: map[bool]time.Duration{true: wait, false: answerWait}[within]})
		st := openStream(t, discoverypb.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources)
		st.send(&discoverypb.DiscoveryRequest{Node: &corepb.Node{Id: "n1"}, TypeUrl: eds, ResourceNames: []string{"x"}})
		watched(t, c, eds, "x")
		if !within {
			time.Sleep(25 * answerWait) // not an assertion: the wait passes before the error comes
		}
		c.Apply(eds, cache.Change{Errors: []*cache.ResourceError{xds.NewError("x", codes.Unavailable, "no server reachable")}})
		if within {
			err := st.ended()
			if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), `"x": no server reachable`) {
				t.Errorf("within the wait: the stream ended with %v, want UNAVAILABLE naming x", err)
			}
			continue
		}
		resp := st.recv()
		if len(resp.GetResources()) != 0 || !slices.Equal(errorNames(resp.GetResourceErrors()), []string{"x"}) {
			t.Errorf("after the wait: %v, want x's error in a response", resp)
		}
		st.quiet(50 * time.Millisecond)
	}
}

// The first request of a SotW stream, answered with errors alone, ends the
// stream only if it names resources and nothing else: with the wildcard as
// well, the client is sent the errors and waits for the rest, as the
// stream's wait for its first answer says (awaitsAnswer). Here the error
// is a name its certificate does not allow (PERMISSION_DENIED).
func TestSotWFirstAnswerEndsOnlyANamedSubscription(t *testing.T) {
	rules, err := authz.New([]authz.Rule{{Identity: "spiffe://example.org/a", Authorities: []string{"a.example.com"}}})
	if err != nil {
		t.Fatal(err)
	}
	node := &corepb.Node{Id: "n1"}
	grant, err := rules.Grant([]string{"spiffe://example.org/a"}, node)
	if err != nil {
		t.Fatal(err)
	}
	refused := "xdstp://b.example.com/envoy.config.endpoint.v3.ClusterLoadAssignment/x"
	for _, tc := range []struct {
		names []string
		ends  bool
	}{
		{names: []string{refused}, ends: true},
		{names: []string{"*", refused}},
	} {
		s := benchServer(t)
		var sent []*xds.Message
		ss := &sotwStream{streamBase: s.newStreamBase(func(m any) error { sent = append(sent, m.(*xds.Message)); return nil },
			eds, "sotw", cache.New(cache.Options{}), node)}
		ss.grant, ss.endable = grant, true
		if err := ss.handle(&discoverypb.DiscoveryRequest{Node: node, TypeUrl: eds, ResourceNames: tc.names}); err != nil {
			t.Fatal(err)
		}
		err := ss.flush()
		switch {
		case tc.ends && (status.Code(err) != codes.PermissionDenied || len(sent) != 0):
			t.Errorf("%q: ended with %v after %d responses, want PERMISSION_DENIED and none", tc.names, err, len(sent))
		case !tc.ends && (err != nil || len(sent) != 1):
			t.Errorf("%q: ended with %v after %d responses, want one response", tc.names, err, len(sent))
		}
	}
}
