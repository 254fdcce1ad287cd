package downstream

import (
	"sync"
	"testing"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/xdsrelay/xdsrelay/cache"
)

// callerGroups records who joins.
type callerGroups struct {
	c      *cache.Cache
	mu     sync.Mutex
	joined []Caller
}

func (g *callerGroups) Join(_ *corepb.Node, from Caller) (*cache.Cache, func(), error) {
	g.mu.Lock()
	g.joined = append(g.joined, from)
	g.mu.Unlock()
	return g.c, func() {}, nil
}

func (g *callerGroups) last() Caller {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.joined) == 0 {
		return Caller{}
	}
	return g.joined[len(g.joined)-1]
}

// The groups are told who joins: the stream's variant and the client's
// address, by which CloseConnection ends the client's connection (its
// streams end with UNAVAILABLE), once.
func TestJoinIsToldTheCallerAndItsConnectionCanBeClosed(t *testing.T) {
	g := &callerGroups{c: cache.New(cache.Options{})}
	s, cc := serveOn(t, Options{Groups: g})
	st := openStream(t, discoverypb.NewAggregatedDiscoveryServiceClient(cc).DeltaAggregatedResources)
	st.send(&discoverypb.DeltaDiscoveryRequest{Node: &corepb.Node{Id: "n"}, TypeUrl: resourcev3.ClusterType,
		ResourceNamesSubscribe: []string{"a"}})
	var who Caller
	eventually(t, "the stream to join", func() bool { who = g.last(); return who.Addr != "" })
	if who.Variant != "delta-ads" || len(who.Identities) != 0 {
		t.Fatalf("joined as %+v", who)
	}
	if !s.CloseConnection(who.Addr) {
		t.Fatal("no connection from the caller's address")
	}
	if err := st.ended(); status.Code(err) != codes.Unavailable {
		t.Fatalf("the stream ended with %v, want UNAVAILABLE", err)
	}
	if s.CloseConnection(who.Addr) {
		t.Fatal("a connection closed twice")
	}
}
