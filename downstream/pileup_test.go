package downstream

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerpb "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routepb "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// listenerOrRoute is Listener or RouteConfiguration name at version, about
// pad bytes long, as the relay caches it.
func listenerOrRoute(t *testing.T, typeURL, name, version string, pad int) *cache.Resource {
	t.Helper()
	var m proto.Message = &routepb.RouteConfiguration{Name: name, InternalOnlyHeaders: []string{version + strings.Repeat("x", pad)}}
	if typeURL == resourcev3.ListenerType {
		m = &listenerpb.Listener{Name: name, StatPrefix: version + strings.Repeat("x", pad)}
	}
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	r, err := xds.Encode(name, version, a, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// workerSendSlow reports whether a send on a send worker has been blocked
// for slowSend.
func workerSendSlow(s *Server) bool {
	s.sends.mu.Lock()
	defer s.sends.mu.Unlock()
	return s.sends.blocked > 0
}

// Order when changes pile up behind a slow client (docs/architecture.md,
// invariant 7, "Where order is not kept yet"): the control plane sends
// Listener 3, Route 4, Listener 5 while the stream's send is blocked. A
// type's place in the flush is its earliest pending change, and the flush
// sends its latest state: the client gets Listener 5 before Route 4, one
// change ahead of one the control plane sent before it. Latest state wins
// per type, and no order of two types' latest states is the control
// plane's when their changes interleave. The test holds the relay to what
// the architecture says it does; the fix is the reference ordering's.
func TestPiledUpChangesAreSentInTheOrderOfTheirEarliest(t *testing.T) {
	const lds, rds = resourcev3.ListenerType, resourcev3.RouteType
	c := cache.New(cache.Options{Retention: time.Hour})
	s, any := serveOn(t, Options{Groups: oneGroup{c}, SendTimeout: time.Minute})
	cc, err := grpc.NewClient(any.Target(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(16<<20))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := discoverypb.NewAggregatedDiscoveryServiceClient(cc).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	send := func(r *discoverypb.DeltaDiscoveryRequest) {
		t.Helper()
		if err := st.Send(r); err != nil {
			t.Fatal(err)
		}
	}
	send(&discoverypb.DeltaDiscoveryRequest{Node: &corepb.Node{Id: "slow"}, TypeUrl: lds, ResourceNamesSubscribe: []string{"l"}})
	send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: rds, ResourceNamesSubscribe: []string{"r"}})
	watched(t, c, lds, "l")
	watched(t, c, rds, "r")
	apply := func(typeURL, version string, pad int) {
		c.Apply(typeURL, cache.Change{Upserts: []*cache.Resource{listenerOrRoute(t, typeURL, map[string]string{lds: "l", rds: "r"}[typeURL], version, pad)}})
	}
	// The client reads nothing from here: gRPC takes a first big Listener
	// whole, and the send of a later one blocks behind it (two big ones
	// marked before a flush are one flush: big ones are marked until a
	// send blocks).
	for i := 0; !workerSendSlow(s); i++ {
		if i == 100 {
			t.Fatal("no send blocked on a client that reads nothing")
		}
		apply(lds, fmt.Sprint("big-", i), 256<<10)
		for end := time.Now().Add(100 * time.Millisecond); time.Now().Before(end) && !workerSendSlow(s); {
			time.Sleep(5 * time.Millisecond)
		}
	}
	apply(lds, "3", 0)
	apply(rds, "4", 0)
	apply(lds, "5", 0)

	var got []string
	for len(got) < 2 {
		resp, err := recvWithin(st, wait)
		if err != nil {
			t.Fatalf("after %v: %v", got, err)
		}
		for _, r := range resp.GetResources() {
			if !strings.HasPrefix(r.GetVersion(), "big-") {
				got = append(got, fmt.Sprintf("%s %s", xds.ShortName(resp.GetTypeUrl()), r.GetVersion()))
			}
		}
	}
	want := []string{"Listener 5", "RouteConfiguration 4"}
	if strings.Join(got, ", ") != strings.Join(want, ", ") {
		t.Fatalf("the slow client got %v, want %v: the order docs/architecture.md describes has changed, update it", got, want)
	}
}

// recvWithin receives on st within bound.
func recvWithin(st grpc.BidiStreamingClient[discoverypb.DeltaDiscoveryRequest, discoverypb.DeltaDiscoveryResponse], bound time.Duration) (*discoverypb.DeltaDiscoveryResponse, error) {
	type result struct {
		r   *discoverypb.DeltaDiscoveryResponse
		err error
	}
	ch := make(chan result, 1)
	go func() {
		r, err := st.Recv()
		ch <- result{r, err}
	}()
	select {
	case res := <-ch:
		return res.r, res.err
	case <-time.After(bound):
		return nil, fmt.Errorf("no response within %v", bound)
	}
}
